// train::PrintSample over the threads engine (2 ranks): under FSDP a draw
// that runs out of memory with the whole model gathered fails naming
// --sample_gather=unit, which holds less; gathered unit by unit, or failing
// otherwise, the error is the draw's own. Under every strategy a draw that
// fails in the middle of a forward leaves the model to train on as if no
// sample had been drawn.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "models/common/data_parallel.h"
#include "models/common/data_parallel_testing.h"
#include "models/mingpt/model.h"
#include "precision/policy.h"
#include "tensor/allocator.h"
#include "tensor/memory_ledger.h"
#include "tensor/tensor.h"

namespace train {
namespace {

using namespace dp_testing;  // NOLINT: the shared step fixtures

// What PrintSample returns over a 2-rank FULL_SHARD run whose draw throws
// (out of memory, or another failure) with `gather`.
absl::Status FailedSample(DataParallelModel::Gather gather, bool out_of_memory) {
  absl::StatusOr<DataParallelConfig> config =
      ConfigureDataParallel(Flags("threads", "full_shard", 2), {"Block"}, FakeEnv({}));
  EXPECT_TRUE(config.ok()) << config.status();
  SampleSchedule schedule;
  schedule.every = 1;
  schedule.gather = gather;
  return RunDataParallel(*config, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
        DataParallelModel::Create(model, rank.pg, *config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    return PrintSample(**dp, schedule, /*print=*/false, [&]() -> absl::StatusOr<std::string> {
      if (out_of_memory) {
        throw tensor::OutOfMemoryError("[memory] out of memory on cpu: 9.00 GiB asked for");
      }
      throw std::runtime_error("the prompt has no tokens");
    });
  });
}

TEST(PrintSampleTest, OutOfMemoryWithTheWholeModelGatheredNamesTheGatherFlag) {
  using Gather = DataParallelModel::Gather;
  absl::Status s = FailedSample(Gather::kWholeModel, /*out_of_memory=*/true);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(absl::StrContains(
      s.message(), "[sample] with the whole model gathered on every rank "
                   "(--sample_gather=model): [memory] out of memory on cpu: 9.00 GiB asked for; "
                   "--sample_gather=unit holds the root and one unit at a time"))
      << s;
  s = FailedSample(Gather::kPerUnit, /*out_of_memory=*/true);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "out of memory on cpu: 9.00 GiB asked for")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "--sample_gather")) << s;
  s = FailedSample(Gather::kWholeModel, /*out_of_memory=*/false);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "the prompt has no tokens")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "--sample_gather")) << s;
}

// Rank 0's losses over three steps of `strategy` in bf16 mixed precision;
// with `failed_samples`, between the first two steps a sample fails in its
// first forward (an id out of the vocabulary) with each gather. After each,
// the model is in training mode and holds the parameter bytes of a step
// (FSDP's units resharded, DDP's and ZeRO-1's compute copies dropped).
std::vector<double> LossesAround(const std::string& strategy, bool failed_samples) {
  absl::StatusOr<DataParallelConfig> config =
      ConfigureDataParallel(Flags("threads", strategy, 2), {"Block"}, FakeEnv({}));
  EXPECT_TRUE(config.ok()) << config.status();
  config->mixed_precision = precision::MixedPrecisionPolicy::Bf16();
  std::vector<double> losses;
  absl::Status s = RunDataParallel(*config, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
        DataParallelModel::Create(model, rank.pg, *config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    const tensor::Tensor idx = Rows(RandomTokens(8), rank.rank, rank.world_size);  // (B, T)
    const std::vector<int64_t> ids = {0, 1, Tiny().vocab_size};
    const tensor::Tensor bad = tensor::Tensor::FromData<int64_t>(ids, {1, 3});  // (1, 3)
    auto params = [&] {
      return rank.ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters).current;
    };
    for (int step = 0; step < 3; ++step) {
      const double loss = model.ForwardBackward(idx, idx);
      if (rank.rank == 0) losses.push_back(loss);
      if (absl::Status st = (*dp)->Step(); !st.ok()) return st;
      (*dp)->ZeroGrad();
      if (step != 0 || !failed_samples) continue;
      const int64_t after_step = params();
      for (auto gather : {DataParallelModel::Gather::kWholeModel,
                          DataParallelModel::Gather::kPerUnit}) {
        SampleSchedule schedule;
        schedule.every = 1;
        schedule.gather = gather;
        const absl::Status failed =
            PrintSample(**dp, schedule, /*print=*/false, [&]() -> absl::StatusOr<std::string> {
              model.LastLogits(bad);
              return std::string("never");
            });
        EXPECT_TRUE(absl::StrContains(failed.message(), "out of range")) << failed;
        EXPECT_TRUE(model.is_training()) << "rank " << rank.rank;
        EXPECT_EQ(params(), after_step) << "rank " << rank.rank;
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return losses;
}

TEST(PrintSampleTest, AFailedSampleLeavesTheModelToTrainAsIfNoneWasDrawn) {
  for (const std::string strategy : {"ddp", "zero1", "shard_grad_op", "full_shard"}) {
    SCOPED_TRACE(strategy);
    const std::vector<double> expected = LossesAround(strategy, /*failed_samples=*/false);
    ASSERT_EQ(expected.size(), 3u);
    EXPECT_EQ(LossesAround(strategy, /*failed_samples=*/true), expected);
  }
}

}  // namespace
}  // namespace train
