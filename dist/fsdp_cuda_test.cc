// FSDP over GPU memory (issue 5): ranks of the threads engine sharing cuda:0
// train a tiny minGPT like one process on the GPU; CPU offload keeps shards,
// gradients and optimizer state in host memory and trains the same; the
// per-rank ledger shows where the bytes are. Runs on a GPU (built with
// --config=cuda); skips where none is visible.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"

namespace dist {
namespace {

using tensor::Device;
using tensor::MemoryCategory;
using tensor::Tensor;
using namespace dist::testing;  // NOLINT: the shared fixtures

// GPU reductions (the loss mean, the GEMMs' blocking) sum in other orders
// than the one-process run's: fp32 results agree to about 1e-6 relative.
constexpr double kGpuTol = 1e-4;

FsdpOptions OnGpu(ShardingStrategy strategy, bool offload = false) {
  FsdpOptions o = PerBlock(strategy);
  o.device = Device::Cuda(0);
  o.cpu_offload = offload;
  return o;
}

class FsdpCudaParityTest : public ::testing::TestWithParam<std::tuple<ShardingStrategy, int>> {};

TEST_P(FsdpCudaParityTest, RanksSharingOneGpuMatchOneProcessOnIt) {
  SKIP_WITHOUT_GPU();
  const auto [strategy, world] = GetParam();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 1);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 2);
  const RunResult want = SingleProcess(c, idx, tgt, precision::MixedPrecisionPolicy::Fp32(), 1, 1,
                                       Device::Cuda(0));
  ExpectSameTraining(Sharded(c, idx, tgt, world, OnGpu(strategy)), want, kGpuTol);
  // And with the shards, gradients and optimizer state offloaded.
  ExpectSameTraining(Sharded(c, idx, tgt, world, OnGpu(strategy, /*offload=*/true)), want,
                     kGpuTol);
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpCudaParityTest,
                         ::testing::Combine(::testing::Values(ShardingStrategy::kFullShard,
                                                              ShardingStrategy::kShardGradOp,
                                                              ShardingStrategy::kNoShard),
                                            ::testing::Values(1, 2, 3)));

// HYBRID_SHARD over GPU memory (4 ranks: shard groups of 2, each shard's
// gradient averaged over its 2 replicas after the reduce-scatter), on the GPU
// and offloaded (the replicas' all-reduce, then the copy back to the host).
TEST(FsdpCudaTest, HybridShardMatchesOneProcessOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 9);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 10);
  const RunResult want = SingleProcess(c, idx, tgt, precision::MixedPrecisionPolicy::Fp32(), 1, 1,
                                       Device::Cuda(0));
  for (ShardingStrategy strategy :
       {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    for (bool offload : {false, true}) {
      SCOPED_TRACE(absl::StrCat(ShardingStrategyName(strategy), offload ? ", offload" : ""));
      FsdpOptions o = OnGpu(strategy, offload);
      o.hybrid_shard_group_size = 2;
      ExpectSameTraining(Sharded(c, idx, tgt, 4, o), want, kGpuTol);
    }
  }
}

// HYBRID_SHARD with bf16 parameters and bf16 gradient reduction: the
// replicas' all-reduce (on FSDP's idle stream) reduces the bf16 shard the
// reduce-scatter wrote.
TEST(FsdpCudaTest, HybridShardBf16ReduceMatchesOneProcessBf16) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 16);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 17);
  precision::MixedPrecisionPolicy mp = precision::MixedPrecisionPolicy::Bf16();
  const RunResult want = SingleProcess(c, idx, tgt, mp, 1, 1, Device::Cuda(0));
  mp.reduce_dtype = tensor::Dtype::kBF16;
  FsdpOptions o = OnGpu(ShardingStrategy::kHybridShard);
  o.mixed_precision = mp;
  o.hybrid_shard_group_size = 2;
  ExpectCloseTraining(Sharded(c, idx, tgt, 4, o), want);
}

// NO_SHARD offloaded with bf16 parameters: each unit's f32 values go up on
// the rank's stream and are cast there (FsdpUnit::QueueUpload).
TEST(FsdpCudaTest, NoShardOffloadedBf16MatchesOneProcessBf16) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 13);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 14);
  const precision::MixedPrecisionPolicy mp = precision::MixedPrecisionPolicy::Bf16();
  const RunResult want = SingleProcess(c, idx, tgt, mp, 1, 1, Device::Cuda(0));
  FsdpOptions o = OnGpu(ShardingStrategy::kNoShard, /*offload=*/true);
  o.mixed_precision = mp;
  ExpectCloseTraining(Sharded(c, idx, tgt, 2, o), want);
}

// NO_SHARD offloaded: a forward ends with its uploads done, so the host may
// change the shards right after it (an optimizer step, a checkpoint's load)
// without the forward seeing the new values. Under CUDA_EMU_DEFER=all the
// uploads queued on the rank's stream wait until something waits for them:
// without the forward's final wait they would copy the zeros.
TEST(FsdpCudaTest, NoShardOffloadedForwardUsesTheValuesAtItsStart) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(2, c.block_size, c.vocab_size, 15);
  ThreadWorld world(1);
  absl::Status s = RunRanks(world, [&](int, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    FsdpOptions o = OnGpu(ShardingStrategy::kNoShard, /*offload=*/true);
    o.seed = kSeed;
    auto fsdp = FullyShard(gpt, pg, o);
    const Tensor on_gpu = idx.To(Device::Cuda(0));
    const std::vector<float> want = gpt.LastLogits(on_gpu).To(Device::Cpu()).ToVector<float>();
    const Tensor logits = gpt.LastLogits(on_gpu);  // not read yet
    for (optim::ParamRef& p : fsdp->ParamRefs()) {
      ASSERT_TRUE(p.param.device().is_cpu());
      tensor::Fill(p.param, 0.0);
    }
    EXPECT_EQ(logits.To(Device::Cpu()).ToVector<float>(), want);
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Offloaded with every unit's all-gather prefetched ahead (forward and
// backward, up to 3 in flight): the uploads of several units are in flight
// at once, each through its own slot, fp32 and bf16 (cast on the host).
TEST(FsdpCudaTest, OffloadedPrefetchedGathersMatchOneProcess) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 11);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 12);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const precision::MixedPrecisionPolicy mp =
        bf16 ? precision::MixedPrecisionPolicy::Bf16() : precision::MixedPrecisionPolicy::Fp32();
    const RunResult want = SingleProcess(c, idx, tgt, mp, 1, 1, Device::Cuda(0));
    FsdpOptions o = OnGpu(ShardingStrategy::kFullShard, /*offload=*/true);
    o.mixed_precision = mp;
    o.forward_prefetch = true;
    o.max_inflight_all_gathers = 3;
    const RunResult got = Sharded(c, idx, tgt, 2, o);
    if (bf16) {
      ExpectCloseTraining(got, want);
    } else {
      ExpectSameTraining(got, want, kGpuTol);
    }
  }
}

TEST(FsdpCudaTest, Bf16FullShardMatchesOneProcessBf16OnTheGpu) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 5);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 6);
  const precision::MixedPrecisionPolicy bf16 = precision::MixedPrecisionPolicy::Bf16();
  const RunResult want = SingleProcess(c, idx, tgt, bf16, 1, 1, Device::Cuda(0));
  for (bool offload : {false, true}) {
    FsdpOptions o = OnGpu(ShardingStrategy::kFullShard, offload);
    o.mixed_precision = bf16;
    SCOPED_TRACE(offload ? "offload" : "on the GPU");
    ExpectCloseTraining(Sharded(c, idx, tgt, 2, o), want);
  }
}

// Where each rank's bytes are: shards and gradient shards on the GPU, or in
// host memory with offload; the unsharded units only while in use on the GPU
// either way; AdamW's state beside the shards.
TEST(FsdpCudaTest, LedgerShowsShardsOnTheGpuOrOffloadedToTheHost) {
  SKIP_WITHOUT_GPU();
  mingpt::GptConfig c = Tiny();
  c.n_embd = 32;
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 4);
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload" : "on the GPU");
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions o = OnGpu(ShardingStrategy::kFullShard, offload);
      o.seed = kSeed;
      auto fsdp = FullyShard(gpt, pg, o);
      int64_t shard_bytes = 0, max_unit_bytes = 0;
      for (int u = 0; u < fsdp->num_units(); ++u) {
        shard_bytes += fsdp->flat_param(u).shard_numel() * 4;
        max_unit_bytes = std::max(max_unit_bytes, fsdp->flat_param(u).padded_numel() * 4);
      }
      const Device home = offload ? Device::Cpu() : Device::Cuda(0);
      const Device away = offload ? Device::Cuda(0) : Device::Cpu();
      for (const optim::ParamRef& r : fsdp->ParamRefs()) {
        EXPECT_EQ(r.param.device(), home) << r.name;
        EXPECT_EQ(r.grad.device(), home) << r.name;
        // Offloaded shards are page-locked: the GPU copies them directly.
        EXPECT_EQ(tensor::cuda::IsPinnedHost(r.param.raw_data()), offload) << r.name;
        EXPECT_EQ(tensor::cuda::IsPinnedHost(r.grad.raw_data()), offload) << r.name;
      }
      auto opt = optim::AdamW::Create({}).value();
      world.ledger(rank).ResetPeaks();
      gpt.ForwardBackward(idx.Narrow(0, rank * 2, 2).Contiguous().To(Device::Cuda(0)),
                          tgt.Narrow(0, rank * 2, 2).Contiguous().To(Device::Cuda(0)));
      opt->Step(fsdp->ParamRefs());
      ASSERT_TRUE(pg.BarrierSync().ok());
      EXPECT_EQ(fsdp->Memory(home, MemoryCategory::kParameters).current, shard_bytes);
      EXPECT_EQ(fsdp->Memory(home, MemoryCategory::kGradients).current, shard_bytes);
      EXPECT_EQ(fsdp->Memory(home, MemoryCategory::kOptimizerState).current, 2 * shard_bytes);
      EXPECT_EQ(fsdp->Memory(away, MemoryCategory::kOptimizerState).current, 0);
      // The GPU held unsharded units during the step and holds none now.
      const tensor::MemoryStats gpu_params =
          fsdp->Memory(Device::Cuda(0), MemoryCategory::kParameters);
      EXPECT_EQ(gpu_params.current, offload ? 0 : shard_bytes);
      EXPECT_GE(gpu_params.peak, max_unit_bytes);
      if (rank == 0) {
        std::printf("%s: shard %lld B; GPU params peak %lld B, grads peak %lld B\n",
                    offload ? "offload" : "on GPU", static_cast<long long>(shard_bytes),
                    static_cast<long long>(gpu_params.peak),
                    static_cast<long long>(
                        fsdp->Memory(Device::Cuda(0), MemoryCategory::kGradients).peak));
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Offloaded, each step copies shards out and reduced gradients back through
// the page-locked buffers FullyShard made (one per dtype: bf16 for both
// here, f32 too when the reduce stays fp32; FULL_SHARD, NO_SHARD and
// HYBRID_SHARD): the steps allocate no host memory for communication (the
// ledger charges page-locked blocks to the CPU), so none can run out of it
// on one rank only (after its reduce, its peers stepped without it).
TEST(FsdpCudaTest, OffloadedStepsAllocateNoPageLockedMemory) {
  SKIP_WITHOUT_GPU();
  const mingpt::GptConfig c = Tiny();
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 8);
  for (const std::pair<ShardingStrategy, tensor::Dtype>& run :
       {std::pair{ShardingStrategy::kFullShard, tensor::Dtype::kBF16},
        std::pair{ShardingStrategy::kFullShard, tensor::Dtype::kF32},
        std::pair{ShardingStrategy::kNoShard, tensor::Dtype::kBF16},
        std::pair{ShardingStrategy::kHybridShard, tensor::Dtype::kBF16}}) {
    const ShardingStrategy strategy = run.first;  // named: lambdas capture no bindings
    const tensor::Dtype reduce = run.second;
    SCOPED_TRACE(absl::StrCat(ShardingStrategyName(strategy), ", reduce ",
                              tensor::DtypeName(reduce)));
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions o = OnGpu(strategy, /*offload=*/true);
      o.seed = kSeed;
      o.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
      o.mixed_precision.reduce_dtype = reduce;
      // HYBRID_SHARD: the replicas' all-reduce, then the copy.
      o.hybrid_shard_group_size = IsHybrid(strategy) ? 1 : 0;
      auto fsdp = FullyShard(gpt, pg, o);
      auto opt = optim::AdamW::Create({}).value();
      tensor::MemoryLedger& ledger = world.ledger(rank);
      const int64_t staging = ledger.Stats(Device::Cpu(), MemoryCategory::kCommunication).current;
      EXPECT_GT(staging, 0) << "rank " << rank << ": no staging buffer";
      ledger.ResetPeaks();
      for (int step = 0; step < 2; ++step) {
        gpt.ForwardBackward(idx.Narrow(0, rank * 2, 2).Contiguous().To(Device::Cuda(0)),
                            tgt.Narrow(0, rank * 2, 2).Contiguous().To(Device::Cuda(0)));
        opt->Step(fsdp->ParamRefs());
        fsdp->ZeroGrad();
      }
      const tensor::MemoryStats comm = ledger.Stats(Device::Cpu(), MemoryCategory::kCommunication);
      EXPECT_EQ(comm.current, staging) << "rank " << rank;
      EXPECT_EQ(comm.peak, staging) << "rank " << rank << ": a step allocated host memory";
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Offloaded, with explicit prefetch lists deeper than the upload slots
// (max_inflight_all_gathers 2: 2 slots; each unit prefetches the next 3), and
// FullyShardedModel::Unshard gathering every unit at once: the gathers that
// find no slot free copy their shard by a blocking copy through the staging
// buffer FullyShard made, so no step allocates page-locked memory, and the
// losses are those of the run whose every gather takes a slot.
TEST(FsdpCudaTest, OffloadedGathersPastTheUploadSlotsAllocateNoPageLockedMemory) {
  SKIP_WITHOUT_GPU();
  mingpt::GptConfig c = Tiny();
  c.n_layer = 4;
  constexpr int kWorld = 2;
  constexpr int kSteps = 3;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 13);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 14);
  std::vector<double> losses[2][kWorld];
  for (int deep : {0, 1}) {
    SCOPED_TRACE(deep ? "prefetching 3 units ahead" : "the default prefetch");
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions o = OnGpu(ShardingStrategy::kFullShard, /*offload=*/true);
      o.seed = kSeed;
      o.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
      auto fsdp = FullyShard(gpt, pg, o);
      if (deep) PrefetchNeighbors(*fsdp, 3);
      auto opt = optim::AdamW::Create({}).value();
      tensor::MemoryLedger& ledger = world.ledger(rank);
      const int64_t staging = ledger.Stats(Device::Cpu(), MemoryCategory::kCommunication).current;
      ledger.ResetPeaks();
      for (int step = 0; step < kSteps; ++step) {
        losses[deep][rank].push_back(
            gpt.ForwardBackward(idx.Narrow(0, rank * 2, 2).Contiguous().To(Device::Cuda(0)),
                                tgt.Narrow(0, rank * 2, 2).Contiguous().To(Device::Cuda(0))));
        opt->Step(fsdp->ParamRefs());
        fsdp->ZeroGrad();
      }
      fsdp->Unshard();  // every unit, each waiting for nothing before the next
      fsdp->Reshard();
      const tensor::MemoryStats comm = ledger.Stats(Device::Cpu(), MemoryCategory::kCommunication);
      EXPECT_EQ(comm.peak, staging) << "rank " << rank << ": a step allocated host memory";
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(losses[1][rank], losses[0][rank]) << "rank " << rank;
    EXPECT_EQ(losses[0][rank].size(), static_cast<size_t>(kSteps));
  }
}

// A Linear with a buffer of n floats (as BatchNorm's running statistics).
class LinearWithBuffer : public nn::Module {
 public:
  explicit LinearWithBuffer(int64_t n) : nn::Module("LinearWithBuffer") {
    linear_ = RegisterModule("linear", std::make_unique<nn::Linear>(4, 4));
    RegisterBuffer("stats", Tensor::Zeros({n}));
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    return linear_->Run(in, ctx.Child(0));
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    return linear_->RunBackward(grad, ctx.Child(0));
  }

 private:
  nn::Linear* linear_;
};

// Rank 1 runs out of memory moving its buffers to the GPU (its 64 MiB do not
// fit under a limit 32 MiB above what the process holds; rank 0's 1 KiB do):
// FullyShard fails on both ranks together, rank 1 with its own error and
// rank 0 with an out of memory naming rank 1, before any other collective,
// and the group stays usable.
TEST(FsdpCudaTest, ARankOutOfMemoryMovingItsBuffersFailsEveryRank) {
  SKIP_WITHOUT_GPU();
  struct Lift {
    ~Lift() { tensor::cuda::SetDeviceMemoryLimit(0, -1); }
  } lift;
  tensor::cuda::ReleaseCachedDeviceMemory(0);  // what is reserved now is live
  tensor::cuda::SetDeviceMemoryLimit(0, tensor::cuda::DeviceReservedBytes(0) + (32 << 20));
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    LinearWithBuffer m(rank == 1 ? int64_t{16} << 20 : 256);
    FsdpOptions o;
    o.device = Device::Cuda(0);
    std::string error;
    try {
      auto fsdp = FullyShard(m, pg, o);
      error = "no error";
    } catch (const tensor::OutOfMemoryError& e) {
      error = absl::StrCat("out of memory: ", e.what());
    } catch (const tensor::OpError& e) {
      error = e.what();
    }
    const std::string want =
        rank == 1 ? "past its limit of "
                  : "out of memory: [FullyShard] moving its buffers to cuda:0 failed on rank(s) 1, "
                    "out of memory (see their errors)";
    EXPECT_NE(error.find(want), std::string::npos) << "rank " << rank << ": " << error;
    EXPECT_TRUE(pg.BarrierSync().ok()) << "rank " << rank;
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dist
