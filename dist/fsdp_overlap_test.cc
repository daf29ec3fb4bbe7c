// FSDP's prefetch/overlap options, no_sync and HYBRID_SHARD(_ZERO2) on the threads
// engine: every variant trains like one process on the global batch (fp32,
// within 1e-5), prefetch changes no bit of the results, and the memory ledger
// shows the prefetched units (one more unsharded unit while the next one's
// all-gather is in flight).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/recording_group.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/containers.h"
#include "nn/freeze.h"
#include "optim/sgd.h"
#include "tensor/error.h"

namespace dist {
namespace {

using tensor::Tensor;
using namespace dist::testing;  // NOLINT: the shared fixtures

struct Batch {
  Tensor idx, tgt;
};
Batch GlobalBatch(const mingpt::GptConfig& c) {
  return {RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 7),
          RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 8)};
}

// ---- Prefetch ----

using PrefetchParam = std::tuple<BackwardPrefetch, bool, int>;  // backward, forward, limit

class FsdpPrefetchTest : public ::testing::TestWithParam<PrefetchParam> {};

// Prefetch moves when an all-gather is issued, never what is computed: the
// results are bitwise those without prefetch, and equal one process.
TEST_P(FsdpPrefetchTest, SameBitsAsNoPrefetchAndOneProcess) {
  const auto [backward, forward, limit] = GetParam();
  const mingpt::GptConfig c = Tiny();
  const Batch b = GlobalBatch(c);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    FsdpOptions none = PerBlock(strategy);
    none.backward_prefetch = BackwardPrefetch::kNone;
    none.max_inflight_all_gathers = 1;
    FsdpOptions options = none;
    options.backward_prefetch = backward;
    options.forward_prefetch = forward;
    options.max_inflight_all_gathers = limit;
    const RunResult want = Sharded(c, b.idx, b.tgt, 3, none);
    const RunResult got = Sharded(c, b.idx, b.tgt, 3, options);
    ExpectBitwiseEqual(got, want);
    ExpectSameTraining(got, SingleProcess(c, b.idx, b.tgt));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, FsdpPrefetchTest,
    ::testing::Values(PrefetchParam{BackwardPrefetch::kPre, false, 2},
                      PrefetchParam{BackwardPrefetch::kPost, false, 2},
                      PrefetchParam{BackwardPrefetch::kPre, true, 2},
                      PrefetchParam{BackwardPrefetch::kPre, true, 3},
                      PrefetchParam{BackwardPrefetch::kNone, true, 4}),
    [](const ::testing::TestParamInfo<PrefetchParam>& info) {
      return std::string(BackwardPrefetchName(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_forward" : "") + "_limit" +
             std::to_string(std::get<2>(info.param));
    });

// The parameters category's peak during a second forward+backward (the first
// records the unit order): shards + root + one block without prefetch; with
// prefetch and a limit of L all-gathers, the units gathered ahead add up to
// L - 1 blocks. Exact bounds as in fsdp_memory_test: the engine's
// worker may release a finished buffer just after the next is allocated.

// Bytes of shards + the root unsharded (`base`) and of one unsharded block.
void UnitBytes(const FullyShardedModel& fsdp, int64_t* block_bytes, int64_t* base_bytes) {
  int64_t shards = 0;
  for (int u = 0; u < fsdp.num_units(); ++u) shards += fsdp.flat_param(u).shard_numel() * 4;
  *block_bytes = fsdp.flat_param(1).padded_numel() * 4;
  *base_bytes = shards + fsdp.flat_param(0).padded_numel() * 4;
}

int64_t SecondPassParamPeak(const FsdpOptions& options, int64_t* block_bytes, int64_t* base_bytes) {
  const mingpt::GptConfig c = Small();
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 4);
  int64_t peak = 0;
  ThreadWorld world(kWorld);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    auto fsdp = FullyShard(gpt, pg, options);
    const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
    const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
    gpt.ForwardBackward(my_idx, my_tgt);
    ASSERT_TRUE(pg.BarrierSync().ok());
    world.ledger(rank).ResetPeaks();
    gpt.ForwardBackward(my_idx, my_tgt);
    ASSERT_TRUE(pg.BarrierSync().ok());
    if (rank == 0) {
      UnitBytes(*fsdp, block_bytes, base_bytes);
      peak = fsdp->Memory(tensor::MemoryCategory::kParameters).peak;
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  return peak;
}

TEST(FsdpPrefetchTest, PrefetchedUnitsShowInTheLedgerUpToTheLimit) {
  FsdpOptions options = PerBlock();
  int64_t block = 0, base = 0;
  options.backward_prefetch = BackwardPrefetch::kNone;
  options.max_inflight_all_gathers = 1;
  const int64_t none = SecondPassParamPeak(options, &block, &base);
  options.backward_prefetch = BackwardPrefetch::kPre;
  options.forward_prefetch = true;
  options.max_inflight_all_gathers = 2;
  const int64_t two = SecondPassParamPeak(options, &block, &base);
  options.max_inflight_all_gathers = 3;
  const int64_t three = SecondPassParamPeak(options, &block, &base);
  std::printf("params peak: no prefetch %lld, limit 2 %lld, limit 3 %lld (base %lld, block %lld)\n",
              (long long)none, (long long)two, (long long)three, (long long)base, (long long)block);
  EXPECT_GE(none, base + block);
  EXPECT_LE(none, base + 2 * block);
  EXPECT_GE(two, base + 2 * block);  // the next block gathered while one computes
  EXPECT_LE(two, base + 3 * block);
  EXPECT_GE(three, base + 3 * block);
  EXPECT_LE(three, base + 4 * block);
}

TEST(FsdpPrefetchTest, ZeroLimitIsAClearError) {
  mingpt::GPT gpt(Tiny());
  absl::Status s = RunRanks(1, [&](int, ProcessGroup& pg) {
    FsdpOptions options;
    options.max_inflight_all_gathers = 0;
    try {
      FullyShard(gpt, pg, options);
      ADD_FAILURE() << "no error";
    } catch (const tensor::OpError& e) {
      EXPECT_NE(std::string(e.what()).find("max_inflight_all_gathers=0"), std::string::npos)
          << e.what();
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// ---- Explicit prefetch (SetForwardPrefetch / SetBackwardPrefetch) ----

struct ExplicitRunResult {
  RunResult run;                           // rank 0's losses (no norms), final parameters
  FullyShardedModel::PrefetchStats stats;  // rank 0's, all steps
  int64_t all_gathers = 0;                 // rank 0's, all steps
  int64_t first_pass_param_peak = 0, block_bytes = 0, base_bytes = 0;  // rank 0's
};

// Small() over 2 ranks: `setup` runs after FullyShard, then 3 SGD steps;
// the parameters category's peak is taken over the first forward+backward
// (no recorded order yet).
ExplicitRunResult ExplicitRun(const FsdpOptions& options,
                              const std::function<void(FullyShardedModel&)>& setup,
                              const std::vector<std::string>& freeze = {}) {
  const mingpt::GptConfig c = Small();
  constexpr int kWorld = 2;
  const Tensor idx = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(2 * kWorld, c.block_size, c.vocab_size, 4);
  ExplicitRunResult result;
  ThreadWorld world(kWorld);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    if (!freeze.empty()) {
      ASSERT_TRUE(nn::FreezeParameters(gpt, freeze).ok());
    }
    auto fsdp = FullyShard(gpt, pg, options);
    setup(*fsdp);
    auto opt = optim::SGD::Create(Sgd()).value();
    const Tensor my_idx = idx.Narrow(0, rank * 2, 2).Contiguous();
    const Tensor my_tgt = tgt.Narrow(0, rank * 2, 2).Contiguous();
    ASSERT_TRUE(pg.BarrierSync().ok());
    world.ledger(rank).ResetPeaks();
    for (int step = 0; step < 3; ++step) {
      fsdp->ZeroGrad();
      const double loss = gpt.ForwardBackward(my_idx, my_tgt);
      if (step == 0 && rank == 0) {
        result.first_pass_param_peak = fsdp->Memory(tensor::MemoryCategory::kParameters).peak;
      }
      opt->Step(fsdp->ParamRefs());
      if (rank == 0) result.run.losses.push_back(loss);
    }
    auto params = fsdp->FullStateDict();
    if (rank == 0) {
      for (auto& [name, t] : params) result.run.params.emplace_back(name, t.Clone());
      result.stats = fsdp->prefetch_stats();
      result.all_gathers = fsdp->all_gathers();
      UnitBytes(*fsdp, &result.block_bytes, &result.base_bytes);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  return result;
}

std::string Block(int i) { return "transformer.h." + std::to_string(i); }

// FSDP2's pattern: each block gathers the next two in forward and the two
// before it in backward. Unlike forward_prefetch / backward_prefetch, this
// prefetches in the first pass already (seen in its memory peak: the running
// block and two gathered ahead), never gathers a unit it does not use, and
// changes no bit of the training.
TEST(FsdpExplicitPrefetchTest, NextTwoBlocksFromTheFirstPassSameBits) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    FsdpOptions none = PerBlock(strategy);
    none.backward_prefetch = BackwardPrefetch::kNone;
    none.max_inflight_all_gathers = 1;
    const ExplicitRunResult want = ExplicitRun(none, [](FullyShardedModel&) {});
    const ExplicitRunResult got = ExplicitRun(none, [](FullyShardedModel& m) {
      for (int i = 0; i < 4; ++i) {
        std::vector<std::string> ahead, behind;
        for (int j = i + 1; j <= std::min(i + 2, 3); ++j) ahead.push_back(Block(j));
        for (int j = i - 1; j >= std::max(i - 2, 0); --j) behind.push_back(Block(j));
        m.SetForwardPrefetch(Block(i), ahead);
        m.SetBackwardPrefetch(Block(i), behind);
      }
    });
    ExpectBitwiseEqual(got.run, want.run);
    EXPECT_EQ(want.stats.issued, 0);
    // Per step: forward h.1, h.2 (by h.0), h.3 (by h.1); backward under
    // FULL_SHARD h.2, h.1 (by h.3), h.0 (by h.2); SHARD_GRAD_OP keeps the
    // blocks from forward to backward: nothing to gather there.
    const int64_t per_step = strategy == ShardingStrategy::kFullShard ? 6 : 3;
    EXPECT_EQ(got.stats.issued, 3 * per_step);
    EXPECT_EQ(got.stats.unused, 0);
    // Without prefetch: the root and one block unsharded (plus, at most, one
    // the engine's worker has not released yet); with it, three blocks.
    const int64_t base = got.base_bytes, block = got.block_bytes;
    std::printf("%s first pass params peak: none %lld, explicit %lld (base %lld, block %lld)\n",
                ShardingStrategyName(strategy), (long long)want.first_pass_param_peak,
                (long long)got.first_pass_param_peak, (long long)base, (long long)block);
    if (strategy == ShardingStrategy::kFullShard) {
      EXPECT_LE(want.first_pass_param_peak, base + 2 * block);
      EXPECT_GE(got.first_pass_param_peak, base + 3 * block);
      EXPECT_LE(got.first_pass_param_peak, base + 4 * block);
    }
  }
}

// PrefetchNeighbors(2) sets the lists the test above spells out, plus the
// root's (the first two blocks ahead, the last two behind): the same bits
// again, with the root's forward prefetching h.0 and h.1 (and h.0 then h.2,
// h.1 then h.3), its backward h.3 and h.2: 4 + 4 gathers a FULL_SHARD step.
TEST(FsdpExplicitPrefetchTest, PrefetchNeighborsListsTheNextUnits) {
  FsdpOptions none = PerBlock();
  none.backward_prefetch = BackwardPrefetch::kNone;
  none.max_inflight_all_gathers = 1;
  const ExplicitRunResult want = ExplicitRun(none, [](FullyShardedModel&) {});
  const ExplicitRunResult got =
      ExplicitRun(none, [](FullyShardedModel& m) { PrefetchNeighbors(m, 2); });
  ExpectBitwiseEqual(got.run, want.run);
  EXPECT_EQ(got.stats.issued, 3 * 8);
  EXPECT_EQ(got.stats.unused, 0);
  EXPECT_EQ(got.all_gathers, want.all_gathers);  // earlier, not more
  mingpt::GPT gpt(Tiny());
  absl::Status s = RunRanks(1, [&](int, ProcessGroup& pg) {
    auto fsdp = FullyShard(gpt, pg, PerBlock());
    try {
      PrefetchNeighbors(*fsdp, -1);
      ADD_FAILURE() << "no error";
    } catch (const tensor::OpError& e) {
      EXPECT_NE(std::string(e.what()).find("k=-1 must be >= 0"), std::string::npos) << e.what();
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The embeddings and the first two blocks frozen: the model's backward stops
// above them (nothing below h.2 trains), so h.3's and h.2's backward lists
// name units that run no backward. Once a backward has shown which units run
// one, those are not gathered again: 2 unused gathers in the first step
// (h.1 by h.3, h.0 by h.2), none after, and the same bits.
TEST(FsdpExplicitPrefetchTest, UnitsWhoseBackwardDoesNotRunAreNotPrefetchedForIt) {
  FsdpOptions none = PerBlock();
  none.backward_prefetch = BackwardPrefetch::kNone;
  none.max_inflight_all_gathers = 1;
  const std::vector<std::string> frozen = {"transformer.wte", "transformer.wpe", Block(0),
                                           Block(1)};
  const ExplicitRunResult want = ExplicitRun(none, [](FullyShardedModel&) {}, frozen);
  const ExplicitRunResult got =
      ExplicitRun(none, [](FullyShardedModel& m) { PrefetchNeighbors(m, 2); }, frozen);
  ExpectBitwiseEqual(got.run, want.run);
  // Per step: 4 forward; backward, the root's h.3 and h.2, then h.1 and h.0
  // by h.3 and h.2 in the first step only.
  EXPECT_EQ(got.stats.issued, 3 * 6 + 2);
  EXPECT_EQ(got.stats.unused, 2);
  EXPECT_EQ(got.all_gathers, want.all_gathers + 2);
}

// A list names units whatever order the pass runs them in: one the pass has
// already run (h.0's backward prefetching h.3, whose backward came first) is
// gathered, unused, and freed when the pass ends; the training is the same.
TEST(FsdpExplicitPrefetchTest, AUnitThePassDoesNotRunAgainIsFreedUnused) {
  FsdpOptions none = PerBlock();
  none.backward_prefetch = BackwardPrefetch::kNone;
  const ExplicitRunResult want = ExplicitRun(none, [](FullyShardedModel&) {});
  const ExplicitRunResult got =
      ExplicitRun(none, [](FullyShardedModel& m) { m.SetBackwardPrefetch(Block(0), {Block(3)}); });
  ExpectBitwiseEqual(got.run, want.run);
  EXPECT_EQ(got.stats.issued, 3);
  EXPECT_EQ(got.stats.unused, 3);
}

// A list replaces the recorded-order prefetch at its unit: empty lists on
// every unit turn forward_prefetch and backward_prefetch off.
TEST(FsdpExplicitPrefetchTest, EmptyListsTurnTheRecordedOrderPrefetchOff) {
  for (BackwardPrefetch backward : {BackwardPrefetch::kPre, BackwardPrefetch::kPost}) {
    FsdpOptions options = PerBlock();
    options.forward_prefetch = true;
    options.backward_prefetch = backward;
    options.max_inflight_all_gathers = 3;
    const ExplicitRunResult implicit = ExplicitRun(options, [](FullyShardedModel&) {});
    EXPECT_GT(implicit.stats.issued, 0);
    const ExplicitRunResult off = ExplicitRun(options, [](FullyShardedModel& m) {
      for (int u = 0; u < m.num_units(); ++u) {
        m.SetForwardPrefetch(m.unit_name(u), {});
        m.SetBackwardPrefetch(m.unit_name(u), {});
      }
    });
    EXPECT_EQ(off.stats.issued, 0) << BackwardPrefetchName(backward);
    ExpectBitwiseEqual(off.run, implicit.run);
  }
}

TEST(FsdpExplicitPrefetchTest, BadListsAreClearErrors) {
  mingpt::GPT gpt(Tiny());
  absl::Status s = RunRanks(1, [&](int, ProcessGroup& pg) {
    auto fsdp = FullyShard(gpt, pg, PerBlock());
    const auto expect_error = [](const std::function<void()>& f, const std::string& want) {
      try {
        f();
        ADD_FAILURE() << "no error; wanted " << want;
      } catch (const tensor::OpError& e) {
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      }
    };
    expect_error([&] { fsdp->SetForwardPrefetch("transformer.h.9", {Block(0)}); },
                 "'transformer.h.9' is not an FSDP unit; the units are '', 'transformer.h.0', "
                 "'transformer.h.1'");
    expect_error([&] { fsdp->SetBackwardPrefetch(Block(1), {"h.0"}); },
                 "'h.0' is not an FSDP unit");
    expect_error(
        [&] {
          fsdp->SetForwardPrefetch(Block(0), {Block(1), Block(0)});
        },
        "[SetForwardPrefetch] unit 'transformer.h.0' cannot prefetch itself");
    expect_error(
        [&] {
          fsdp->SetBackwardPrefetch(Block(1), {Block(0), "", Block(0)});
        },
        "[SetBackwardPrefetch] unit 'transformer.h.1': 'transformer.h.0' is listed twice");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// ---- Reshard after forward, per unit (SetReshardAfterForward) ----

// FULL_SHARD gathers the root once a step and each block twice (forward,
// backward): 9 all-gathers a step for Small()'s 4 blocks. Keeping the last
// block from its forward to its backward saves one; SHARD_GRAD_OP gathers
// each unit once (5), and resharding a block after its forward adds one.
// Neither changes a bit of the training.
TEST(FsdpReshardAfterForwardTest, PerUnitOverridesChangeTheGathersNotTheBits) {
  struct Case {
    ShardingStrategy strategy;
    int block;
    bool reshard;
    int64_t default_per_step, per_step;
  };
  for (const Case& c : {Case{ShardingStrategy::kFullShard, 3, false, 9, 8},
                        Case{ShardingStrategy::kShardGradOp, 0, true, 5, 6}}) {
    SCOPED_TRACE(ShardingStrategyName(c.strategy));
    const FsdpOptions options = PerBlock(c.strategy);
    const ExplicitRunResult want = ExplicitRun(options, [](FullyShardedModel&) {});
    const ExplicitRunResult got = ExplicitRun(options, [&](FullyShardedModel& m) {
      m.SetReshardAfterForward(Block(c.block), c.reshard);
    });
    ExpectBitwiseEqual(got.run, want.run);
    EXPECT_EQ(want.all_gathers, 3 * c.default_per_step);
    EXPECT_EQ(got.all_gathers, 3 * c.per_step);
  }
}

TEST(FsdpReshardAfterForwardTest, TheRootNoShardAndUnknownUnitsAreClearErrors) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    mingpt::GPT gpt(Tiny());
    absl::Status s = RunRanks(1, [&](int, ProcessGroup& pg) {
      auto fsdp = FullyShard(gpt, pg, PerBlock(strategy));
      const auto error = [&](const std::string& unit) {
        try {
          fsdp->SetReshardAfterForward(unit, false);
        } catch (const tensor::OpError& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      };
      EXPECT_NE(error("").find("the root unit is kept unsharded from its forward to its backward"),
                std::string::npos)
          << error("");
      EXPECT_NE(error("transformer.h.2").find("'transformer.h.2' is not an FSDP unit"),
                std::string::npos);
      if (strategy == ShardingStrategy::kNoShard) {
        EXPECT_NE(error(Block(0)).find("under NO_SHARD every rank holds its whole unit"),
                  std::string::npos)
            << error(Block(0));
      } else {
        EXPECT_EQ(error(Block(0)), "no error");
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Activation checkpointing recomputes each block's forward inside its
// backward: the recompute's PreForward/PostForward must neither reshard the
// unit its backward needs nor disturb the recorded order.
TEST(FsdpPrefetchTest, ActivationCheckpointingTrainsTheSame) {
  const mingpt::GptConfig c = Tiny();
  const Batch b = GlobalBatch(c);
  const RunResult want = SingleProcess(c, b.idx, b.tgt);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kNoShard}) {
    FsdpOptions options = PerBlock(strategy);
    options.forward_prefetch = true;
    const RunResult plain = Sharded(c, b.idx, b.tgt, 2, options);
    const RunResult checkpointed = Sharded(c, b.idx, b.tgt, 2, options, 1, true);
    ExpectBitwiseEqual(checkpointed, plain);
    ExpectSameTraining(checkpointed, want);
  }
}

// Units nested inside a checkpointed Block (size-based: each Block's attn
// and mlp.c_fc in units of their own): the Block's recompute frees each of
// them after its recompute forward, as the forward did, and their backward
// gathers them again (3 all-gathers a step each, where the Block, recomputed
// and then back-propagated, takes 2). So the recompute holds one nested unit
// at a time: the parameters' peak is the root, a Block and its larger nested
// unit, not the Block and both. The same training, bit for bit.
TEST(FsdpPrefetchTest, CheckpointingFreesNestedUnitsAfterTheirRecompute) {
  const mingpt::GptConfig c = Small();
  const Batch b = GlobalBatch(c);
  FsdpOptions options = PerBlock();
  options.policy = WrapPolicy::SizeBased(4224);
  options.backward_prefetch = BackwardPrefetch::kNone;
  options.max_inflight_all_gathers = 1;
  const RunResult plain = Sharded(c, b.idx, b.tgt, 2, options);
  const RunResult checkpointed = Sharded(c, b.idx, b.tgt, 2, options, 1, true);
  ExpectBitwiseEqual(checkpointed, plain);

  const Tensor idx = RandomIds(4, c.block_size, c.vocab_size, 3);
  const Tensor tgt = RandomIds(4, c.block_size, c.vocab_size, 4);
  ThreadWorld world(2);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    nn::ApplyCheckpointing(
        gpt, [](const std::string&, nn::Module& m) { return m.class_name() == "Block"; });
    auto fsdp = FullyShard(gpt, pg, options);
    int64_t shards = 0, block = 0, attn = 0, c_fc = 0;
    for (int u = 0; u < fsdp->num_units(); ++u) {
      const FlatParameter& flat = fsdp->flat_param(u);
      shards += flat.shard_numel() * 4;
      const std::string& name = fsdp->unit_name(u);
      if (name == "transformer.h.0") block = flat.padded_numel() * 4;
      if (name == "transformer.h.0.attn") attn = flat.padded_numel() * 4;
      if (name == "transformer.h.0.mlp.c_fc") c_fc = flat.padded_numel() * 4;
    }
    ASSERT_GT(block * attn * c_fc, 0) << "the units are not as this test expects";
    const int64_t root = fsdp->flat_param(0).padded_numel() * 4;
    world.ledger(rank).ResetPeaks();
    const int64_t before = fsdp->all_gathers();
    gpt.ForwardBackward(idx.Narrow(0, rank * 2, 2).Contiguous(),
                        tgt.Narrow(0, rank * 2, 2).Contiguous());
    // The root once; per Block: itself twice, attn and c_fc three times.
    EXPECT_EQ(fsdp->all_gathers() - before, 1 + c.n_layer * (2 + 3 + 3));
    const int64_t peak = fsdp->Memory(tensor::MemoryCategory::kParameters).peak;
    EXPECT_LE(peak, shards + root + block + std::max(attn, c_fc));
  });
  EXPECT_TRUE(s.ok()) << s;
}

// ---- no_sync: gradient accumulation ----

class FsdpNoSyncTest : public ::testing::TestWithParam<ShardingStrategy> {};

// Two micro-batches per step, the first under no_sync: equal to one process
// accumulating the same two micro-batches.
TEST_P(FsdpNoSyncTest, AccumulatedMicroBatchesMatchOneProcess) {
  const mingpt::GptConfig c = Tiny();
  const Batch b = GlobalBatch(c);
  for (int world : {2, 3}) {
    FsdpOptions options = PerBlock(GetParam());
    options.hybrid_shard_group_size = IsHybrid(GetParam()) ? 1 : 0;
    const RunResult want = SingleProcess(c, b.idx, b.tgt, precision::MixedPrecisionPolicy::Fp32(),
                                         /*micro_batches=*/2, world);
    // Accumulation changes the result (else the test shows nothing).
    ASSERT_NE(want.losses.back(), SingleProcess(c, b.idx, b.tgt).losses.back());
    ExpectSameTraining(Sharded(c, b.idx, b.tgt, world, options, /*micro_batches=*/2), want);
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpNoSyncTest,
                         ::testing::Values(ShardingStrategy::kFullShard,
                                           ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard,
                                           ShardingStrategy::kHybridShard,
                                           ShardingStrategy::kHybridShardZero2),
                         [](const ::testing::TestParamInfo<ShardingStrategy>& info) {
                           return std::string(ShardingStrategyName(info.param));
                         });

// ---- Dynamic loss scaling ----

// Backward from a scaled loss, then UnscaleGradsAndCheck: the same training as
// without scaling (a power of two: exact in fp32).
TEST(FsdpLossScalingTest, ScaledLossThenUnscaleTrainsTheSame) {
  const mingpt::GptConfig c = Tiny();
  const Batch b = GlobalBatch(c);
  const RunResult want = SingleProcess(c, b.idx, b.tgt);
  constexpr double kScale = 1024.0;
  RunResult got;
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    FsdpOptions options = PerBlock();
    auto fsdp = FullyShard(gpt, pg, options);
    auto opt = optim::SGD::Create(Sgd()).value();
    const int64_t B = kGlobalBatch / 2;
    RunResult mine;
    for (int step = 0; step < kSteps; ++step) {
      fsdp->ZeroGrad();
      const double loss = gpt.ForwardBackward(b.idx.Narrow(0, rank * B, B).Contiguous(),
                                              b.tgt.Narrow(0, rank * B, B).Contiguous(), kScale);
      mine.losses.push_back(RankMean(pg, loss));
      EXPECT_FALSE(fsdp->UnscaleGradsAndCheck(1.0 / kScale));
      mine.norms.push_back(fsdp->ClipGradNorm(kClip));
      opt->Step(fsdp->ParamRefs());
    }
    mine.params = fsdp->FullStateDict();
    if (rank == 0) got = std::move(mine);
  });
  ASSERT_TRUE(s.ok()) << s;
  for (auto& [name, t] : got.params) t = t.Clone();
  ExpectSameTraining(got, want);
}

// An inf in one rank's gradient shard only: every rank is told, so all skip.
TEST(FsdpLossScalingTest, NonFiniteOnOneRankIsSeenByAll) {
  const mingpt::GptConfig c = Tiny();
  const Batch b = GlobalBatch(c);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    std::vector<int> found(3, -1);
    absl::Status s = RunRanks(3, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions options;
      options.strategy = strategy;
      options.seed = kSeed;
      auto fsdp = FullyShard(gpt, pg, options);
      gpt.ForwardBackward(b.idx.Narrow(0, rank * 4, 4).Contiguous(),
                          b.tgt.Narrow(0, rank * 4, 4).Contiguous());
      ASSERT_FALSE(fsdp->UnscaleGradsAndCheck(1.0));
      if (rank == 1) fsdp->flat_param(0).grad_shard().data<float>()[0] = INFINITY;
      found[rank] = fsdp->UnscaleGradsAndCheck(1.0) ? 1 : 0;
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(found, (std::vector<int>{1, 1, 1})) << ShardingStrategyName(strategy);
  }
}

// ---- HYBRID_SHARD and HYBRID_SHARD_ZERO2 ----

// world, shard group size, auto-wrap, and HYBRID_SHARD_ZERO2 (else HYBRID_SHARD)
using HybridParam = std::tuple<int, int, bool, bool>;

class FsdpHybridShardTest : public ::testing::TestWithParam<HybridParam> {};

TEST_P(FsdpHybridShardTest, FiveStepsMatchOneProcessOnTheGlobalBatch) {
  const auto [world, group, wrap, zero2] = GetParam();
  const mingpt::GptConfig c = Tiny();
  const Batch b = GlobalBatch(c);
  FsdpOptions options;
  options.strategy = zero2 ? ShardingStrategy::kHybridShardZero2 : ShardingStrategy::kHybridShard;
  options.hybrid_shard_group_size = group;
  options.policy = wrap ? WrapPolicy::Transformer({"Block"}) : WrapPolicy::None();
  ExpectSameTraining(Sharded(c, b.idx, b.tgt, world, options), SingleProcess(c, b.idx, b.tgt));
}

INSTANTIATE_TEST_SUITE_P(
    Groups, FsdpHybridShardTest,
    ::testing::Values(HybridParam{4, 2, true, false}, HybridParam{4, 2, false, false},
                      HybridParam{2, 1, true, false}, HybridParam{4, 4, true, false},
                      HybridParam{3, 3, true, false}, HybridParam{4, 2, true, true},
                      HybridParam{4, 2, false, true}, HybridParam{2, 1, true, true}),
    [](const ::testing::TestParamInfo<HybridParam>& info) {
      return std::string(std::get<3>(info.param) ? "zero2_" : "") + "world" +
             std::to_string(std::get<0>(info.param)) + "_group" +
             std::to_string(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_blocks" : "_none");
    });

// Each rank holds 1/group of every unit; replicas hold the same shard.
TEST(FsdpHybridShardTest, ShardsAreOneGroupthAndReplicasAgree) {
  for (ShardingStrategy strategy :
       {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    const mingpt::GptConfig c = Tiny();
    std::vector<std::vector<float>> first_shard(4);
    absl::Status s = RunRanks(4, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      FsdpOptions options = PerBlock(strategy);
      options.hybrid_shard_group_size = 2;
      auto fsdp = FullyShard(gpt, pg, options);
      EXPECT_EQ(fsdp->shard_group_size(), 2);
      EXPECT_EQ(fsdp->shard_group_rank(), rank % 2);
      EXPECT_EQ(fsdp->num_replicas(), 2);
      EXPECT_EQ(fsdp->replica_index(), rank / 2);
      EXPECT_EQ(fsdp->flat_param(1).num_shards(), 2);
      first_shard[rank] = fsdp->flat_param(1).shard().ToVector<float>();
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(first_shard[0], first_shard[2]);
    EXPECT_EQ(first_shard[1], first_shard[3]);
    EXPECT_NE(first_shard[0], first_shard[1]);
  }
}

// A unit's all-reduce over the replicas (between the nodes) stays in flight
// while the next unit's backward runs: between its issue and its wait, the
// rank issues the next unit's reduce-scatter. Every one is waited for by the
// end of the backward (the root's post-backward), whose gradients are final.
TEST(FsdpHybridShardTest, TheReplicasAllReduceOverlapsTheNextUnitsBackward) {
  for (ShardingStrategy strategy :
       {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    const mingpt::GptConfig c = Small();  // 5 units
    const Batch b = GlobalBatch(c);
    std::vector<std::vector<std::string>> logs(4);
    std::vector<int> units(4);
    absl::Status s = RunRanks(4, [&](int rank, ProcessGroup& pg) {
      auto log = std::make_shared<CollectiveLog>();
      RecordingGroup recorded(pg, log);
      mingpt::GPT gpt(c);
      FsdpOptions options = PerBlock(strategy);
      options.hybrid_shard_group_size = 2;
      auto fsdp = FullyShard(gpt, recorded, options);
      const int per_rank = kGlobalBatch / 4;
      gpt.ForwardBackward(b.idx.Narrow(0, rank * per_rank, per_rank).Contiguous(),
                          b.tgt.Narrow(0, rank * per_rank, per_rank).Contiguous());
      logs[rank] = log->Lines();
      units[rank] = fsdp->num_units();
    });
    ASSERT_TRUE(s.ok()) << s;
    for (int rank = 0; rank < 4; ++rank) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank);
      const std::vector<std::string>& lines = logs[rank];
      // FullyShard splits the shard groups first, then the replicas'.
      const std::string replicas = "world/split2 ", shards = "world/split1 ";
      // Where each all-reduce was issued and waited for (oldest first, as
      // FSDP waits for them: the n-th wait is the n-th issue's).
      std::vector<size_t> issues, waits;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (absl::StartsWith(lines[i], replicas + "issue all_reduce")) issues.push_back(i);
        if (absl::StartsWith(lines[i], replicas + "wait all_reduce")) waits.push_back(i);
      }
      ASSERT_EQ(issues.size(), static_cast<size_t>(units[rank]));
      ASSERT_EQ(waits.size(), issues.size());
      int overlapped = 0;
      for (size_t n = 0; n < issues.size(); ++n) {
        for (size_t j = issues[n] + 1; j < waits[n]; ++j) {
          if (absl::StartsWith(lines[j], shards + "issue reduce_scatter")) {
            ++overlapped;
            break;
          }
        }
      }
      // The last two units' all-reduces are issued at the root's
      // post-backward, after every reduce-scatter.
      EXPECT_EQ(overlapped, units[rank] - 2) << absl::StrJoin(lines, "\n");
      // Each is waited for one unit later (not all at the end): at most 2 in
      // flight, their buffers' bound.
      for (size_t n = 2; n < issues.size(); ++n) {
        EXPECT_LT(waits[n - 2], issues[n]) << "all-reduce " << n - 2;
      }
    }
  }
}

TEST(FsdpHybridShardTest, AGroupSizeThatDoesNotDivideTheWorldIsAClearError) {
  absl::Status s = RunRanks(4, [&](int, ProcessGroup& pg) {
    mingpt::GPT gpt(Tiny());
    FsdpOptions options;
    options.hybrid_shard_group_size = 3;
    for (ShardingStrategy strategy :
         {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
      options.strategy = strategy;
      try {
        FullyShard(gpt, pg, options);
        ADD_FAILURE() << "no error";
      } catch (const tensor::OpError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(ShardingStrategyName(strategy)) +
                                             ": hybrid_shard_group_size=3"),
                  std::string::npos)
            << e.what();
      }
    }
    // The other strategies use one group of every rank: a group size given
    // to them is a mistake said as one, not ignored.
    options.strategy = ShardingStrategy::kFullShard;
    try {
      FullyShard(gpt, pg, options);
      ADD_FAILURE() << "no error";
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()),
                "[FullyShard] hybrid_shard_group_size=3 applies to HYBRID_SHARD and "
                "HYBRID_SHARD_ZERO2 only; FULL_SHARD uses all 4 ranks as one group (leave it 0)");
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dist
