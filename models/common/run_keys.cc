// Removing a run's rendezvous keys once it ended well (run_keys.h).
#include "models/common/run_keys.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/match.h"
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

void RemoveNcclRunFolder(const std::string& folder, const std::string& prefix, bool owned,
                         int rank, int world_size, absl::Duration wait) {
  if (!owned) return;
  absl::StatusOr<std::unique_ptr<dist::FileStore>> store = dist::FileStore::Open(folder, wait);
  if (!store.ok()) return;
  const std::string finished = absl::StrCat(prefix, "/finished");
  if (!(*store)->Add(finished, 1).ok() || rank != 0) return;
  for (const absl::Time deadline = absl::Now() + wait;;) {
    absl::StatusOr<int64_t> count = (*store)->Add(finished, 0);
    if (!count.ok()) return;
    if (*count >= world_size) break;
    if (absl::Now() >= deadline) {
      std::fprintf(stderr,
                   "train: note: the run's rendezvous folder %s stays: %lld of %d ranks said "
                   "they finished within %s\n",
                   folder.c_str(), static_cast<long long>(*count), world_size,
                   absl::FormatDuration(wait).c_str());
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  store->reset();
  std::error_code ignored;
  std::filesystem::remove_all(folder, ignored);
}

}  // namespace train
