// TellPeersOfFailure: a launched rank's failure before joining reaches the
// ranks waiting for it through the engine's store (a gloo rank 0, through a
// folder or, when redis-server is installed, Redis, and an nccl rank 1 that
// wait with a 60 s timeout fail at once naming it); nothing is written for
// the default folder, the threads engine or a world of one, and a store that
// cannot be reached is said as a note.
#include "models/common/failure_notice.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "dist/file_store.h"
#include "dist/gloo_group.h"
#include "dist/nccl_rendezvous.h"
#include "dist/redis_testing.h"
#include "gtest/gtest.h"
#include "models/common/test_files.h"

namespace train {
namespace {

namespace fs = std::filesystem;

// A launcher's environment for `rank` of `world`, `local` ranks a node.
GetEnvFn Env(int rank, int world, int local = 1) {
  auto vars = std::make_shared<std::map<std::string, std::string>>(
      std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                         {"WORLD_SIZE", std::to_string(world)},
                                         {"LOCAL_WORLD_SIZE", std::to_string(local)},
                                         {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", "29500"},
                                         {"RUN_ID", "job7"}});
  return [vars](const char* name) -> const char* {
    auto it = vars->find(name);
    return it == vars->end() ? nullptr : it->second.c_str();
  };
}

DataParallelFlags Flags(const std::string& backend, const std::string& rdzv) {
  DataParallelFlags flags;
  flags.backend = backend;
  flags.rdzv = rdzv;
  return flags;
}

const absl::Status kFailure = absl::InvalidArgumentError("--data=/nfs/x.bin: no such file");

// Rank 1 of 2 fails before joining, told through --rdzv=`rdzv` (a folder, or
// redis://host:port); rank 0, waiting in gloo's rendezvous there with a 60 s
// timeout, fails at once naming it and why.
void ExpectGlooRankZeroFailsAtOnce(const std::string& rdzv) {
  TellPeersOfFailure(Flags("gloo", rdzv), Env(1, 2), kFailure);
  dist::GlooGroupOptions options;
  options.store = rdzv;
  options.prefix = "job7/restart0";
  options.timeout = absl::Seconds(60);
  const absl::Time start = absl::Now();
  auto pg = dist::CreateGlooProcessGroup(0, 2, options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_FALSE(pg.ok());
  EXPECT_TRUE(absl::IsAborted(pg.status())) << pg.status();
  EXPECT_TRUE(absl::StrContains(pg.status().message(), "rank 0 of 2: rank 1 (host "))
      << pg.status();
  EXPECT_TRUE(absl::StrContains(pg.status().message(),
                                ") failed before joining: --data=/nfs/x.bin: no such file"))
      << pg.status();
}

TEST(FailureNoticeTest, AGlooRankWaitingForTheFailedOneFailsAtOnce) {
  const std::string rdzv = testing::FreshTempDir("gloo_rdzv");
  ExpectGlooRankZeroFailsAtOnce(rdzv);
}

TEST(FailureNoticeTest, AnNcclRankWaitingForTheFailedRankZeroFailsAtOnce) {
  const std::string rdzv = testing::FreshTempDir("nccl_rdzv");
  TellPeersOfFailure(Flags("nccl", "file://" + rdzv), Env(0, 2), kFailure);
  absl::StatusOr<std::unique_ptr<dist::FileStore>> store = dist::FileStore::Open(rdzv);
  ASSERT_TRUE(store.ok()) << store.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> id = dist::nccl::ExchangeUniqueId(
      **store, "job7/restart0", 1, 2, 128,
      []() -> absl::StatusOr<std::string> { return std::string(128, 'x'); }, absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(absl::IsAborted(id.status())) << id.status();
  EXPECT_TRUE(absl::StrContains(id.status().message(),
                                ") failed before joining: --data=/nfs/x.bin: no such file"))
      << id.status();
}

// A gloo run meeting through Redis: the failure is said there, and a peer
// waiting with a 60 s timeout fails at once naming it.
TEST(FailureNoticeTest, AGlooRankWaitingThroughRedisFailsAtOnce) {
  absl::StatusOr<std::unique_ptr<dist::testing::RedisServer>> redis =
      dist::testing::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  if (*redis == nullptr) GTEST_SKIP() << "redis-server is not installed: skipping the Redis case";
  ExpectGlooRankZeroFailsAtOnce((*redis)->store());
}

// The default folder (one node: its launcher stops the others), the threads
// engine, a world of one and a success write nothing.
TEST(FailureNoticeTest, NothingIsSaidWhereNoRankWaitsInASharedStore) {
  const std::string tmp = testing::FreshTempDir("default_rdzv");
  const char* was = std::getenv("TMPDIR");
  const std::string before = was == nullptr ? "" : was;
  setenv("TMPDIR", tmp.c_str(), 1);
  TellPeersOfFailure(Flags("gloo", ""), Env(1, 2, 2), kFailure);
  TellPeersOfFailure(Flags("nccl", ""), Env(1, 2, 2), kFailure);
  if (was == nullptr) {
    unsetenv("TMPDIR");
  } else {
    setenv("TMPDIR", before.c_str(), 1);
  }
  EXPECT_TRUE(fs::is_empty(tmp));
  const std::string rdzv = testing::FreshTempDir("unused_rdzv");
  TellPeersOfFailure(Flags("threads", rdzv), Env(1, 2), kFailure);
  TellPeersOfFailure(Flags("gloo", rdzv), Env(0, 1), kFailure);
  TellPeersOfFailure(Flags("nccl", rdzv), Env(1, 2), absl::OkStatus());
  EXPECT_TRUE(fs::is_empty(rdzv));
}

TEST(FailureNoticeTest, AStoreThatCannotBeReachedIsANote) {
  const std::string file = testing::FreshTempDir("not_a_folder") + "/file";
  testing::WriteFile(file, "x");
  ::testing::internal::CaptureStderr();
  TellPeersOfFailure(Flags("gloo", file), Env(1, 2), kFailure);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(err, "train: note: could not tell the other ranks of this "
                                     "failure: [gloo] rank 1 of 2: the rendezvous store '"))
      << err;
}

}  // namespace
}  // namespace train
