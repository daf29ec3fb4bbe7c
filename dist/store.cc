// dist::Store helpers, HashStore, PrefixStore and StoreBarrier.
#include "dist/store.h"

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dist {

absl::Duration DefaultStoreTimeout() { return absl::Seconds(300); }

namespace internal {

std::string FormatSeconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "inf s";
  const double s = absl::ToDoubleSeconds(d);
  const double tenths = s * 10.0;
  if (s >= 1.0 || tenths == static_cast<double>(static_cast<int64_t>(tenths))) {
    return absl::StrFormat("%.1f s", s);
  }
  return absl::StrFormat("%.3g s", s);
}

absl::Status MissingKeysError(absl::string_view store, absl::string_view op, absl::Duration timeout,
                              absl::Span<const std::string> missing) {
  return absl::DeadlineExceededError(
      absl::StrCat("[", store, "] ", op, " timed out after ", FormatSeconds(timeout),
                   "; missing keys: ", absl::StrJoin(missing, ", ")));
}

absl::Status CheckKey(absl::string_view store, absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat("[", store, "] empty key"));
  return absl::OkStatus();
}

}  // namespace internal

namespace {

// The deadline `timeout` from now; far timeouts (and InfiniteDuration) never pass.
std::chrono::steady_clock::time_point DeadlineAfter(absl::Duration timeout) {
  if (timeout >= absl::Hours(24 * 365 * 100)) return std::chrono::steady_clock::time_point::max();
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
}

}  // namespace

// ---- HashStore ----

absl::Status HashStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = internal::CheckKey("hash_store", key); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[std::string(key)] = std::string(value);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> HashStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = internal::CheckKey("hash_store", key); !s.ok()) return s;
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string& text = values_[std::string(key)];
    if (!text.empty() && !absl::SimpleAtoi(text, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("[hash_store] add: key ", key, " holds \"",
                                                     text, "\", which is not an integer"));
    }
    value += delta;
    text = absl::StrCat(value);
  }
  cv_.notify_all();
  return value;
}

absl::StatusOr<bool> HashStore::Check(absl::Span<const std::string> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& key : keys) {
    if (values_.find(key) == values_.end()) return false;
  }
  return true;
}

absl::StatusOr<bool> HashStore::DeleteKey(absl::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  values_.erase(it);
  return true;
}

absl::StatusOr<std::string> HashStore::DoGet(absl::string_view key, absl::Duration timeout) {
  const std::string keys[] = {std::string(key)};
  if (absl::Status s = DoWait(keys, timeout); !s.ok()) {
    if (absl::IsDeadlineExceeded(s)) {
      return internal::MissingKeysError("hash_store", "get", timeout, keys);
    }
    return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) {  // Deleted between the wait and now.
    return absl::NotFoundError(absl::StrCat("[hash_store] get: key ", key, " was deleted"));
  }
  return it->second;
}

absl::Status HashStore::DoWait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& key : keys) {
    if (absl::Status s = internal::CheckKey("hash_store", key); !s.ok()) return s;
  }
  const auto deadline = DeadlineAfter(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = [&] {
    std::vector<std::string> out;
    for (const std::string& key : keys) {
      if (values_.find(key) == values_.end()) out.push_back(key);
    }
    return out;
  };
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    cv_.wait(lock, [&] { return missing().empty(); });
    return absl::OkStatus();
  }
  if (cv_.wait_until(lock, deadline, [&] { return missing().empty(); })) return absl::OkStatus();
  return internal::MissingKeysError("hash_store", "wait", timeout, missing());
}

// ---- PrefixStore ----

PrefixStore::PrefixStore(std::string prefix, Store* base)
    : Store(base->timeout()), prefix_(std::move(prefix)), base_(base) {}

std::string PrefixStore::Full(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

std::vector<std::string> PrefixStore::Full(absl::Span<const std::string> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(Full(key));
  return out;
}

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = internal::CheckKey("prefix_store", key); !s.ok()) return s;
  return base_->Set(Full(key), value);
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = internal::CheckKey("prefix_store", key); !s.ok()) return s;
  return base_->Add(Full(key), delta);
}

absl::StatusOr<bool> PrefixStore::Check(absl::Span<const std::string> keys) {
  return base_->Check(Full(keys));
}

absl::StatusOr<bool> PrefixStore::DeleteKey(absl::string_view key) {
  return base_->DeleteKey(Full(key));
}

absl::StatusOr<std::string> PrefixStore::DoGet(absl::string_view key, absl::Duration timeout) {
  if (absl::Status s = internal::CheckKey("prefix_store", key); !s.ok()) return s;
  return base_->Get(Full(key), timeout);
}

absl::Status PrefixStore::DoWait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& key : keys) {
    if (absl::Status s = internal::CheckKey("prefix_store", key); !s.ok()) return s;
  }
  return base_->Wait(Full(keys), timeout);
}

// ---- StoreBarrier ----

absl::Status StoreBarrier(Store& store, absl::string_view name, int world_size,
                          absl::Duration timeout) {
  const std::string count_key = absl::StrCat(name, "/count");
  const std::string done_key = absl::StrCat(name, "/done");
  absl::StatusOr<int64_t> arrived = store.Add(count_key, 1);
  if (!arrived.ok()) return arrived.status();
  if (*arrived == world_size) {
    if (absl::Status s = store.Set(done_key, "1"); !s.ok()) return s;
  }
  const std::string keys[] = {done_key};
  absl::Status waited = store.Wait(keys, timeout);
  if (absl::IsDeadlineExceeded(waited)) {
    absl::StatusOr<int64_t> now = store.Add(count_key, 0);
    return absl::DeadlineExceededError(absl::StrCat(
        "[store_barrier] ", name, ": timed out after ", internal::FormatSeconds(timeout), " with ",
        now.ok() ? absl::StrCat(*now) : std::string("?"), " of ", world_size, " arrived"));
  }
  return waited;
}

}  // namespace dist
