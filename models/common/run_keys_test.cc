// What a run leaves of its rendezvous: a gloo run's own folder goes after
// the final barrier; an nccl run's once every rank said it finished, and
// stays when a rank failed (rank 0 stops waiting at once) or never said so
// (after the wait); a shared folder loses that run's keys only.
#include "models/common/run_keys.h"

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dist/file_store.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/common/test_files.h"

namespace train {
namespace {

namespace fs = std::filesystem;

// Rank r's FinishNcclRunFolder on a thread of its own, for each r in `ranks`
// (ok unless r == `failing`); how long rank 0 took.
absl::Duration FinishRanks(const std::string& folder, bool owned, const std::vector<int>& ranks,
                           int world_size, absl::Duration wait, int failing = -1) {
  absl::Duration rank0 = absl::ZeroDuration();
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      FinishNcclRunFolder(folder, "run/restart0", owned, r, world_size, wait, r != failing);
      if (r == 0) rank0 = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return rank0;
}

TEST(RunKeysTest, AnNcclRunsFolderGoesOnceEveryRankFinished) {
  const std::string folder = testing::FreshTempDir("nccl_done");
  testing::WriteFile(folder + "/key", "a run's key");
  FinishRanks(folder, /*owned=*/true, {0, 1, 2}, 3, absl::Seconds(30));
  EXPECT_FALSE(fs::exists(folder));
}

TEST(RunKeysTest, AnNcclRunsFolderStaysWhenARankFailedOrNeverSaid) {
  // Rank 1 failed: rank 0 stops waiting at once.
  std::string folder = testing::FreshTempDir("nccl_failed");
  const absl::Duration took =
      FinishRanks(folder, /*owned=*/true, {0, 1, 2}, 3, absl::Seconds(30), /*failing=*/1);
  EXPECT_TRUE(fs::exists(folder));
  EXPECT_LT(took, absl::Seconds(10));
  // Rank 2 never says: rank 0 gives up after the wait.
  folder = testing::FreshTempDir("nccl_silent");
  EXPECT_GE(FinishRanks(folder, /*owned=*/true, {0, 1}, 3, absl::Milliseconds(300)),
            absl::Milliseconds(300));
  EXPECT_TRUE(fs::exists(folder));
  // A failed rank 0 keeps it, whatever the others say.
  folder = testing::FreshTempDir("nccl_rank0_failed");
  FinishRanks(folder, /*owned=*/true, {0, 1}, 2, absl::Seconds(30), /*failing=*/0);
  EXPECT_TRUE(fs::exists(folder));
}

// A shared --rdzv folder loses the run's keys only (its prefix
// "run/restart0"), once every rank finished.
TEST(RunKeysTest, ASharedFolderLosesTheRunsKeysOnly) {
  const std::string folder = testing::FreshTempDir("shared");
  absl::StatusOr<std::unique_ptr<dist::FileStore>> store = dist::FileStore::Open(folder);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("run/restart0/unique_id", "id").ok());
  ASSERT_TRUE((*store)->Set("run/restart0/split0/color1/world/0", "1").ok());
  ASSERT_TRUE((*store)->Set("run/restart1/unique_id", "another attempt's").ok());
  ASSERT_TRUE((*store)->Set("other/unique_id", "another run's").ok());
  FinishRanks(folder, /*owned=*/false, {0, 1}, 2, absl::Seconds(30));
  EXPECT_TRUE(fs::exists(folder));
  EXPECT_FALSE(*(*store)->Check({"run/restart0/unique_id"}));
  EXPECT_FALSE(*(*store)->Check({"run/restart0/split0/color1/world/0"}));
  EXPECT_FALSE(*(*store)->Check({"run/restart0/finished"}));
  EXPECT_TRUE(*(*store)->Check({"run/restart1/unique_id", "other/unique_id"}));
  // A rank that failed keeps them, and so does one that never says.
  ASSERT_TRUE((*store)->Set("run/restart0/unique_id", "id").ok());
  FinishRanks(folder, /*owned=*/false, {0, 1}, 2, absl::Seconds(30), /*failing=*/1);
  EXPECT_TRUE(*(*store)->Check({"run/restart0/unique_id", "run/restart0/failed"}));
  ASSERT_TRUE((*store)->DeleteKey("run/restart0/failed").ok());
  ASSERT_TRUE((*store)->DeleteKey("run/restart0/finished").ok());
  FinishRanks(folder, /*owned=*/false, {0}, 2, absl::Milliseconds(200));
  EXPECT_TRUE(*(*store)->Check({"run/restart0/unique_id", "run/restart0/finished"}));
}

TEST(RunKeysTest, AGlooRunsOwnFolderGoesAfterTheBarrier) {
  const std::string folder = testing::FreshTempDir("gloo_owned");
  testing::WriteFile(folder + "/key", "a run's key");
  absl::Status s = dist::RunRanks(2, [&](int, dist::ProcessGroup& pg) {
    RemoveGlooRunKeys(folder, "run/restart0", /*owned=*/true, pg);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(fs::exists(folder));
}

}  // namespace
}  // namespace train
