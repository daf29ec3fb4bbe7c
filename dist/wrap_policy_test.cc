// Wrap policies on a tiny minGPT: the transformer policy (by block class;
// one matching nothing is refused, also by FullyShard on two ranks), None,
// size-based (bottom-up, nesting), the outermost match, and frozen leaves
// taken out into units of their own; under mixed precision, modules of the
// classes kept fp32 as units of their own.
#include "dist/wrap_policy.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/freeze.h"
#include "nn/linear.h"
#include "precision/policy.h"
#include "tensor/error.h"

namespace dist {
namespace {

using namespace dist::testing;  // NOLINT: the shared fixtures (Tiny())

std::vector<std::string> UnitNames(const std::vector<UnitPlan>& plans) {
  std::vector<std::string> names;
  for (auto& p : plans) names.push_back(p.name);
  return names;
}

TEST(WrapPolicyTest, TransformerPolicyWrapsBlocksAndTheRootKeepsTheRest) {
  mingpt::GPT gpt(Tiny());
  auto plans = PlanUnits(gpt, WrapPolicy::Transformer({"Block", "T5Block"}));
  EXPECT_EQ(UnitNames(plans),
            (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1"}));
  std::vector<std::string> root_params;
  for (auto& [n, p] : plans[0].params) root_params.push_back(n);
  EXPECT_EQ(root_params, (std::vector<std::string>{"transformer.wte.weight", "transformer.wpe.weight",
                                                   "transformer.ln_f.weight", "transformer.ln_f.bias",
                                                   "lm_head.weight"}));
  ASSERT_FALSE(plans[1].params.empty());
  EXPECT_EQ(plans[1].params[0].first, "transformer.h.0.ln_1.weight");
  int64_t total = 0;
  for (auto& plan : plans)
    for (auto& [n, p] : plan.params) total += p->numel();
  EXPECT_EQ(total, gpt.NumParameters());
}

// A transformer policy whose block classes the model lacks (a misspelt
// name) is refused, naming the classes the model has, where it would have
// left the whole model in one unit; one of several names is enough.
TEST(WrapPolicyTest, ATransformerPolicyMatchingNoModuleIsRefused) {
  mingpt::GPT gpt(Tiny());
  EXPECT_TRUE(WrapPolicy::Transformer({"Block", "T5Block"}).CheckMatches(gpt).ok());
  EXPECT_TRUE(WrapPolicy::SizeBased(1 << 30).CheckMatches(gpt).ok());
  // The root's own class does not count: the root is a unit whatever it is.
  EXPECT_FALSE(WrapPolicy::Transformer({"GPT"}).CheckMatches(gpt).ok());
  const absl::Status s = WrapPolicy::Transformer({"block"}).CheckMatches(gpt);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "block classes {block} match no module of the "
                                             "model (its classes: Block, "))
      << s;
  // Kept by FrozenLeavesApart, which wraps the policy; checked by FullyShard.
  const WrapPolicy apart = WrapPolicy::FrozenLeavesApart(WrapPolicy::Transformer({"block"}));
  EXPECT_FALSE(apart.CheckMatches(gpt).ok());
  absl::Status run = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT model(Tiny());
    FsdpOptions options;
    options.policy = apart;
    try {
      auto fsdp = FullyShard(model, pg, options);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const tensor::OpError& e) {
      EXPECT_TRUE(absl::StartsWith(e.what(), "[FullyShard] the transformer wrap policy's block "
                                             "classes {block} match no module"))
          << e.what();
    }
  });
  EXPECT_TRUE(run.ok()) << run;
}

// Frozen leaf modules outside the policy's units get units of their own
// (wte and a frozen ln_f; not wpe, which trains, nor the frozen Block's
// layers, which stay in its unit); a kept parameter stays in the root; with
// None every frozen leaf is a unit; with a size-based policy the frozen
// leaves it leaves in the root (not those inside its units).
TEST(WrapPolicyTest, FrozenLeavesApartTakesFrozenLeavesOutOfEnclosingUnits) {
  mingpt::GPT gpt(Tiny());
  ASSERT_TRUE(nn::FreezeParameters(gpt, {"transformer.wte", "transformer.ln_f", "transformer.h.1"})
                  .ok());
  const WrapPolicy blocks = WrapPolicy::Transformer({"Block"});
  auto plans = PlanUnits(gpt, WrapPolicy::FrozenLeavesApart(blocks));
  EXPECT_EQ(UnitNames(plans),
            (std::vector<std::string>{"", "transformer.wte", "transformer.h.0", "transformer.h.1",
                                      "transformer.ln_f"}));
  std::vector<std::string> root_params;
  for (auto& [n, p] : plans[0].params) root_params.push_back(n);
  EXPECT_EQ(root_params,
            (std::vector<std::string>{"transformer.wpe.weight", "lm_head.weight"}));
  const nn::Parameter* wte = gpt.NamedParameters().at(0).second;
  plans = PlanUnits(gpt, WrapPolicy::FrozenLeavesApart(blocks, {wte}));
  EXPECT_EQ(UnitNames(plans), (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1",
                                                        "transformer.ln_f"}));
  plans = PlanUnits(gpt, WrapPolicy::FrozenLeavesApart(WrapPolicy::None()));
  EXPECT_EQ(plans.size(), 1u + 1u + 6u + 1u);  // root, wte, h.1's 6 layers, ln_f
  // Size-based: its units stay (nested ones too), and the frozen leaves it
  // left in the root get units of their own, in pre-order.
  const WrapPolicy size = WrapPolicy::SizeBased(300);
  EXPECT_EQ(UnitNames(PlanUnits(gpt, size)),
            (std::vector<std::string>{"", "transformer.h.0", "transformer.h.0.mlp",
                                      "transformer.h.1", "transformer.h.1.mlp"}));
  plans = PlanUnits(gpt, WrapPolicy::FrozenLeavesApart(size));
  EXPECT_EQ(UnitNames(plans),
            (std::vector<std::string>{"", "transformer.wte", "transformer.h.0",
                                      "transformer.h.0.mlp", "transformer.h.1",
                                      "transformer.h.1.mlp", "transformer.ln_f"}));
  root_params.clear();
  for (auto& [n, p] : plans[0].params) root_params.push_back(n);
  EXPECT_EQ(root_params,
            (std::vector<std::string>{"transformer.wpe.weight", "lm_head.weight"}));
}

// Under bf16 every LayerNorm kept fp32 becomes a unit of its own nested in
// its Block's unit (ln_f in the root's), so the Blocks hold no kept parameter
// and gather and reduce in bf16; fp32 compute adds no unit.
TEST(WrapPolicyTest, ForMixedPrecisionNestsModulesKeptFp32) {
  mingpt::GPT gpt(Tiny());
  precision::MixedPrecisionPolicy bf16 = precision::MixedPrecisionPolicy::Bf16();
  bf16.fp32_module_classes = {"LayerNorm"};
  const WrapPolicy blocks = WrapPolicy::Transformer({"Block"});
  const auto plans = PlanUnits(gpt, blocks.ForMixedPrecision(bf16));
  EXPECT_EQ(UnitNames(plans),
            (std::vector<std::string>{"", "transformer.h.0", "transformer.h.0.ln_1",
                                      "transformer.h.0.ln_2", "transformer.h.1",
                                      "transformer.h.1.ln_1", "transformer.h.1.ln_2",
                                      "transformer.ln_f"}));
  for (const auto& [name, p] : plans[1].params) {
    EXPECT_FALSE(absl::StrContains(name, ".ln_")) << name;
  }
  EXPECT_EQ(plans[2].params.size(), 2u);  // ln_1's weight and bias
  // Either the compute or the reduction in bf16 is enough; fp32 throughout adds nothing.
  precision::MixedPrecisionPolicy reduce_only = precision::MixedPrecisionPolicy::Fp32();
  reduce_only.reduce_dtype = tensor::Dtype::kBF16;
  reduce_only.fp32_module_classes = {"LayerNorm"};
  EXPECT_EQ(PlanUnits(gpt, blocks.ForMixedPrecision(reduce_only)).size(), plans.size());
  precision::MixedPrecisionPolicy compute_only = bf16;
  compute_only.reduce_dtype = tensor::Dtype::kF32;
  EXPECT_EQ(PlanUnits(gpt, blocks.ForMixedPrecision(compute_only)).size(), plans.size());
  precision::MixedPrecisionPolicy fp32 = precision::MixedPrecisionPolicy::Fp32();
  fp32.fp32_module_classes = {"LayerNorm"};
  EXPECT_EQ(UnitNames(PlanUnits(gpt, blocks.ForMixedPrecision(fp32))),
            UnitNames(PlanUnits(gpt, blocks)));
  // A kept ModuleList (never called, so never a unit): its Blocks in its place.
  precision::MixedPrecisionPolicy list = bf16;
  list.fp32_module_classes = {"ModuleList"};
  EXPECT_EQ(UnitNames(PlanUnits(gpt, WrapPolicy::None().ForMixedPrecision(list))),
            (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1"}));
}

// The outermost module of a kept class holding a parameter becomes a unit
// (none without parameters, none inside another kept one, none under a root
// of a kept class), wherever it is; units the base policy selects inside a
// kept module stay units.
TEST(WrapPolicyTest, ForMixedPrecisionWrapsTheOutermostKeptModulesWithParameters) {
  // Linear, BatchNorm, BatchNorm without affine, Residual(Linear, BatchNorm).
  nn::Sequential net;
  net.Append(std::make_unique<nn::Linear>(4, 4));
  net.Append(std::make_unique<nn::BatchNorm1d>(4));
  nn::BatchNorm1dOptions plain;
  plain.affine = false;
  net.Append(std::make_unique<nn::BatchNorm1d>(4, plain));
  auto inner = std::make_unique<nn::Sequential>();
  inner->Append(std::make_unique<nn::Linear>(4, 4));
  inner->Append(std::make_unique<nn::BatchNorm1d>(4));
  net.Append(std::make_unique<nn::Residual>(std::move(inner)));
  const precision::MixedPrecisionPolicy bf16 = precision::MixedPrecisionPolicy::Bf16();
  ASSERT_EQ(bf16.fp32_module_classes, std::vector<std::string>{"BatchNorm1d"});
  EXPECT_EQ(UnitNames(PlanUnits(net, WrapPolicy::None().ForMixedPrecision(bf16))),
            (std::vector<std::string>{"", "1", "3.fn.1"}));
  // A kept Residual "3" holds its BatchNorm; the predicate's Linear "3.fn.0"
  // inside it stays a unit of its own.
  precision::MixedPrecisionPolicy residual = bf16;
  residual.fp32_module_classes = {"Residual", "BatchNorm1d"};
  const WrapPolicy inner_linear = WrapPolicy::FromPredicate(
      [](const std::string& name, nn::Module&) { return name == "3.fn.0"; });
  EXPECT_EQ(UnitNames(PlanUnits(net, inner_linear.ForMixedPrecision(residual))),
            (std::vector<std::string>{"", "1", "3", "3.fn.0"}));
  // A frozen leaf inside a kept module stays there (FrozenLeavesApart takes
  // frozen leaves out of the root unit only).
  for (auto& [name, p] : net.NamedParameters()) {
    if (absl::StartsWith(name, "3.fn.0.")) p->requires_grad = false;
  }
  const WrapPolicy frozen_apart = WrapPolicy::FrozenLeavesApart(WrapPolicy::None());
  EXPECT_EQ(UnitNames(PlanUnits(net, frozen_apart.ForMixedPrecision(residual))),
            (std::vector<std::string>{"", "1", "3"}));
  for (auto& [name, p] : net.NamedParameters()) p->requires_grad = true;
  // A root of a kept class: every parameter is kept fp32 already.
  precision::MixedPrecisionPolicy sequential = residual;
  sequential.fp32_module_classes = {"Sequential", "BatchNorm1d"};
  EXPECT_EQ(UnitNames(PlanUnits(net, inner_linear.ForMixedPrecision(sequential))),
            (std::vector<std::string>{"", "3.fn.0"}));
  // fp32 compute and reduction undo an earlier bf16 call.
  EXPECT_EQ(UnitNames(PlanUnits(net, WrapPolicy::None().ForMixedPrecision(bf16).ForMixedPrecision(
                                         precision::MixedPrecisionPolicy::Fp32()))),
            std::vector<std::string>{""});
}

// Size-based: a kept module is a unit already, so its parameters do not make
// its parent reach min_params (as PyTorch wraps it first); a container of
// kept modules only is no unit (it would be an empty one).
TEST(WrapPolicyTest, ForMixedPrecisionSizeBasedCountsKeptModulesAsUnits) {
  // [Linear(4, 4): 20, BatchNorm(4): 8], [BatchNorm(4), BatchNorm(4)], Linear(4, 4).
  nn::Sequential net;
  auto mixed = std::make_unique<nn::Sequential>();
  mixed->Append(std::make_unique<nn::Linear>(4, 4));
  mixed->Append(std::make_unique<nn::BatchNorm1d>(4));
  net.Append(std::move(mixed));
  auto norms = std::make_unique<nn::Sequential>();
  norms->Append(std::make_unique<nn::BatchNorm1d>(4));
  norms->Append(std::make_unique<nn::BatchNorm1d>(4));
  net.Append(std::move(norms));
  net.Append(std::make_unique<nn::Linear>(4, 4));
  const WrapPolicy size = WrapPolicy::SizeBased(21);
  EXPECT_EQ(UnitNames(PlanUnits(net, size)), (std::vector<std::string>{"", "0"}));
  EXPECT_EQ(UnitNames(PlanUnits(
                net, size.ForMixedPrecision(precision::MixedPrecisionPolicy::Bf16()))),
            (std::vector<std::string>{"", "0.1", "1.0", "1.1"}));
  // Units below a kept module stay: with min_params 16 the Linear inside a
  // kept Residual "0" is a unit of its own, nested in "0" (which is then
  // empty: FullyShard drops it).
  precision::MixedPrecisionPolicy residual = precision::MixedPrecisionPolicy::Bf16();
  residual.fp32_module_classes = {"Residual"};
  nn::Sequential outer;
  auto inner = std::make_unique<nn::Sequential>();
  inner->Append(std::make_unique<nn::Linear>(4, 4));
  outer.Append(std::make_unique<nn::Residual>(std::move(inner)));
  outer.Append(std::make_unique<nn::Linear>(4, 4));
  EXPECT_EQ(UnitNames(PlanUnits(outer, WrapPolicy::SizeBased(16).ForMixedPrecision(residual))),
            (std::vector<std::string>{"", "0", "0.fn.0", "1"}));
}

TEST(WrapPolicyTest, NoneIsOneRootUnitWithEveryParameterInOrder) {
  mingpt::GPT gpt(Tiny());
  auto plans = PlanUnits(gpt, WrapPolicy::None());
  ASSERT_EQ(plans.size(), 1u);
  auto all = gpt.NamedParameters();
  ASSERT_EQ(plans[0].params.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(plans[0].params[i].first, all[i].first);
}

TEST(WrapPolicyTest, OutermostMatchWins) {
  mingpt::GPT gpt(Tiny());
  // "Transformer" contains the Blocks: only it is wrapped.
  auto plans = PlanUnits(gpt, WrapPolicy::Transformer({"Transformer", "Block"}));
  EXPECT_EQ(UnitNames(plans), (std::vector<std::string>{"", "transformer"}));
  EXPECT_EQ(plans[0].params.size(), 1u);  // lm_head.weight
  auto by_name = PlanUnits(gpt, WrapPolicy::FromPredicate([](const std::string& name, nn::Module&) {
    return name == "transformer.h.1";
  }));
  EXPECT_EQ(UnitNames(by_name), (std::vector<std::string>{"", "transformer.h.1"}));
}

TEST(WrapPolicyTest, SizeBasedIsBottomUpAndMayNest) {
  const mingpt::GptConfig c = Tiny();
  mingpt::GPT gpt(c);
  // A block's size: every block is a unit, nothing inside one is big enough.
  const int64_t per_block = mingpt::CountParameters(c).per_block;
  EXPECT_EQ(UnitNames(PlanUnits(gpt, WrapPolicy::SizeBased(per_block))),
            (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1"}));
  // n_embd 8: mlp = 288 + 264 = 552 params, attn 288, a block 872. 500: the
  // MLPs; the rest of a block (320) stays below; the ModuleList "h" (640 left)
  // is never wrapped (it is never called), so "transformer" gets 640 + 152.
  EXPECT_EQ(UnitNames(PlanUnits(gpt, WrapPolicy::SizeBased(500))),
            (std::vector<std::string>{"", "transformer", "transformer.h.0.mlp",
                                      "transformer.h.1.mlp"}));
  // 300: the MLPs, then each block with its remaining 320 (nested units).
  EXPECT_EQ(UnitNames(PlanUnits(gpt, WrapPolicy::SizeBased(300))),
            (std::vector<std::string>{"", "transformer.h.0", "transformer.h.0.mlp",
                                      "transformer.h.1", "transformer.h.1.mlp"}));
}

}  // namespace
}  // namespace dist
