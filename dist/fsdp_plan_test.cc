// PlanSharding: the layouts equal FullyShard's own, a gpt-175b plan at 1024
// ranks is built without allocating any parameter, and EstimateFsdpRank's
// unsharded peaks bound what FullyShard's ledger measures, with nested units
// and with units gathered fp32 under bf16.
#include "dist/fsdp_plan.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "precision/policy.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace {

using tensor::MemoryCategory;

struct Peaks {
  int64_t params = 0;  // unsharded parameters: the category's peak less the shards
  int64_t grads = 0;   // unsharded gradients: the same less the gradient shards
};

// The largest unsharded peaks any rank's ledger measures over `passes`
// forward+backward passes of minGPT `c` under FullyShard(options) on
// `world` threads-engine ranks (the first pass records the order the later
// ones prefetch from).
// `setup` (when given) runs on each rank's model after FullyShard.
// `freeze`: parameters frozen before FullyShard.
Peaks MeasurePeaks(const mingpt::GptConfig& c, int world, const FsdpOptions& options,
                   int passes = 2, bool no_sync = false,
                   const std::function<void(FullyShardedModel&)>& setup = nullptr,
                   const std::vector<std::string>& freeze = {}) {
  const tensor::Tensor idx = testing::RandomIds(2 * world, c.block_size, c.vocab_size, 3);
  const tensor::Tensor tgt = testing::RandomIds(2 * world, c.block_size, c.vocab_size, 4);
  ThreadWorld threads(world);
  std::mutex mu;
  Peaks worst;
  absl::Status s = RunRanks(threads, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    if (!freeze.empty()) {
      ASSERT_TRUE(nn::FreezeParameters(gpt, freeze).ok());
    }
    auto fsdp = FullyShard(gpt, pg, options);
    if (setup) setup(*fsdp);
    const int64_t shards = fsdp->Memory(MemoryCategory::kParameters).current;
    const int64_t grad_shards = fsdp->Memory(MemoryCategory::kGradients).current;
    threads.ledger(rank).ResetPeaks();
    for (int pass = 0; pass < passes; ++pass) {
      // no_sync: every pass but the last accumulates without communicating.
      std::optional<FullyShardedModel::NoSyncGuard> guard;
      if (no_sync && pass + 1 < passes) guard.emplace(fsdp.get());
      gpt.ForwardBackward(idx.Narrow(0, rank * 2, 2).Contiguous(),
                          tgt.Narrow(0, rank * 2, 2).Contiguous());
    }
    const int64_t params = fsdp->Memory(MemoryCategory::kParameters).peak - shards;
    const int64_t grads = fsdp->Memory(MemoryCategory::kGradients).peak - grad_shards;
    std::lock_guard<std::mutex> lock(mu);
    worst.params = std::max(worst.params, params);
    worst.grads = std::max(worst.grads, grads);
  });
  EXPECT_TRUE(s.ok()) << s;
  return worst;
}

// The estimate before it knew of nesting: the root plus `window` of the
// largest units, as if no unit held another.
int64_t FlatBound(const ShardingPlan& plan, int bytes, int window, bool trainable) {
  const int64_t others = int64_t(plan.units.size()) - 1;
  const int64_t largest = trainable ? plan.max_trainable_padded_numel : plan.max_padded_numel;
  return bytes * (plan.units.front().padded_numel + std::min<int64_t>(window, others) * largest);
}

// With frozen parameters too (the embeddings and the first Block, the
// embeddings in units of their own as the train binaries wrap them): units
// of frozen parameters only have no gradient shard and no optimizer state.
TEST(FsdpPlanTest, LayoutsEqualFullyShardsAtEveryWorldSize) {
  const mingpt::GptConfig c = testing::Tiny();
  for (bool frozen : {false, true}) {
    SCOPED_TRACE(frozen ? "frozen" : "all train");
    const std::vector<std::string> freeze = {"transformer.wte", "transformer.wpe",
                                             "transformer.h.0"};
    const WrapPolicy blocks = WrapPolicy::Transformer({"Block"});
    const WrapPolicy policy = frozen ? WrapPolicy::FrozenLeavesApart(blocks) : blocks;
    for (int world : {1, 2, 3, 4}) {
      mingpt::GPT reference(c);
      if (frozen) {
        ASSERT_TRUE(nn::FreezeParameters(reference, freeze).ok());
      }
      const ShardingPlan plan = PlanSharding(reference, policy, world);
      EXPECT_EQ(plan.units.size(), frozen ? 5u : 3u);
      absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
        mingpt::GPT gpt(c);
        if (frozen) {
          ASSERT_TRUE(nn::FreezeParameters(gpt, freeze).ok());
        }
        FsdpOptions options;
        options.policy = policy;
        auto fsdp = FullyShard(gpt, pg, options);
        ASSERT_EQ(fsdp->num_units(), static_cast<int>(plan.units.size()));
        for (int u = 0; u < fsdp->num_units(); ++u) {
          EXPECT_EQ(fsdp->unit_name(u), plan.units[u].name);
          EXPECT_EQ(fsdp->flat_param(u).numel(), plan.units[u].numel);
          EXPECT_EQ(fsdp->flat_param(u).padded_numel(), plan.units[u].padded_numel);
          EXPECT_EQ(fsdp->flat_param(u).shard_numel(), plan.units[u].shard_numel);
          EXPECT_EQ(fsdp->flat_param(u).trains(), plan.units[u].trains);
        }
        // The estimate's sharded state is what the ledger charges, and AdamW's
        // state after a step.
        const FsdpRankBytes b = EstimateFsdpRank(plan, {});
        using tensor::MemoryCategory;
        EXPECT_EQ(fsdp->Memory(MemoryCategory::kParameters).current, b.sharded_parameters);
        EXPECT_EQ(fsdp->Memory(MemoryCategory::kGradients).current, b.sharded_gradients);
        auto adamw = optim::AdamW::Create({});
        ASSERT_TRUE(adamw.ok());
        (*adamw)->Step(fsdp->ParamRefs());
        EXPECT_EQ((*adamw)->StateBytes(), b.optimizer_state);
      });
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(plan.total_numel, reference.NumParameters());
      EXPECT_EQ(plan.trainable_shard_numel < plan.shard_numel, frozen);
    }
  }
}

TEST(FsdpPlanTest, Gpt175bAt1024RanksAllocatesNothing) {
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset("gpt-175b");
  ASSERT_TRUE(config.ok());
  mingpt::GPT gpt(*config);
  const ShardingPlan plan = PlanSharding(gpt, WrapPolicy::Transformer({"Block"}), 1024);
  ASSERT_EQ(plan.units.size(), 1u + config->n_layer);  // the root + 96 blocks
  const mingpt::ParamCount count = mingpt::CountParameters(*config);
  EXPECT_EQ(plan.total_numel, count.total);
  EXPECT_GT(plan.total_numel, 174'000'000'000);
  EXPECT_LT(plan.total_numel, 176'000'000'000);
  for (const ShardingPlan::Unit& u : plan.units) {
    EXPECT_EQ(u.padded_numel % 1024, 0) << u.name;
    EXPECT_EQ(u.shard_numel, (u.numel + 1023) / 1024) << u.name;
  }
  // Per rank: 175e9 / 1024 = 171M elements: AdamW fp32 state 16 bytes each.
  FsdpEstimateOptions bf16_adamw;
  bf16_adamw.param_bytes = 2;
  const FsdpRankBytes b = EstimateFsdpRank(plan, bf16_adamw);
  EXPECT_EQ(b.model_state(), 16 * plan.shard_numel);
  EXPECT_LT(b.model_state(), int64_t{3} << 30);
  // Nothing was allocated: parameters have shapes only.
  EXPECT_EQ(ledger.Total(tensor::Device::Cpu()).peak, 0);
  for (auto& [name, p] : gpt.NamedParameters()) ASSERT_FALSE(p->value.defined()) << name;
}

// Nested units (size-based wrapping of minGPT Small: "transformer" holds
// wte/wpe/ln_f, each Block holds its LayerNorms and attn.c_proj, and inside it
// c_attn, mlp.c_fc and mlp.c_proj are units of their own): FullyShard keeps
// the enclosing units gathered, and their gradients allocated, while an
// inner unit runs, so the measured peaks pass the flat bound (root + window
// of the largest units); the estimate stays above them, and within 25%.
// With the per-Block policy (no nesting) the estimate is the flat bound.
TEST(FsdpPlanTest, EstimateBoundsTheLedgerWithNestedUnits) {
  const mingpt::GptConfig c = testing::Small();
  constexpr int kWorld = 2;
  struct Case {
    const char* name;
    WrapPolicy policy;
    bool nested;
  };
  const Case cases[] = {{"per block", WrapPolicy::Transformer({"Block"}), false},
                        {"size 1100", WrapPolicy::SizeBased(1100), true},
                        {"size 300", WrapPolicy::SizeBased(300), true}};
  for (const Case& k : cases) {
    mingpt::GPT reference(c);
    const ShardingPlan plan = PlanSharding(reference, k.policy, kWorld);
    int max_depth = 0;
    for (const ShardingPlan::Unit& u : plan.units) {
      int depth = 0;
      for (int a = u.parent; a > 0; a = plan.units[a].parent) ++depth;
      max_depth = std::max(max_depth, depth);
    }
    EXPECT_EQ(max_depth > 0, k.nested) << k.name;
    for (int inflight : {1, 2, 3}) {
      for (BackwardPrefetch prefetch : {BackwardPrefetch::kPre, BackwardPrefetch::kPost}) {
        SCOPED_TRACE(::testing::Message() << k.name << ", max_inflight_all_gathers " << inflight
                                          << ", " << BackwardPrefetchName(prefetch));
        FsdpOptions options;
        options.policy = k.policy;
        options.forward_prefetch = true;
        options.backward_prefetch = prefetch;
        options.max_inflight_all_gathers = inflight;
        const Peaks measured = MeasurePeaks(c, kWorld, options);
        FsdpEstimateOptions estimate;
        estimate.max_inflight_all_gathers = inflight;
        const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
        std::printf("%s inflight %d %s: params %lld <= %lld, grads %lld <= %lld\n", k.name,
                    inflight, BackwardPrefetchName(prefetch), (long long)measured.params,
                    (long long)b.unsharded_parameters_peak, (long long)measured.grads,
                    (long long)b.unsharded_gradients_peak);
        EXPECT_GE(b.unsharded_parameters_peak, measured.params);
        EXPECT_GE(b.unsharded_gradients_peak, measured.grads);
        EXPECT_LE(b.unsharded_parameters_peak, measured.params * 5 / 4);
        EXPECT_LE(b.unsharded_gradients_peak, measured.grads * 5 / 4);
        const int64_t flat_params = FlatBound(plan, 4, inflight, false);
        const int64_t flat_grads = FlatBound(plan, 4, 2, true);
        if (k.nested) {
          // Three in flight: the flat bound's third largest unit covers the
          // enclosing units in some cases.
          if (inflight < 3) {
            EXPECT_LT(flat_params, measured.params);
          }
          EXPECT_LT(flat_grads, measured.grads);
        } else {
          EXPECT_EQ(b.unsharded_parameters_peak, flat_params);
          EXPECT_EQ(b.unsharded_gradients_peak, flat_grads);
        }
      }
    }
  }
}

// One unit far larger than the others (a frozen embedding in a unit of its
// own, as the train binaries wrap it): the unit running and the one gathered
// ahead are two units, never the largest twice; the estimate stays within
// the ledger's peak and a quarter.
TEST(FsdpPlanTest, TheLargestUnitIsCountedOnce) {
  mingpt::GptConfig c = testing::Small();
  c.vocab_size = 4096;  // wte: 4096 x n_embd, far above a Block
  const std::vector<std::string> freeze = {"transformer.wte", "transformer.wpe"};
  mingpt::GPT reference(c);
  ASSERT_TRUE(nn::FreezeParameters(reference, freeze).ok());
  const WrapPolicy policy = WrapPolicy::FrozenLeavesApart(WrapPolicy::Transformer({"Block"}));
  const ShardingPlan plan = PlanSharding(reference, policy, 2);
  FsdpOptions options;
  options.policy = policy;
  options.max_inflight_all_gathers = 2;
  const Peaks measured = MeasurePeaks(c, 2, options, 2, false, nullptr, freeze);
  FsdpEstimateOptions estimate;
  estimate.max_inflight_all_gathers = 2;
  const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
  std::printf("params %lld <= %lld\n", (long long)measured.params,
              (long long)b.unsharded_parameters_peak);
  EXPECT_GE(b.unsharded_parameters_peak, measured.params);
  EXPECT_LE(b.unsharded_parameters_peak, measured.params * 5 / 4);
  // Trained, in a unit of its own: the two gradients in flight are two units.
  mingpt::GPT trained(c);
  const WrapPolicy embeddings = WrapPolicy::Transformer({"Block", "Embedding"});
  const ShardingPlan apart = PlanSharding(trained, embeddings, 2);
  options.policy = embeddings;
  const Peaks with_grads = MeasurePeaks(c, 2, options);
  const FsdpRankBytes g = EstimateFsdpRank(apart, estimate);
  std::printf("grads %lld <= %lld\n", (long long)with_grads.grads,
              (long long)g.unsharded_gradients_peak);
  EXPECT_EQ(g.unsharded_gradients_peak, with_grads.grads);  // here exactly
}

// Gradient accumulation under no_sync: every trainable unit keeps its
// unsharded fp32 gradient between backwards, so the gradients' peak is all of
// them (with nested units or not), far above the synced step's window; the
// estimate with no_sync is that sum and bounds the ledger.
TEST(FsdpPlanTest, NoSyncKeepsEveryUnitsGradient) {
  const mingpt::GptConfig c = testing::Small();
  constexpr int kWorld = 2;
  for (const WrapPolicy& policy :
       {WrapPolicy::Transformer({"Block"}), WrapPolicy::SizeBased(300)}) {
    mingpt::GPT reference(c);
    const ShardingPlan plan = PlanSharding(reference, policy, kWorld);
    FsdpOptions options;
    options.policy = policy;
    const Peaks measured = MeasurePeaks(c, kWorld, options, /*passes=*/3, /*no_sync=*/true);
    const Peaks synced = MeasurePeaks(c, kWorld, options, /*passes=*/3);
    FsdpEstimateOptions estimate;
    estimate.no_sync = true;
    const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
    int64_t all = 0;
    for (const ShardingPlan::Unit& u : plan.units) all += u.trains ? 4 * u.padded_numel : 0;
    std::printf("%zu units: no_sync grads %lld <= %lld (synced %lld)\n", plan.units.size(),
                (long long)measured.grads, (long long)b.unsharded_gradients_peak,
                (long long)synced.grads);
    EXPECT_EQ(b.unsharded_gradients_peak, all);
    EXPECT_GE(b.unsharded_gradients_peak, measured.grads);
    EXPECT_LE(b.unsharded_gradients_peak, measured.grads * 5 / 4);
    EXPECT_GT(measured.grads, synced.grads);
    EXPECT_GT(b.unsharded_gradients_peak, EstimateFsdpRank(plan, {}).unsharded_gradients_peak);
  }
}

// FSDP2's explicit prefetch (PrefetchNeighbors(k): k + 1 units in flight,
// whatever max_inflight_all_gathers says) and units kept gathered from their
// forward to their backward (SetReshardAfterForward(unit, false): held while
// every later unit runs). The estimate given both bounds the ledger: exactly
// for a stack of Blocks; with nested units within 50% (k + 1 of the largest
// units, where the neighbours in pre-order are smaller ones). For the stack
// the estimate without them is below what the ledger measures for k + 1 >
// max_inflight_all_gathers and for a kept unit that is not the last.
TEST(FsdpPlanTest, ExplicitPrefetchAndKeptUnitsAreEstimated) {
  const mingpt::GptConfig c = testing::Small();  // 4 Blocks
  constexpr int kWorld = 2;
  for (const bool nested : {false, true}) {
    const WrapPolicy policy =
        nested ? WrapPolicy::SizeBased(300) : WrapPolicy::Transformer({"Block"});
    mingpt::GPT reference(c);
    const ShardingPlan plan = PlanSharding(reference, policy, kWorld);
    const int last = static_cast<int>(plan.units.size()) - 1;
    const std::vector<std::vector<int>> kept_cases = {{}, {1}, {last}, {1, 2}};
    for (int k : {0, 1, 3}) {
      for (const std::vector<int>& kept : kept_cases) {
        SCOPED_TRACE(::testing::Message() << plan.units.size() << " units, prefetch_units " << k
                                          << ", " << kept.size() << " kept, first "
                                          << (kept.empty() ? 0 : kept[0]));
        FsdpOptions options;
        options.policy = policy;
        options.forward_prefetch = true;
        const Peaks measured =
            MeasurePeaks(c, kWorld, options, /*passes=*/2, /*no_sync=*/false,
                         [&](FullyShardedModel& fsdp) {
                           PrefetchNeighbors(fsdp, k);
                           for (int u : kept) fsdp.SetReshardAfterForward(fsdp.unit_name(u), false);
                         });
        FsdpEstimateOptions estimate;
        estimate.prefetch_units = k;
        estimate.kept_units = kept;
        const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
        const FsdpRankBytes unaware = EstimateFsdpRank(plan, {});
        std::printf("%zu units, k %d, %zu kept (first %d): params %lld <= %lld (unaware %lld)\n",
                    plan.units.size(), k, kept.size(), kept.empty() ? 0 : kept[0],
                    (long long)measured.params, (long long)b.unsharded_parameters_peak,
                    (long long)unaware.unsharded_parameters_peak);
        EXPECT_GE(b.unsharded_parameters_peak, measured.params);
        EXPECT_GE(b.unsharded_gradients_peak, measured.grads);
        if (nested) {
          EXPECT_LE(b.unsharded_parameters_peak, measured.params * 3 / 2);
        } else {
          EXPECT_EQ(b.unsharded_parameters_peak, measured.params);
          if (k == 3 || (!kept.empty() && kept[0] == 1)) {
            EXPECT_LT(unaware.unsharded_parameters_peak, measured.params);
          }
        }
      }
    }
  }
}

TEST(FsdpPlanTest, BadPrefetchUnitsAndKeptUnitsAreRefused) {
  mingpt::GPT reference(testing::Small());
  const ShardingPlan plan = PlanSharding(reference, WrapPolicy::Transformer({"Block"}), 2);
  FsdpEstimateOptions negative;
  negative.prefetch_units = -1;
  EXPECT_THROW(EstimateFsdpRank(plan, negative), tensor::OpError);
  for (int bad : {0, static_cast<int>(plan.units.size())}) {
    FsdpEstimateOptions kept;
    kept.kept_units = {bad};
    try {
      EstimateFsdpRank(plan, kept);
      ADD_FAILURE() << "kept unit " << bad << " was accepted";
    } catch (const tensor::OpError& e) {
      EXPECT_NE(std::string(e.what()).find("kept unit"), std::string::npos) << e.what();
    }
  }
}

// Per-Block units, forward prefetch, bf16 with `kept` classes kept fp32.
FsdpOptions Bf16PerBlock(std::vector<std::string> kept) {
  FsdpOptions options = testing::PerBlock();
  options.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
  options.mixed_precision.fp32_module_classes = std::move(kept);
  options.forward_prefetch = true;
  return options;
}

// bf16 compute with LayerNorm kept fp32: FullyShard makes every LayerNorm of
// minGPT Small an fp32 unit of its own (ln_1 and ln_2 nested in their Block,
// ln_f in the root; WrapPolicy::ForMixedPrecision), and the plan has the same
// units. The Blocks and the root hold no kept parameter and gather in bf16;
// the LayerNorm units gather in fp32. The estimate bounds the measured peak,
// and a plan without the fp32 policy has other units.
TEST(FsdpPlanTest, ModulesKeptFp32UnderBf16AreUnitsOfTheirOwn) {
  const mingpt::GptConfig c = testing::Small();
  constexpr int kWorld = 2;
  const FsdpOptions options = Bf16PerBlock({"LayerNorm"});
  mingpt::GPT reference(c);
  const ShardingPlan plan =
      PlanSharding(reference, options.policy, kWorld, options.mixed_precision);
  const ShardingPlan unaware = PlanSharding(reference, options.policy, kWorld);
  ASSERT_EQ(unaware.units.size(), 1u + c.n_layer);
  // The root, each Block with its ln_1 and ln_2, then ln_f (pre-order).
  ASSERT_EQ(plan.units.size(), 1u + 3 * c.n_layer + 1);
  EXPECT_EQ(plan.units[0].fp32_numel, 0);
  for (int b = 0; b < c.n_layer; ++b) {
    const int block = 1 + 3 * b;
    EXPECT_EQ(plan.units[block].name, absl::StrCat("transformer.h.", b));
    EXPECT_EQ(plan.units[block].fp32_numel, 0) << b;
    EXPECT_EQ(plan.units[block].parent, 0) << b;
    for (int k : {1, 2}) {
      const ShardingPlan::Unit& ln = plan.units[block + k];
      EXPECT_EQ(ln.name, absl::StrCat("transformer.h.", b, ".ln_", k));
      EXPECT_EQ(ln.fp32_numel, 2 * c.n_embd);
      EXPECT_EQ(ln.numel, 2 * c.n_embd);
      EXPECT_EQ(ln.parent, block);
    }
  }
  EXPECT_EQ(plan.units.back().name, "transformer.ln_f");
  EXPECT_EQ(plan.units.back().parent, 0);
  // FullyShard makes the same units, with the same layouts.
  const Peaks measured = MeasurePeaks(c, kWorld, options, 2, false, [&](FullyShardedModel& fsdp) {
    ASSERT_EQ(fsdp.num_units(), static_cast<int>(plan.units.size()));
    for (int u = 0; u < fsdp.num_units(); ++u) {
      EXPECT_EQ(fsdp.unit_name(u), plan.units[u].name);
      EXPECT_EQ(fsdp.flat_param(u).shard_numel(), plan.units[u].shard_numel) << u;
    }
  });
  FsdpEstimateOptions estimate;
  estimate.param_bytes = 2;
  const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
  std::printf("bf16 with fp32 LayerNorm units: params %lld (estimate %lld), grads %lld "
              "(estimate %lld)\n",
              (long long)measured.params, (long long)b.unsharded_parameters_peak,
              (long long)measured.grads, (long long)b.unsharded_gradients_peak);
  EXPECT_GE(b.unsharded_parameters_peak, measured.params);
  EXPECT_GE(b.unsharded_gradients_peak, measured.grads);
  // fp32 compute: nothing is cast, no unit is added, the kept classes change nothing.
  precision::MixedPrecisionPolicy fp32 = precision::MixedPrecisionPolicy::Fp32();
  fp32.fp32_module_classes = {"LayerNorm"};
  EXPECT_EQ(PlanSharding(reference, options.policy, kWorld, fp32).units.size(), 1u + c.n_layer);
}

// The whole model gathered (FullyShardedModel::Unshard, as the train
// binaries' --sample_gather=model draws a sample): exactly every unit's
// gather in the compute dtype, as a forward holds it, fp32 and bf16 (with
// LayerNorm units kept fp32: their fp32 gather and the Blocks' bf16 ones);
// the same as SHARD_GRAD_OP's parameters peak.
TEST(FsdpPlanTest, TheWholeModelGatheredIsEstimatedExactly) {
  const mingpt::GptConfig c = testing::Small();
  constexpr int kWorld = 2;
  FsdpOptions fp32;
  fp32.policy = WrapPolicy::Transformer({"Block"});
  for (const FsdpOptions& options : {fp32, Bf16PerBlock({"LayerNorm"})}) {
    const bool bf16 = options.mixed_precision.IsMixed();
    SCOPED_TRACE(bf16 ? "bf16, LayerNorm kept fp32" : "fp32");
    mingpt::GPT reference(c);
    const ShardingPlan plan =
        PlanSharding(reference, options.policy, kWorld, options.mixed_precision);
    FsdpEstimateOptions estimate;
    estimate.param_bytes = bf16 ? 2 : 4;
    const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
    std::atomic<int64_t> measured{0};
    ThreadWorld threads(kWorld);
    absl::Status s = RunRanks(threads, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      auto fsdp = FullyShard(gpt, pg, options);
      const int64_t shards = fsdp->Memory(MemoryCategory::kParameters).current;
      threads.ledger(rank).ResetPeaks();
      // A sample's work: the whole model gathered, then forwards (in eval mode).
      gpt.Train(false);
      fsdp->Unshard();
      gpt.LastLogits(testing::RandomIds(1, c.block_size, c.vocab_size, 5));
      const int64_t held = fsdp->Memory(MemoryCategory::kParameters).peak - shards;
      if (rank == 0) measured = held;
      fsdp->Reshard();
      EXPECT_EQ(fsdp->Memory(MemoryCategory::kParameters).current, shards);
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_GT(measured.load(), 0);
    EXPECT_EQ(b.whole_model_parameters, measured.load());
    estimate.reshard_after_forward = false;
    EXPECT_EQ(EstimateFsdpRank(plan, estimate).unsharded_parameters_peak, measured.load());
  }
}

// bf16 compute with the root's class kept fp32: every parameter is kept, no
// unit is added, and every unit is gathered in fp32. The estimate counts 4
// bytes per element and equals the measured peak (the root, a Block in use
// and the next one's prefetched gather), where 2 bytes fall short.
TEST(FsdpPlanTest, UnitsKeptFp32UnderBf16AreEstimatedInFp32) {
  const mingpt::GptConfig c = testing::Small();
  constexpr int kWorld = 2;
  const FsdpOptions options = Bf16PerBlock({"GPT"});
  mingpt::GPT reference(c);
  const ShardingPlan plan =
      PlanSharding(reference, options.policy, kWorld, options.mixed_precision);
  const ShardingPlan unaware = PlanSharding(reference, options.policy, kWorld);
  ASSERT_EQ(plan.units.size(), 1u + c.n_layer);
  for (const ShardingPlan::Unit& u : plan.units) EXPECT_EQ(u.fp32_numel, u.numel) << u.name;
  const Peaks measured = MeasurePeaks(c, kWorld, options);
  FsdpEstimateOptions estimate;
  estimate.param_bytes = 2;
  const FsdpRankBytes b = EstimateFsdpRank(plan, estimate);
  const ShardingPlan::Unit& root = plan.units[0];
  const ShardingPlan::Unit& block = plan.units[1];
  EXPECT_EQ(b.unsharded_parameters_peak, 4 * (root.padded_numel + 2 * block.padded_numel));
  EXPECT_EQ(b.unsharded_parameters_peak, measured.params);
  EXPECT_LT(EstimateFsdpRank(unaware, estimate).unsharded_parameters_peak, measured.params);
}

}  // namespace
}  // namespace dist
