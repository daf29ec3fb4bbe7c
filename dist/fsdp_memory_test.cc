// FSDP's memory on the threads engine, from each rank's ledger: FULL_SHARD
// holds 1/N plus the units in use, frozen units hold no gradient,
// SHARD_GRAD_OP frees the units a backward skips, resharding after a
// forward-only pass; Unshard() (summon_full_params) and its values; devices
// refused where they are missing.
#include "dist/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/freeze.h"
#include "nn/mixed_precision.h"
#include "nn/state_dict.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/testing.h"

namespace dist {
namespace {

using tensor::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using namespace dist::testing;  // NOLINT: the shared fixtures

// ---- Memory ledger ----
// FULL_SHARD with the transformer policy, 4 ranks, a model of 4 blocks
// (n_embd 32, vocab 64, block_size 16: 55,488 parameters = 221,952 bytes).
// Measured (every rank): sharded parameters 55,488 bytes = 0.250 of the model;
// peak of the parameters category during a forward+backward 124,992 bytes =
// the shards + the root unit (wte, wpe, ln_f, lm_head: 18,688 bytes, kept
// unsharded from the root's forward to its backward, as PyTorch) + one block
// (50,816 bytes) at a time = 0.563 of this small model (a block is 23% of it;
// the unsharded share shrinks as layers grow in number; a first pass has no
// recorded order, so nothing is prefetched). Gradients: the sharded grads +
// the root's and one block's unsharded flat gradients + the previous block's,
// whose reduce-scatter is kept in flight while this block computes (175,808
// bytes). Every figure is exact: the threads engine drops a call's buffers
// before its Wait() returns. (It used to drop them just after, and 1 run in 10
// then measured a parameters peak of one more block.)
TEST(FsdpMemoryTest, FullShardHoldsOneNthPlusTheUnitsInUse) {
  const mingpt::GptConfig c = Small();
  constexpr int kWorld = 4;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 4);
  ThreadWorld world(kWorld);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    FsdpOptions options = PerBlock();
    auto fsdp = FullyShard(gpt, pg, options);
    ASSERT_EQ(fsdp->num_units(), 1 + c.n_layer);
    int64_t shard_bytes = 0, max_block_bytes = 0;
    for (int u = 0; u < fsdp->num_units(); ++u) {
      shard_bytes += fsdp->flat_param(u).shard_numel() * 4;
      if (u > 0) max_block_bytes = std::max(max_block_bytes, fsdp->flat_param(u).padded_numel() * 4);
    }
    const int64_t root_bytes = fsdp->flat_param(0).padded_numel() * 4;
    const int64_t model_bytes = gpt.NumParameters() * 4;
    using tensor::MemoryCategory;
    EXPECT_EQ(fsdp->Memory(MemoryCategory::kParameters).current, shard_bytes);
    EXPECT_EQ(fsdp->Memory(MemoryCategory::kGradients).current, shard_bytes);
    EXPECT_LE(shard_bytes, model_bytes / kWorld + fsdp->num_units() * 4);
    world.ledger(rank).ResetPeaks();
    const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
    const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
    gpt.ForwardBackward(my_idx, my_tgt);
    const tensor::MemoryStats params = fsdp->Memory(MemoryCategory::kParameters);
    const tensor::MemoryStats grads = fsdp->Memory(MemoryCategory::kGradients);
    EXPECT_EQ(params.current, shard_bytes);  // every unsharded buffer freed
    const int64_t in_use = shard_bytes + root_bytes + max_block_bytes;
    EXPECT_EQ(params.peak, in_use);
    EXPECT_EQ(grads.current, shard_bytes);
    EXPECT_EQ(grads.peak, in_use + max_block_bytes);  // the previous block's reduce in flight
    for (auto& [n, p] : gpt.NamedParameters()) {
      EXPECT_FALSE(p->value.defined()) << n;
      EXPECT_FALSE(p->grad.defined()) << n;
    }
    if (rank == 0) {
      std::printf("model %lld B, shard %lld B (%.3f), root unit %lld B, block %lld B, "
                  "params peak %lld B (%.3f), grads peak %lld B\n",
                  (long long)model_bytes, (long long)shard_bytes, double(shard_bytes) / model_bytes,
                  (long long)root_bytes, (long long)max_block_bytes, (long long)params.peak,
                  double(params.peak) / model_bytes, (long long)grads.peak);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Frozen parameters (fine-tuning the last Block and the head): the three
// frozen Block units allocate no gradient shard, no unsharded gradient and
// issue no reduce-scatter, so the gradient peak is the trainable shards + the
// root's and the last Block's unsharded gradients, and nothing is in flight
// beside them; only the root and the last Block have ParamRefs, the root's
// with the token embedding's elements as frozen ranges; a step leaves every
// frozen shard as it was.
TEST(FsdpMemoryTest, FrozenUnitsHoldNoGradients) {
  const mingpt::GptConfig c = Small();
  constexpr int kWorld = 4;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 4);
  ThreadWorld world(kWorld);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    ASSERT_TRUE(nn::FreezeParameters(gpt, {"transformer.h.0", "transformer.h.1", "transformer.h.2",
                                           "transformer.wte"})
                    .ok());
    auto fsdp = FullyShard(gpt, pg, PerBlock());
    ASSERT_EQ(fsdp->num_units(), 1 + c.n_layer);
    int64_t trainable_shard_bytes = 0;
    for (int u = 0; u < fsdp->num_units(); ++u) {
      const bool trains = u == 0 || u == c.n_layer;
      EXPECT_EQ(fsdp->flat_param(u).trains(), trains) << u;
      EXPECT_EQ(fsdp->flat_param(u).grad_shard().defined(), trains) << u;
      if (trains) trainable_shard_bytes += fsdp->flat_param(u).shard_numel() * 4;
    }
    const int64_t root_bytes = fsdp->flat_param(0).padded_numel() * 4;
    const int64_t block_bytes = fsdp->flat_param(c.n_layer).padded_numel() * 4;
    const std::vector<optim::ParamRef> refs = fsdp->ParamRefs();
    ASSERT_EQ(refs.size(), 2u);
    EXPECT_EQ(refs[0].name, "fsdp.root");
    EXPECT_EQ(refs[1].name, "fsdp.transformer.h.3");
    EXPECT_TRUE(refs[1].frozen_ranges.empty());
    // The root's flat parameter starts with wte (64 x 32 = 2048 elements).
    const FlatParameter& root = fsdp->flat_param(0);
    const int64_t frozen_in_shard =
        std::max<int64_t>(0, std::min<int64_t>(2048, root.shard_end()) - root.shard_begin());
    int64_t frozen_listed = 0;
    for (const auto& [b, e] : refs[0].frozen_ranges) frozen_listed += e - b;
    EXPECT_EQ(frozen_listed, frozen_in_shard) << "rank " << rank;

    using tensor::MemoryCategory;
    EXPECT_EQ(fsdp->Memory(MemoryCategory::kGradients).current, trainable_shard_bytes);
    world.ledger(rank).ResetPeaks();
    std::vector<Tensor> before;
    for (int u = 0; u < fsdp->num_units(); ++u) before.push_back(fsdp->flat_param(u).shard().Clone());
    gpt.ForwardBackward(idx.Narrow(0, rank * 2, 2).Contiguous(),
                        tgt.Narrow(0, rank * 2, 2).Contiguous());
    const tensor::MemoryStats grads = fsdp->Memory(MemoryCategory::kGradients);
    EXPECT_EQ(grads.current, trainable_shard_bytes);
    EXPECT_EQ(grads.peak, trainable_shard_bytes + root_bytes + block_bytes);
    for (auto& [n, p] : gpt.NamedParameters()) EXPECT_FALSE(p->grad.defined()) << n;
    auto sgd = optim::SGD::Create(Sgd());
    ASSERT_TRUE(sgd.ok());
    (*sgd)->Step(fsdp->ParamRefs());
    for (int u = 1; u < c.n_layer; ++u) {
      EXPECT_TRUE(tensor::testing::AllClose(fsdp->flat_param(u).shard(), before[u], 0, 0)) << u;
    }
    // The root's wte elements stay; its other elements move.
    const std::vector<float> now = root.shard().ToVector<float>();
    const std::vector<float> was = before[0].ToVector<float>();
    int64_t moved_frozen = 0, moved_other = 0;
    for (int64_t i = 0; i < root.shard_numel(); ++i) {
      const bool frozen = root.shard_begin() + i < 2048;
      const bool moved = now[i] != was[i];
      (frozen ? moved_frozen : moved_other) += moved ? 1 : 0;
    }
    EXPECT_EQ(moved_frozen, 0);
    if (root.shard_end() > 2048 && root.shard_begin() + 16 < root.numel()) {
      EXPECT_GT(moved_other, 0);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// requires_grad changed after FullyShard is an error naming the parameter at
// the next backward (the gradient layout and frozen ranges follow the flags
// at construction), not a silently wrong step.
TEST(FsdpMemoryTest, FreezingAfterFullyShardIsAnError) {
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(2, c.block_size, c.vocab_size, 5);
  absl::Status s = RunRanks(1, [&](int rank, ProcessGroup& pg) {
    for (bool freeze_later : {true, false}) {
      mingpt::GPT gpt(c);
      if (!freeze_later) {
        ASSERT_TRUE(nn::FreezeParameters(gpt, {"transformer.h.1.mlp.c_fc.weight"}).ok());
      }
      auto fsdp = FullyShard(gpt, pg, PerBlock());
      auto params = gpt.NamedParameters();
      for (auto& [name, p] : params) {
        if (name == "transformer.h.1.mlp.c_fc.weight") p->requires_grad = !freeze_later;
      }
      try {
        gpt.ForwardBackward(idx, idx);
        ADD_FAILURE() << "no error";
      } catch (const tensor::OpError& e) {
        EXPECT_NE(std::string(e.what()).find(absl::StrCat(
                      "parameter transformer.h.1.mlp.c_fc.weight was ",
                      freeze_later ? "frozen" : "unfrozen", " (requires_grad) after FullyShard")),
                  std::string::npos)
            << e.what();
      }
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// SHARD_GRAD_OP keeps a unit gathered from its forward for its backward;
// when the backward stops above it (the embeddings and the first Block
// frozen), the root's post-backward frees it: after the step only the shards
// are held, and the next forward gathers every unit again.
TEST(FsdpMemoryTest, ShardGradOpFreesTheUnitsTheBackwardSkips) {
  const mingpt::GptConfig c = Tiny();
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 5);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 6);
  ThreadWorld world(kWorld);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    ASSERT_TRUE(
        nn::FreezeParameters(gpt, {"transformer.wte", "transformer.wpe", "transformer.h.0"}).ok());
    auto fsdp = FullyShard(gpt, pg, PerBlock(ShardingStrategy::kShardGradOp));
    int64_t shard_bytes = 0;
    for (int u = 0; u < fsdp->num_units(); ++u) shard_bytes += fsdp->flat_param(u).shard_numel() * 4;
    const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
    const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
    for (int step = 0; step < 2; ++step) {
      const int64_t gathers = fsdp->all_gathers();
      gpt.ForwardBackward(my_idx, my_tgt);
      EXPECT_EQ(fsdp->all_gathers() - gathers, fsdp->num_units()) << "step " << step;
      EXPECT_EQ(fsdp->Memory(tensor::MemoryCategory::kParameters).current, shard_bytes)
          << "step " << step;
      for (auto& [n, p] : gpt.NamedParameters()) EXPECT_FALSE(p->value.defined()) << n;
      fsdp->ZeroGrad();
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A forward pass with no backward (evaluation) leaves the root unit
// (FULL_SHARD, HYBRID_SHARD) or every unit (SHARD_GRAD_OP,
// HYBRID_SHARD_ZERO2) unsharded, waiting
// for a backward that does not come; Reshard() frees them, and the next
// forward gathers the shards again: the training step that follows sees the
// same parameters (its loss equals the evaluation's on the same batch).
TEST(FsdpMemoryTest, ReshardingAfterAForwardOnlyPassLeavesOnlyTheShards) {
  const mingpt::GptConfig c = Tiny();
  constexpr int kWorld = 4;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 5);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 6);
  for (ShardingStrategy strategy :
       {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
        ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions options = PerBlock(strategy);
      options.hybrid_shard_group_size = IsHybrid(strategy) ? 2 : 0;
      options.forward_prefetch = true;  // a prefetch issued in the pass is freed too
      auto fsdp = FullyShard(gpt, pg, options);
      using tensor::MemoryCategory;
      const int64_t shards = fsdp->Memory(MemoryCategory::kParameters).current;
      int64_t root_bytes = fsdp->flat_param(0).padded_numel() * 4, all_bytes = 0;
      for (int u = 0; u < fsdp->num_units(); ++u) {
        all_bytes += fsdp->flat_param(u).padded_numel() * 4;
      }
      const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
      const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
      for (int pass = 0; pass < 2; ++pass) {  // the second with the recorded order
        gpt.Train(false);
        const double eval_loss = gpt.Loss(my_idx, my_tgt);
        gpt.Train(true);
        const int64_t held = fsdp->Memory(MemoryCategory::kParameters).current;
        EXPECT_EQ(held, shards + (ReshardsAfterForward(strategy) ? root_bytes : all_bytes));
        fsdp->Reshard();
        EXPECT_EQ(fsdp->Memory(MemoryCategory::kParameters).current, shards);
        for (auto& [n, p] : gpt.NamedParameters()) EXPECT_FALSE(p->value.defined()) << n;
        const double train_loss = gpt.ForwardBackward(my_idx, my_tgt);
        EXPECT_EQ(train_loss, eval_loss);
        EXPECT_EQ(fsdp->Memory(MemoryCategory::kParameters).current, shards);
        fsdp->ZeroGrad();
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Unshard() (FSDP2's unshard, summon_full_params) after a training step and
// a forward-only pass that left units gathered, then an optimizer step that
// changed the shards: every parameter value is the full parameter of the
// shards now (rank 0: FullStateDict's, in the compute dtype; every rank the
// same values), so generation's DecodeLogits, which calls the blocks past
// their hooks, gives what one process with those weights gives. Reshard()
// returns to the shards alone, and training goes on.
TEST(FsdpUnshardTest, ValuesAreTheCurrentFullParametersUntilReshard) {
  const mingpt::GptConfig c = Tiny();
  constexpr int kWorld = 4;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 5);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 6);
  const Tensor prompt = RandomIds(2, 3, c.vocab_size, 7);  // (2, 3)
  struct Case {
    ShardingStrategy strategy;
    precision::MixedPrecisionPolicy mp;
  };
  for (const Case& k :
       {Case{ShardingStrategy::kFullShard, precision::MixedPrecisionPolicy::Fp32()},
        Case{ShardingStrategy::kShardGradOp, precision::MixedPrecisionPolicy::Fp32()},
        Case{ShardingStrategy::kHybridShard, precision::MixedPrecisionPolicy::Fp32()},
        Case{ShardingStrategy::kNoShard, precision::MixedPrecisionPolicy::Fp32()},
        Case{ShardingStrategy::kFullShard, precision::MixedPrecisionPolicy::Bf16()}}) {
    SCOPED_TRACE(::testing::Message()
                 << ShardingStrategyName(k.strategy) << " " << k.mp.ToString());
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions options = PerBlock(k.strategy);
      options.hybrid_shard_group_size = IsHybrid(k.strategy) ? 2 : 0;
      options.mixed_precision = k.mp;
      auto fsdp = FullyShard(gpt, pg, options);
      const int64_t shards = fsdp->Memory(tensor::MemoryCategory::kParameters).current;
      auto opt = optim::SGD::Create(Sgd()).value();
      const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
      const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
      gpt.ForwardBackward(my_idx, my_tgt);
      opt->Step(fsdp->ParamRefs());
      gpt.Train(false);
      gpt.Loss(my_idx, my_tgt);      // forward only: the root (or every unit) stays gathered
      opt->Step(fsdp->ParamRefs());  // the shards change under it
      const NamedTensors full = fsdp->FullStateDict();  // rank 0: the fp32 parameters now

      fsdp->Unshard();
      double sum = 0.0;  // of every value: the same on every rank
      for (auto& [name, p] : gpt.NamedParameters()) {
        ASSERT_TRUE(p->value.defined()) << name;
        for (float v : p->value.To(tensor::Dtype::kF32).Contiguous().ToVector<float>()) sum += v;
      }
      EXPECT_NEAR(RankMean(pg, sum), sum, 1e-9 * std::abs(sum));
      std::vector<nn::KvCache> caches;
      const Tensor logits = gpt.DecodeLogits(prompt, caches);  // (2, V)
      if (rank == 0) {
        std::map<std::string, Tensor> want(full.begin(), full.end());
        for (auto& [name, p] : gpt.NamedParameters()) {
          EXPECT_TRUE(tensor::testing::AllClose(
              p->value.To(tensor::Dtype::kF32),
              want.at(name).To(p->value.dtype()).To(tensor::Dtype::kF32), 0.0, 0.0))
              << name;
        }
        mingpt::GPT reference(c);
        reference.Materialize(0);
        ASSERT_TRUE(nn::LoadStateDict(reference, full).ok());
        nn::MixedPrecision mixed(reference, k.mp);
        mixed.CastForCompute();
        reference.Train(false);
        std::vector<nn::KvCache> reference_caches;
        EXPECT_TRUE(tensor::testing::AllClose(
            logits.To(tensor::Dtype::kF32),
            reference.DecodeLogits(prompt, reference_caches).To(tensor::Dtype::kF32), 1e-6, 1e-6));
      }

      fsdp->Reshard();
      EXPECT_EQ(fsdp->Memory(tensor::MemoryCategory::kParameters).current, shards);
      if (k.strategy != ShardingStrategy::kNoShard || k.mp.param_dtype != tensor::Dtype::kF32) {
        for (auto& [n, p] : gpt.NamedParameters()) EXPECT_FALSE(p->value.defined()) << n;
      }
      gpt.Train(true);
      fsdp->ZeroGrad();
      EXPECT_TRUE(std::isfinite(gpt.ForwardBackward(my_idx, my_tgt)));
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// While Unshard() holds the parameters, forward hooks communicate nothing:
// rank 0 alone decodes (the other rank would never join a gather; the
// group's timeout would end a hook that waited for one) and gets the logits
// it gets when both decode; a backward is refused with a message naming
// Reshard(), and after Reshard() training goes on.
TEST(FsdpUnshardTest, WhileUnshardedForwardsCommunicateNothingAndBackwardIsRefused) {
  const mingpt::GptConfig c = Tiny();
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2, c.block_size, c.vocab_size, 5);
  const Tensor prompt = RandomIds(2, 3, c.vocab_size, 7);  // (2, 3)
  ThreadWorld world(kWorld);
  absl::Notification rank0_decoded;  // rank 1 issues nothing until then
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    pg.set_timeout(absl::Seconds(20));
    mingpt::GPT gpt(c);
    FsdpOptions options = PerBlock();
    auto fsdp = FullyShard(gpt, pg, options);
    gpt.Train(false);
    fsdp->Unshard();
    std::vector<nn::KvCache> both_caches;
    const Tensor both = gpt.DecodeLogits(prompt, both_caches);  // (2, V)
    if (rank == 0) {
      std::vector<nn::KvCache> caches;
      EXPECT_TRUE(tensor::testing::AllClose(gpt.DecodeLogits(prompt, caches), both, 0.0, 0.0));
      EXPECT_TRUE(tensor::testing::AllClose(gpt.LastLogits(prompt), both, 1e-5, 1e-5));
      rank0_decoded.Notify();
    } else {
      ASSERT_TRUE(rank0_decoded.WaitForNotificationWithTimeout(absl::Seconds(30)));
    }
    gpt.Train(true);
    try {
      gpt.ForwardBackward(idx, idx);
      ADD_FAILURE() << "backward ran while Unshard() held the parameters";
    } catch (const tensor::OpError& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "backward while Unshard() holds the parameters"))
          << e.what();
      EXPECT_TRUE(absl::StrContains(e.what(), "call Reshard()")) << e.what();
    }
    fsdp->Reshard();
    EXPECT_TRUE(std::isfinite(gpt.ForwardBackward(idx, idx)));
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A forward-only pass left without Reshard() keeps the root unit (FULL_SHARD)
// or every unit (SHARD_GRAD_OP) gathered; after an optimizer step the next
// forward gathers again and its values are the new ones, not the held
// buffer's (rank 0's loss is one process's at FullStateDict's weights).
TEST(FsdpUnshardTest, AForwardAfterAStepSeesTheNewShardsWithoutReshard) {
  const mingpt::GptConfig c = Tiny();
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 5);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 6);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions options = PerBlock(strategy);
      auto fsdp = FullyShard(gpt, pg, options);
      auto opt = optim::SGD::Create(Sgd()).value();
      const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
      const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
      gpt.ForwardBackward(my_idx, my_tgt);
      gpt.Train(false);
      gpt.Loss(my_idx, my_tgt);      // leaves units gathered
      opt->Step(fsdp->ParamRefs());  // new shards
      const double loss = gpt.Loss(my_idx, my_tgt);
      const NamedTensors full = fsdp->FullStateDict();
      if (rank == 0) {
        mingpt::GPT reference(c);
        reference.Materialize(0);
        ASSERT_TRUE(nn::LoadStateDict(reference, full).ok());
        reference.Train(false);
        EXPECT_NEAR(loss, reference.Loss(my_idx, my_tgt), 1e-6);
      }
      fsdp->Reshard();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Devices this binary or machine lacks, and offload without a GPU, are
// refused with a message naming the option (no rank allocates anything).
TEST(FsdpDeviceTest, UnavailableDeviceAndOffloadWithoutGpuAreRefused) {
  if (tensor::cuda::DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  ThreadWorld world(1);
  absl::Status s = RunRanks(world, [&](int, ProcessGroup& pg) {
    mingpt::GPT gpt(Tiny());
    FsdpOptions options;
    options.device = tensor::Device::Cuda(0);
    try {
      auto fsdp = FullyShard(gpt, pg, options);
      ADD_FAILURE() << "device cuda:0 accepted without a GPU";
    } catch (const tensor::OpError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("device cuda:0"), std::string::npos) << what;
      EXPECT_TRUE(what.find("without CUDA support") != std::string::npos ||
                  what.find("0 CUDA device(s)") != std::string::npos)
          << what;
    }
    options.device = tensor::Device::Cpu();
    options.cpu_offload = true;
    try {
      auto fsdp = FullyShard(gpt, pg, options);
      ADD_FAILURE() << "cpu_offload accepted with device cpu";
    } catch (const tensor::OpError& e) {
      EXPECT_NE(std::string(e.what()).find("offload needs a CUDA device"), std::string::npos)
          << e.what();
    }
    for (auto& [n, p] : gpt.NamedParameters()) EXPECT_FALSE(p->value.defined()) << n;
    EXPECT_EQ(world.ledger(0).Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters)
                  .current,
              0);
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dist
