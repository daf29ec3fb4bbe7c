// What a steady-state FSDP step asks of a GPU beyond its kernels when ranks
// of the threads engine share it, counted on the CUDA emulation
// (third_party/cuda/emu/counters.h; --config=cuda_emu only). Once the first
// steps have filled every rank thread's cache a step allocates no device
// memory. The copies are printed, not bounded: the threads engine stages each
// collective through host memory, so they grow with the number of FSDP units
// (README, "CUDA emulation"). Host waits are counted per rank thread; the
// engine's copies on the legacy default stream also wait for the other
// ranks' streams, which the count does not see.
#include <cstdint>
#include <cstdio>

#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "optim/sgd.h"
#include "third_party/cuda/emu/counters.h"

namespace dist {
namespace {

using cuda_emu::Counters;
using cuda_emu::ReadCounters;
using tensor::Device;
using tensor::Tensor;
using namespace dist::testing;  // NOLINT: the shared fixtures

constexpr int kWorld = 2;

// Both ranks' counts of the third of three FULL_SHARD steps (auto-wrap by
// Block, SGD, clipping) of a model with `n_layer` blocks.
Counters SteadyStepCounts(int64_t n_layer) {
  mingpt::GptConfig c = Tiny();
  c.n_layer = n_layer;
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 1);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 2);
  FsdpOptions options;
  options.strategy = ShardingStrategy::kFullShard;
  options.policy = WrapPolicy::Transformer({"Block"});
  options.device = Device::Cuda(0);
  options.seed = kSeed;
  const int64_t B = kGlobalBatch / kWorld;
  Counters before, after;
  ThreadWorld world(kWorld);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    auto fsdp = FullyShard(gpt, pg, options);
    auto opt = optim::SGD::Create(Sgd()).value();
    const Tensor my_idx = idx.Narrow(0, rank * B, B).Contiguous();  // (B, T) on the host
    const Tensor my_tgt = tgt.Narrow(0, rank * B, B).Contiguous();
    for (int step = 0; step < 3; ++step) {
      // The barriers (no GPU work) fence the counted step on both ranks.
      if (step == 2) {
        ASSERT_TRUE(pg.BarrierSync().ok());
        if (rank == 0) before = ReadCounters();
        ASSERT_TRUE(pg.BarrierSync().ok());
      }
      fsdp->ZeroGrad();
      gpt.ForwardBackward(my_idx.To(options.device), my_tgt.To(options.device));
      fsdp->ClipGradNorm(kClip);
      opt->Step(fsdp->ParamRefs());
    }
    ASSERT_TRUE(pg.BarrierSync().ok());
    if (rank == 0) after = ReadCounters();
  });
  EXPECT_TRUE(s.ok()) << s;
  const Counters counts = after - before;
  std::printf("FSDP FULL_SHARD, %d ranks on cuda:0, n_layer %lld (%lld units): both ranks' step: %s\n",
              kWorld, static_cast<long long>(n_layer), static_cast<long long>(n_layer + 1),
              counts.ToString().c_str());
  return counts;
}

TEST(FsdpStepCountsTest, SteadyStateStepAllocatesNoDeviceMemory) {
  const Counters two = SteadyStepCounts(2);
  const Counters four = SteadyStepCounts(4);
  for (const Counters& c : {two, four}) {
    EXPECT_EQ(c.device_allocs, 0) << c.ToString();
    EXPECT_EQ(c.device_frees, 0) << c.ToString();
    EXPECT_EQ(c.pinned_allocs, 0) << c.ToString();
  }
  EXPECT_GT(four.kernel_launches, two.kernel_launches);
}

}  // namespace
}  // namespace dist
