// train::PrintSample under FSDP (threads engine, 2 ranks): a draw that runs
// out of memory with the whole model gathered fails naming
// --sample_gather=unit, which holds less; gathered unit by unit, or failing
// otherwise, the error is the draw's own.
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "models/common/data_parallel.h"
#include "models/common/data_parallel_testing.h"
#include "models/mingpt/model.h"
#include "tensor/allocator.h"

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

}  // namespace
}  // namespace train
