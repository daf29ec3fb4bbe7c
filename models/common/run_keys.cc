// Removing a run's rendezvous keys once it ended well (run_keys.h).
#include "models/common/run_keys.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "dist/file_store.h"
#include "dist/gloo_group.h"
#include "dist/redis_keys.h"

namespace train {

void RemoveGlooRunKeys(const std::string& store, const std::string& prefix, bool owned,
                       dist::ProcessGroup& pg) {
  const bool redis = absl::StartsWith(store, "redis://");
  if (!pg.BarrierSync().ok()) return;
  if (!owned && !redis) {
    absl::StatusOr<int> removed = dist::RemoveOwnFolderStoreKeys(pg);
    if (!removed.ok()) {
      std::fprintf(stderr, "train: note: some of the run's rendezvous keys stay: %s\n",
                   std::string(removed.status().message()).c_str());
    }
    return;
  }
  if (pg.rank() != 0) return;
  if (owned) {
    std::error_code ignored;
    std::filesystem::remove_all(store, ignored);
    return;
  }
  absl::StatusOr<int64_t> removed = dist::RemoveRedisKeys(store, prefix);
  if (!removed.ok()) {
    std::fprintf(stderr, "train: note: the run's rendezvous keys stay: %s\n",
                 std::string(removed.status().message()).c_str());
  }
}

void FinishNcclRunFolder(const std::string& folder, const std::string& prefix, bool owned,
                         int rank, int world_size, absl::Duration wait, bool ok) {
  auto stays = [&](const std::string& why) {
    if (owned) {
      std::fprintf(stderr, "train: note: the run's rendezvous folder %s stays: %s\n",
                   folder.c_str(), why.c_str());
    } else {
      std::fprintf(stderr, "train: note: the run's rendezvous keys under \"%s\" in %s stay: %s\n",
                   prefix.c_str(), folder.c_str(), why.c_str());
    }
  };
  absl::StatusOr<std::unique_ptr<dist::FileStore>> store = dist::FileStore::Open(folder, wait);
  if (!store.ok()) return stays(std::string(store.status().message()));
  const std::string finished = absl::StrCat(prefix, "/finished");
  const std::string failed = absl::StrCat(prefix, "/failed");
  if (absl::Status s = (*store)->Add(ok ? finished : failed, 1).status(); !s.ok()) {
    return stays(std::string(s.message()));
  }
  if (rank != 0 || !ok) return;  // a failed rank 0 keeps it (its error says why)
  // Read, not Add(key, 0), which would rewrite the file each time.
  auto count_of = [&](const std::string& key) -> int64_t {
    absl::StatusOr<std::string> value = (*store)->Get(key, absl::ZeroDuration());
    int64_t n = 0;
    return value.ok() && absl::SimpleAtoi(*value, &n) ? n : 0;
  };
  for (const absl::Time deadline = absl::Now() + wait;;) {
    if (const int64_t n = count_of(failed); n > 0) {
      return stays(absl::StrCat(n, n == 1 ? " rank" : " ranks", " failed"));
    }
    const int64_t done = count_of(finished);
    if (done >= world_size) break;
    if (absl::Now() >= deadline) {
      return stays(absl::StrCat(done, " of ", world_size, " ranks said they finished within ",
                                absl::FormatDuration(wait)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!owned) {  // a shared folder: the run's keys only (other runs may use it)
    absl::StatusOr<int> deleted = (*store)->DeleteKeysUnder(prefix);
    if (!deleted.ok()) stays(std::string(deleted.status().message()));
    return;
  }
  store->reset();
  std::error_code ignored;
  std::filesystem::remove_all(folder, ignored);
}

}  // namespace train
