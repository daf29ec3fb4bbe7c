// dist::Store: the key-value store the ranks of a job share to rendezvous
// (exchange addresses, pass the NCCL unique id, count arrivals), as in
// torch.distributed / gloo. Engines for processes and hosts (gloo, nccl)
// create their communicators through one; the threads engine needs none.
//
// Implementations here: HashStore (in-process, for ranks as threads and for
// tests), PrefixStore (a namespace inside another store); FileStore
// (dist/file_store.h) over a directory on a shared filesystem.
//
// Every blocking call has a timeout and fails with DeadlineExceeded naming
// the keys still missing: "[hash_store] wait timed out after 0.5 s; missing
// keys: rank/2, rank/3".
#ifndef DIST_STORE_H_
#define DIST_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dist {

// The timeout of a store when none is given: 300 s.
absl::Duration DefaultStoreTimeout();

class Store {
 public:
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets key to value (overwriting). Keys are non-empty.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value of key, waiting up to `timeout` (default: timeout()) for it.
  absl::StatusOr<std::string> Get(absl::string_view key) { return DoGet(key, timeout_); }
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) {
    return DoGet(key, timeout);
  }
  // Atomically adds delta to the integer at key (0 when unset) and returns the
  // new value. The value is stored as decimal text (Get returns "3").
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
  // Waits until every key is set; DeadlineExceeded naming the missing ones.
  absl::Status Wait(absl::Span<const std::string> keys) { return DoWait(keys, timeout_); }
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
    return DoWait(keys, timeout);
  }
  // Whether every key is set now (no waiting).
  virtual absl::StatusOr<bool> Check(absl::Span<const std::string> keys) = 0;
  // Removes key; returns whether it was set.
  virtual absl::StatusOr<bool> DeleteKey(absl::string_view key) = 0;

  absl::Duration timeout() const { return timeout_; }
  void set_timeout(absl::Duration timeout) { timeout_ = timeout; }

 protected:
  explicit Store(absl::Duration timeout) : timeout_(timeout) {}
  virtual absl::StatusOr<std::string> DoGet(absl::string_view key, absl::Duration timeout) = 0;
  virtual absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) = 0;

 private:
  absl::Duration timeout_;
};

// All in memory, for threads of one process.
class HashStore final : public Store {
 public:
  explicit HashStore(absl::Duration timeout = DefaultStoreTimeout()) : Store(timeout) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;

 protected:
  absl::StatusOr<std::string> DoGet(absl::string_view key, absl::Duration timeout) override;
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string, std::less<>> values_;  // guarded by mu_
};

// Keys of `base` under "<prefix>/": lets groups or jobs share one store.
// `base` must outlive it. The timeout is this store's own.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store* base);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;

 protected:
  absl::StatusOr<std::string> DoGet(absl::string_view key, absl::Duration timeout) override;
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override;

 private:
  std::string Full(absl::string_view key) const;
  std::vector<std::string> Full(absl::Span<const std::string> keys) const;
  const std::string prefix_;
  Store* const base_;
};

// Blocks until `world_size` callers have called it with the same `name`
// (each once), or fails after `timeout` naming how many arrived. One use per
// name; uses keys "<name>/count" and "<name>/done".
absl::Status StoreBarrier(Store& store, absl::string_view name, int world_size,
                          absl::Duration timeout);

namespace internal {
// "[<store>] <op> timed out after 0.5 s; missing keys: a, b".
absl::Status MissingKeysError(absl::string_view store, absl::string_view op, absl::Duration timeout,
                              absl::Span<const std::string> missing);
// "2.0 s", "0.5 s", "0.25 s".
std::string FormatSeconds(absl::Duration d);
absl::Status CheckKey(absl::string_view store, absl::string_view key);
}  // namespace internal

}  // namespace dist

#endif  // DIST_STORE_H_
