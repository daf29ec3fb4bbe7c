// --backend=nccl of the train binaries, every strategy, with the ranks as
// threads of one process instead of processes: each rank configures itself
// from the launcher's variables (ConfigureDataParallel: cuda:LOCAL_RANK, the
// rendezvous directory), joins the job through RunDataParallel (FileStore,
// NCCL communicator) and trains through DataParallelModel; the losses and
// gradient norms equal one process on cuda:0 training the global batch.
// Needs 2 CUDA devices (4 for HYBRID_SHARD) and skips with fewer; on the CUDA
// emulation (--config=cuda_emu) the BUILD file asks for 4 emulated devices,
// and NCCL is the emulation's.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "models/common/data_parallel.h"
#include "models/common/data_parallel_testing.h"
#include "tensor/cuda/testing.h"

namespace train {
namespace {

using namespace dp_testing;  // NOLINT: the shared step fixtures

class NcclStrategyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NcclStrategyTest, RanksOnTheirOwnGpusEqualOneProcess) {
  const std::string strategy = GetParam();
  const bool hybrid = IsHybrid(*ParseStrategy(strategy));
  const int world = hybrid ? 4 : 2;
  SKIP_WITHOUT_GPUS(world);
  const Trace reference = SingleProcess(tensor::Device::Cuda(0));
  std::vector<Trace> traces(world);
  std::vector<absl::Status> statuses(world);
  std::string folder;  // the run's own rendezvous folder, removed once it ended well
  std::vector<std::thread> threads;
  // A run id of its own (the pid alone repeats in a sandbox's pid namespace,
  // and a failed run's rendezvous directory outlives the test: a rerun would
  // find the last run's claims under its prefix and fail).
  const std::string run_id = absl::StrCat("nccl-", strategy, "-", ::getpid(), "-",
                                          absl::ToUnixMicros(absl::Now()));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      DataParallelFlags flags;
      flags.backend = "nccl";
      flags.strategy = strategy;
      flags.device = "cuda";
      flags.timeout_s = 120;
      if (hybrid) flags.hybrid_shard_group_size = 2;
      absl::StatusOr<DataParallelConfig> config =
          ConfigureDataParallel(flags, {"Block"}, FakeEnv(LaunchVars(r, world, run_id)));
      if (!config.ok()) {
        statuses[r] = config.status();
        return;
      }
      EXPECT_EQ(config->device, tensor::Device::Cuda(r));
      if (r == 0) {
        EXPECT_TRUE(config->rendezvous.owned);
        folder = config->rendezvous.store;
      }
      statuses[r] = RunDataParallel(*config, [&](RankContext& rank) -> absl::Status {
        absl::StatusOr<Trace> trace = TrainSteps(*config, rank.pg, config->device);
        if (!trace.ok()) return trace.status();
        traces[r] = *std::move(trace);
        return absl::OkStatus();
      });
    });
  }
  for (std::thread& t : threads) t.join();
  // GPU reductions sum in other orders than one process on the GPU does.
  constexpr double kTol = 1e-4;
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    if (r == world - 1) {
      EXPECT_FALSE(folder.empty());
      EXPECT_FALSE(std::filesystem::exists(folder)) << folder << " stays";
    }
    ASSERT_EQ(traces[r].losses.size(), static_cast<size_t>(kSteps));
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " step ", step));
      EXPECT_NEAR(traces[r].losses[step], reference.losses[step], kTol);
      EXPECT_NEAR(traces[r].norms[step], reference.norms[step], kTol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, NcclStrategyTest,
                         ::testing::Values("ddp", "zero1", "shard_grad_op", "full_shard",
                                           "no_shard", "hybrid_shard", "hybrid_shard_zero2"));

}  // namespace
}  // namespace train
