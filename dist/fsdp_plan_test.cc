// PlanSharding: the layouts equal FullyShard's own, and a gpt-175b plan at
// 1024 ranks is built without allocating any parameter.
#include "dist/fsdp_plan.h"

#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace {

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

}  // namespace
}  // namespace dist
