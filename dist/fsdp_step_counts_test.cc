// What a steady-state FSDP step asks of a GPU beyond its kernels when ranks
// of the threads engine share it, counted on the CUDA emulation
// (third_party/cuda/emu/counters.h; --config=cuda_emu only). Once the first
// steps have filled every rank thread's cache a step allocates no device
// memory, and its copies between host and device do not grow with the
// number of FSDP units: the engine runs every collective of ranks sharing the
// GPU on their communication streams (dist/device_lane.h), nothing staged
// through host memory. The copies left are the batch's and the read-backs
// of the loss and the gradient norm; the memsets do not grow with the units
// either (ZeroGrad drops the gradient shards, as the train binaries do).
// Host waits are printed, not bounded: each rank's communication worker
// waits for its stream once per collective (the Work completes with the
// results in place), which grows with the units; a rank's compute thread
// does not wait there. With cpu_offload, the shards' uploads add none.
#include <algorithm>
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

// Both ranks' counts of the third of three steps (FULL_SHARD unless
// `strategy` says otherwise, auto-wrap by Block, SGD, clipping) of a model
// with `n_layer` blocks; `offload`: with cpu_offload (shards, gradients and
// SGD on the host).
Counters SteadyStepCounts(int64_t n_layer, bool offload = false,
                          ShardingStrategy strategy = ShardingStrategy::kFullShard) {
  mingpt::GptConfig c = Tiny();
  c.n_layer = n_layer;
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 1);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 2);
  FsdpOptions options = PerBlock();
  options.device = Device::Cuda(0);
  options.cpu_offload = offload;
  options.strategy = strategy;
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
      fsdp->ZeroGrad(/*set_to_none=*/true);  // as the train binaries' data-parallel step
      gpt.ForwardBackward(my_idx.To(options.device), my_tgt.To(options.device));
      fsdp->ClipGradNorm(kClip);
      opt->Step(fsdp->ParamRefs());
    }
    ASSERT_TRUE(pg.BarrierSync().ok());
    if (rank == 0) after = ReadCounters();
  });
  EXPECT_TRUE(s.ok()) << s;
  const Counters counts = after - before;
  std::printf("FSDP %s%s, %d ranks on cuda:0, n_layer %lld (%lld units): both ranks' "
              "step: %s\n",
              ShardingStrategyName(strategy), offload ? " offloaded" : "", kWorld,
              static_cast<long long>(n_layer),
              static_cast<long long>(n_layer + 1), counts.ToString().c_str());
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
  // Five units' collectives copy no more than three units' (with the engine
  // staging through host memory it was 26 / 20 against 38 / 32).
  EXPECT_EQ(four.copies_to_host, two.copies_to_host) << four.ToString();
  EXPECT_EQ(four.copies_to_device, two.copies_to_device) << four.ToString();
  // ZeroGrad drops the gradient shards (the reduces write them): no memset a
  // unit (12 / 16 when each shard was zeroed: 6 / 6 now).
  EXPECT_EQ(four.memsets, two.memsets) << four.ToString();
}

// Offloaded, each unit's shard goes up for its all-gathers on a stream of
// its own (dist/offload_uploads.h) and no rank thread waits for it: two
// units more add the waits they add on the GPU (the workers' per
// collective: 12, give or take one as the threads interleave: 11 to 13 in
// 12 runs) and one per rank and unit for the gradient's copy back, none for
// the uploads (16 in all, 22 where each upload was a blocking copy; 3 of
// slack).
TEST(FsdpStepCountsTest, OffloadedShardsGoUpWithoutAHostWait) {
  const Counters two = SteadyStepCounts(2, /*offload=*/true);
  const Counters four = SteadyStepCounts(4, /*offload=*/true);
  for (const Counters& c : {two, four}) {
    EXPECT_EQ(c.device_allocs, 0) << c.ToString();
    EXPECT_EQ(c.pinned_allocs, 0) << c.ToString();
  }
  const int64_t on_gpu = SteadyStepCounts(4).host_syncs - SteadyStepCounts(2).host_syncs;
  EXPECT_LE(four.host_syncs - two.host_syncs, on_gpu + 2 * kWorld + 3)
      << two.ToString() << " / " << four.ToString();
}

// NO_SHARD offloaded: each unit's whole flat parameter goes up by a copy
// queued on the thread's stream (FsdpUnit::QueueUpload), no host wait a unit
// (a blocking copy each was one wait a rank and unit). Two units more add the
// GPU's own waits (the workers' per all-reduce, as without offload) and the
// gradients' copies back (one a rank and unit), 2 of slack. The counts move
// by about one between runs as the threads interleave: each growth is the
// least of 3 runs (measured: 8 against a bound of 10; 12 with blocking
// copies).
TEST(FsdpStepCountsTest, NoShardOffloadedValuesGoUpWithoutAHostWait) {
  const ShardingStrategy no_shard = ShardingStrategy::kNoShard;
  int64_t offloaded = INT64_MAX, on_gpu = INT64_MAX;
  for (int run = 0; run < 3; ++run) {
    const Counters two = SteadyStepCounts(2, /*offload=*/true, no_shard);
    const Counters four = SteadyStepCounts(4, /*offload=*/true, no_shard);
    for (const Counters& c : {two, four}) {
      EXPECT_EQ(c.device_allocs, 0) << c.ToString();
      EXPECT_EQ(c.pinned_allocs, 0) << c.ToString();
    }
    offloaded = std::min(offloaded, four.host_syncs - two.host_syncs);
    on_gpu = std::min(on_gpu, SteadyStepCounts(4, false, no_shard).host_syncs -
                                  SteadyStepCounts(2, false, no_shard).host_syncs);
  }
  EXPECT_LE(offloaded, on_gpu + 2 * kWorld + 2) << "without offload: " << on_gpu;
}

}  // namespace
}  // namespace dist
