// Freezing: which names a pattern selects, FreezeParameters' errors, and that
// every layer's backward skips a frozen parameter's gradient while the input
// gradient and the other parameters' gradients stay the same, to the bit.
#include "nn/freeze.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/embedding.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/module_testing.h"
#include "nn/rms_norm.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::RandomTensor;

TEST(FreezePatternTest, NamesModulesAndGlobs) {
  EXPECT_TRUE(FreezePatternMatches("transformer.wte.weight", "transformer.wte.weight"));
  EXPECT_TRUE(FreezePatternMatches("transformer.h.0", "transformer.h.0.attn.c_attn.weight"));
  EXPECT_FALSE(FreezePatternMatches("transformer.h.1", "transformer.h.10.mlp.c_fc.bias"));
  EXPECT_FALSE(FreezePatternMatches("transformer.h", "transformer.hx.weight"));
  EXPECT_TRUE(FreezePatternMatches("transformer.h.[0-5].*", "transformer.h.3.ln_1.weight"));
  EXPECT_FALSE(FreezePatternMatches("transformer.h.[0-5].*", "transformer.h.6.ln_1.weight"));
  EXPECT_TRUE(FreezePatternMatches("*.bias", "transformer.h.3.ln_1.bias"));
  EXPECT_FALSE(FreezePatternMatches("*.bias", "transformer.h.3.ln_1.weight"));
  EXPECT_FALSE(FreezePatternMatches("", "weight"));
  EXPECT_FALSE(FreezePatternMatches("transformer.wte.weight.x", "transformer.wte.weight"));
}

TEST(FreezePatternTest, ParsesTheFlag) {
  EXPECT_TRUE(ParseFreezePatterns("").value().empty());
  EXPECT_TRUE(ParseFreezePatterns("  ").value().empty());
  EXPECT_EQ(ParseFreezePatterns(" a.b , c*").value(), (std::vector<std::string>{"a.b", "c*"}));
  absl::StatusOr<std::vector<std::string>> bad = ParseFreezePatterns("a,,b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--freeze='a,,b' has an empty pattern"), std::string::npos)
      << bad.status();
}

// Linear(4, 6) -> LayerNorm(6) -> RMSNorm(6) -> BatchNorm1d(6) -> Linear(6, 3),
// materialized from `seed` with random values.
std::unique_ptr<Sequential> Stack(uint64_t seed) {
  auto seq = std::make_unique<Sequential>();
  seq->Append(std::make_unique<Linear>(4, 6));
  seq->Append(std::make_unique<LayerNorm>(6));
  seq->Append(std::make_unique<RMSNorm>(6));
  seq->Append(std::make_unique<BatchNorm1d>(6));
  seq->Append(std::make_unique<Linear>(6, 3));
  seq->Materialize(seed);
  for (auto& [name, p] : seq->NamedParameters()) p->value = RandomTensor(p->shape, seed++, -1, 1);
  return seq;
}

TEST(FreezeParametersTest, ReturnsTheFrozenNamesAndCounts) {
  auto m = Stack(1);
  absl::StatusOr<std::vector<std::string>> frozen =
      FreezeParameters(*m, {"0.weight", "1", "*.bias"});
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  EXPECT_EQ(*frozen, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.bias",
                                               "4.bias"}));
  const TrainableCount count = CountTrainable(*m);
  EXPECT_EQ(count.total, 4 * 6 + 6 + 6 + 6 + 6 + 6 + 6 + 6 * 3 + 3);
  // Trainable: 2.weight (6), 3.weight (6), 4.weight (18).
  EXPECT_EQ(count.trainable, 6 + 6 + 18);
}

TEST(FreezeParametersTest, APatternThatSelectsNothingIsAnErrorAndFreezesNothing) {
  auto m = Stack(1);
  absl::StatusOr<std::vector<std::string>> frozen = FreezeParameters(*m, {"0", "transformer.wte"});
  ASSERT_FALSE(frozen.ok());
  EXPECT_EQ(frozen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(frozen.status().message().find("freeze pattern 'transformer.wte' selects no parameter"),
            std::string::npos)
      << frozen.status();
  EXPECT_NE(frozen.status().message().find("0.weight, 0.bias"), std::string::npos);
  for (auto& [name, p] : m->NamedParameters()) EXPECT_TRUE(p->requires_grad) << name;
}

TEST(FreezeParametersTest, AFrozenParameterRefusesAGradientBuffer) {
  Linear lin(2, 3);
  lin.Materialize(1);
  ASSERT_TRUE(FreezeParameters(lin, {"weight"}).ok());
  Parameter* w = lin.NamedParameters().at(0).second;
  try {
    w->GradBuffer();
    FAIL() << "expected an error";
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("frozen parameter"), std::string::npos) << e.what();
  }
}

// Runs forward and backward of `m` on x with output gradient gy; returns gx.
Tensor ForwardBackward(Module& m, const Tensor& x, const Tensor& gy) {
  m.ZeroGrad(/*set_to_none=*/true);
  Context ctx;
  m.Run(x, ctx);
  return m.RunBackward(gy, ctx);
}

// Every layer with parameters, frozen in several ways: the input gradient and
// the trainable parameters' gradients equal those of the unfrozen stack, and
// frozen parameters have none.
TEST(FreezeParametersTest, BackwardSkipsFrozenGradientsOnly) {
  const std::vector<std::vector<std::string>> cases = {
      {"0.weight"},     // a Linear's weight, its bias trains
      {"0.bias", "4"},  // a bias alone; a whole Linear
      {"1", "2"},       // LayerNorm and RMSNorm
      {"3.weight"},     // BatchNorm's weight, its bias trains
      {"*"},            // everything
  };
  const Tensor x = RandomTensor({5, 4}, 11, -1, 1);   // (N, 4)
  const Tensor gy = RandomTensor({5, 3}, 12, -1, 1);  // (N, 3)
  auto reference = Stack(7);
  const Tensor gx_want = ForwardBackward(*reference, x, gy);
  for (const auto& patterns : cases) {
    SCOPED_TRACE(patterns.front());
    auto m = Stack(7);
    ASSERT_TRUE(FreezeParameters(*m, patterns).ok());
    const Tensor gx = ForwardBackward(*m, x, gy);
    EXPECT_TRUE(AllClose(gx, gx_want, 0, 0));
    testing::ExpectTrainableGradsAndNoneFrozen(*m, *reference);
  }
}

// Only a weight's gradient reads a Linear's input: with the weight frozen the
// forward keeps none (the caller's x is freed when the caller drops it).
TEST(FreezeParametersTest, FrozenLinearKeepsNoInput) {
  for (bool frozen : {false, true}) {
    Linear lin(64, 32);
    lin.Materialize(1);
    if (frozen) {
      ASSERT_TRUE(FreezeParameters(lin, {"weight"}).ok());
    }
    tensor::MemoryLedger ledger;
    tensor::ScopedLedger scoped(&ledger);
    Context ctx;
    {
      const Tensor x = RandomTensor({16, 64}, 2, -1, 1);  // 4096 bytes
      lin.Run(x, ctx);
    }
    EXPECT_EQ(ledger.Total(tensor::Device::Cpu()).current, frozen ? 0 : 16 * 64 * 4);
    const Tensor gx = lin.RunBackward(RandomTensor({16, 32}, 3, -1, 1), ctx);
    EXPECT_EQ(gx.shape(), tensor::Shape({16, 64}));
  }
}

TEST(FreezeParametersTest, FrozenEmbeddingHasNoGradient) {
  Embedding emb(10, 4);
  emb.Materialize(3);
  ASSERT_TRUE(FreezeParameters(emb, {"weight"}).ok());
  Tensor ids = Tensor::Zeros({2, 3}, Dtype::kI32);
  Context ctx;
  emb.Run(ids, ctx);
  emb.RunBackward(RandomTensor({2, 3, 4}, 1, -1, 1), ctx);
  EXPECT_FALSE(emb.NamedParameters().at(0).second->grad.defined());
}

}  // namespace
}  // namespace nn
