// FSDP over the nccl engine (issue 5): ranks as threads of one process, each
// with its own GPU and NCCL communicator (one rank per device, as NCCL
// requires), train a tiny minGPT like one process on cuda:0: FULL_SHARD,
// SHARD_GRAD_OP and NO_SHARD at world 2, HYBRID_SHARD at world 4 (shard
// groups of 2 split from the world communicator), bf16 mixed precision; a
// rank failing mid-backward fails its peer at once. The
// multi-GPU path of the train binaries (--backend=nccl), in one process.
// Needs 2 (4) CUDA devices and skips with fewer; on the CUDA emulation
// (--config=cuda_emu, CUDA_EMU_DEVICES=4 from the BUILD file) the
// communicators are the emulated NCCL's (third_party/cuda/emu/nccl.cc).
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/nccl_group.h"
#include "dist/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "nn/module.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/testing.h"

namespace dist {
namespace {

using tensor::Device;
using tensor::Tensor;
using namespace dist::testing;  // NOLINT: the shared fixtures

// As fsdp_cuda_test: GPU reductions sum in other orders than one process.
constexpr double kGpuTol = 1e-4;

// TrainRank on `world` ranks, rank r a thread with an nccl group on cuda:r
// and its model there; rank 0's result.
RunResult OverNccl(const mingpt::GptConfig& c, const Tensor& idx, const Tensor& tgt, int world,
                   FsdpOptions options, const std::string& prefix) {
  HashStore store;
  std::vector<RunResult> results(world);
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      NcclGroupOptions group_options;
      group_options.prefix = prefix;
      group_options.timeout = absl::Seconds(120);
      auto pg = CreateNcclProcessGroup(rank, world, rank, store, group_options);
      if (!pg.ok()) {
        statuses[rank] = pg.status();
        return;
      }
      FsdpOptions mine = options;
      mine.device = Device::Cuda(rank);
      results[rank] = TrainRank(c, idx, tgt, **pg, mine);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
    // Every rank saw the same (all-reduced) losses and norms.
    EXPECT_EQ(results[rank].losses, results[0].losses) << "rank " << rank;
    EXPECT_EQ(results[rank].norms, results[0].norms) << "rank " << rank;
  }
  return results[0];
}

FsdpOptions Options(ShardingStrategy strategy) { return PerBlock(strategy); }

class FsdpNcclParityTest : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(FsdpNcclParityTest, TwoGpusMatchOneProcessOnOne) {
  SKIP_WITHOUT_GPUS(2);
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 1);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 2);
  const RunResult want = SingleProcess(c, idx, tgt, precision::MixedPrecisionPolicy::Fp32(), 1, 1,
                                       Device::Cuda(0));
  const RunResult got = OverNccl(c, idx, tgt, 2, Options(GetParam()),
                                 absl::StrCat("parity", static_cast<int>(GetParam())));
  ExpectSameTraining(got, want, kGpuTol);
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpNcclParityTest,
                         ::testing::Values(ShardingStrategy::kFullShard,
                                           ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard));

TEST(FsdpNcclTest, HybridShardOnFourGpusMatchesOneProcess) {
  SKIP_WITHOUT_GPUS(4);
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 4);
  const RunResult want = SingleProcess(c, idx, tgt, precision::MixedPrecisionPolicy::Fp32(), 1, 1,
                                       Device::Cuda(0));
  FsdpOptions o = Options(ShardingStrategy::kHybridShard);
  o.hybrid_shard_group_size = 2;
  ExpectSameTraining(OverNccl(c, idx, tgt, 4, o, "hybrid"), want, kGpuTol);
}

TEST(FsdpNcclTest, Bf16FullShardMatchesOneProcessBf16) {
  SKIP_WITHOUT_GPUS(2);
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 5);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 6);
  const precision::MixedPrecisionPolicy bf16 = precision::MixedPrecisionPolicy::Bf16();
  const RunResult want = SingleProcess(c, idx, tgt, bf16, 1, 1, Device::Cuda(0));
  FsdpOptions o = Options(ShardingStrategy::kFullShard);
  o.mixed_precision = bf16;
  ExpectCloseTraining(OverNccl(c, idx, tgt, 2, o, "bf16"), want);
}

// Rank 1's backward throws after the second Linear's reduce-scatter (an
// error of its own, mid-backward), and the rank stops, its groups destroyed.
// Rank 0's backward goes on to the first Linear's reduce-scatter, which rank
// 1 will never make: it fails within seconds naming rank 1, not after the
// group's 120 s timeout (the threads engine's "peer left", on NCCL).
TEST(FsdpNcclTest, APeerThatFailsMidBackwardFailsTheOtherRanksAtOnce) {
  SKIP_WITHOUT_GPUS(2);
  constexpr int64_t kD = 8, kRows = 4;
  HashStore store;
  std::vector<std::string> errors(2);
  absl::Duration rank0_wait;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      NcclGroupOptions group_options;
      group_options.prefix = "midbackward";
      group_options.timeout = absl::Seconds(120);
      auto pg = CreateNcclProcessGroup(rank, 2, rank, store, group_options);
      if (!pg.ok()) {
        errors[rank] = pg.status().ToString();
        return;
      }
      const Device device = Device::Cuda(rank);
      MaybeSkips m(kD);
      FsdpOptions options;
      options.device = device;
      options.policy = WrapPolicy::Transformer({"Linear"});
      auto fsdp = FullyShard(m, **pg, options);
      m.stop_in_backward = rank == 1;
      const absl::Time start = absl::Now();
      try {
        nn::Context ctx;
        m.Run(tensor::testing::RandomTensor({kRows, kD}, 3 + rank).To(device), ctx);
        m.RunBackward(tensor::testing::RandomTensor({kRows, kD}, 9).To(device), ctx);
      } catch (const tensor::OpError& e) {
        errors[rank] = e.what();
      }
      if (rank == 0) rank0_wait = absl::Now() - start;
    });  // the rank's FSDP model and groups are destroyed here
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(errors[1], ::testing::HasSubstr("backward stopped after 'second'"));
  EXPECT_THAT(errors[0], ::testing::HasSubstr("rank 1 will never make this call"));
  EXPECT_THAT(errors[0], ::testing::HasSubstr("its group was destroyed after issuing"));
  EXPECT_LT(rank0_wait, absl::Seconds(60));
}

}  // namespace
}  // namespace dist
