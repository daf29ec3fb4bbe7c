// CheckpointDirLock: a second lock of a held folder fails naming the holder,
// and the folder is free again once the first lock is gone.
#include "models/common/checkpoint_dir_lock.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace train {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "_", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

TEST(CheckpointDirLockTest, OneRunAtATimeNamingTheHolder) {
  const std::string dir = FreshDir("locked");
  std::optional<CheckpointDirLock> first;
  {
    absl::StatusOr<CheckpointDirLock> lock = CheckpointDirLock::Acquire(dir);
    ASSERT_TRUE(lock.ok()) << lock.status();
    first.emplace(*std::move(lock));
  }
  std::stringstream holder;
  holder << std::ifstream(dir + "/.lock").rdbuf();
  EXPECT_THAT(holder.str(), HasSubstr(absl::StrCat("pid ", ::getpid(), " on host ")));

  // flock locks belong to an open file: a second open in this process is
  // refused as another run's would be.
  const absl::StatusOr<CheckpointDirLock> second = CheckpointDirLock::Acquire(dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("--checkpoint_dir: ", dir, " is in use by another run (pid ",
                                     ::getpid(), " on host ")));
  EXPECT_THAT(second.status().message(), HasSubstr("give each run its own --checkpoint_dir"));

  first.reset();  // the run ends (or dies): the folder is free
  EXPECT_TRUE(CheckpointDirLock::Acquire(dir).ok());
}

TEST(CheckpointDirLockTest, AMissingFolderIsUnavailableNamingTheLockFile) {
  const std::string dir = FreshDir("parent") + "/missing";
  const absl::StatusOr<CheckpointDirLock> lock = CheckpointDirLock::Acquire(dir);
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lock.status().message(),
              HasSubstr(absl::StrCat("cannot create the lock file ", dir, "/.lock")));
}

}  // namespace
}  // namespace train
