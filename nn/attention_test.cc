// CausalSelfAttention: names and init, forward against plain loops, the
// causal property, gradients by finite differences (with and without
// dropout) for the input and every parameter, eval mode, the bf16 path and
// bad input.
#include "nn/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nn/attention_testing.h"
#include "nn/module_testing.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

// Random f32 weights and biases (so biases are not all zero).
void Randomize(CausalSelfAttention& attn, uint64_t seed) {
  attn.Materialize(seed);
  for (auto& [name, p] : attn.NamedParameters()) {
    p->value = RandomTensor(p->shape, seed++, -0.5f, 0.5f);
  }
}

// minGPT's forward by plain loops.
Tensor Reference(CausalSelfAttention& attn, const Tensor& x) {
  const int64_t c = attn.n_embd(), nh = attn.n_head();
  const Tensor qkv = testing::NaiveLinear(x, attn.c_attn()->weight()->value,
                                          attn.c_attn()->bias()->value);  // (B, T, 3C)
  const Tensor q = testing::NaiveSplitHeads(qkv.Narrow(2, 0, c).Contiguous(), nh);
  const Tensor k = testing::NaiveSplitHeads(qkv.Narrow(2, c, c).Contiguous(), nh);
  const Tensor v = testing::NaiveSplitHeads(qkv.Narrow(2, 2 * c, c).Contiguous(), nh);
  const Tensor y = testing::NaiveAttention(q, k, v, Tensor(), Tensor(),
                                           1.0 / std::sqrt(static_cast<double>(c / nh)), true);
  return testing::NaiveLinear(testing::NaiveMergeHeads(y), attn.c_proj()->weight()->value,
                              attn.c_proj()->bias()->value);
}

TEST(CausalSelfAttentionTest, NamesShapesAndInit) {
  CausalSelfAttentionOptions opts;
  opts.c_proj_init = MinGptProjInit(12);
  CausalSelfAttention attn(8, 2, 0.1f, 0.1f, opts);
  EXPECT_EQ(attn.class_name(), "CausalSelfAttention");
  std::vector<std::string> names;
  for (auto& [name, p] : attn.NamedParameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight",
                                             "c_proj.bias"}));
  EXPECT_EQ(attn.c_attn()->weight()->shape, tensor::Shape({24, 8}));
  EXPECT_EQ(attn.c_proj()->weight()->shape, tensor::Shape({8, 8}));
  EXPECT_EQ(attn.c_attn()->weight()->init.kind, InitSpec::Kind::kNormal);
  EXPECT_FLOAT_EQ(attn.c_attn()->weight()->init.b, 0.02f);
  EXPECT_FLOAT_EQ(attn.c_proj()->weight()->init.b, 0.02f / std::sqrt(24.0f));
  EXPECT_EQ(attn.NumParameters(), 24 * 8 + 24 + 8 * 8 + 8);
  // The materialized c_proj.weight has the smaller spread.
  attn.Materialize(3);
  const std::vector<float> w = attn.c_proj()->weight()->value.ToVector<float>();
  double ss = 0;
  for (float v : w) ss += static_cast<double>(v) * v;
  EXPECT_LT(std::sqrt(ss / w.size()), 0.02 / std::sqrt(24.0) * 1.6);
}

TEST(CausalSelfAttentionTest, ForwardMatchesPlainLoops) {
  for (auto [b, t, c, nh] : std::vector<std::array<int64_t, 4>>{{2, 5, 8, 2}, {2, 37, 32, 4}}) {
    CausalSelfAttention attn(c, nh, 0.0f, 0.0f);
    Randomize(attn, 1);
    const Tensor x = RandomTensor({b, t, c}, 2);
    Context ctx;
    const Tensor y = attn.Run(x, ctx);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_TRUE(AllClose(y, Reference(attn, x), 1e-5, 1e-4)) << "T " << t;
  }
}

TEST(CausalSelfAttentionTest, FutureTokensDoNotChangeThePast) {
  CausalSelfAttention attn(8, 2, 0.0f, 0.0f);
  Randomize(attn, 3);
  Tensor x = RandomTensor({1, 6, 8}, 4);
  Context c1, c2;
  const std::vector<float> y1 = attn.Run(x, c1).ToVector<float>();
  x.data<float>()[4 * 8 + 3] += 1.0f;  // token 4
  const std::vector<float> y2 = attn.Run(x, c2).ToVector<float>();
  for (int i = 0; i < 4 * 8; ++i) EXPECT_EQ(y1[i], y2[i]) << i;  // tokens 0..3 unchanged
  bool changed = false;
  for (int i = 4 * 8; i < 6 * 8; ++i) changed |= y1[i] != y2[i];
  EXPECT_TRUE(changed);
}

// Checks the input gradient and every parameter gradient of attn at x
// against finite differences of L = <attn(x), w>. Each forward restarts the
// dropout generator at 0, so every evaluation uses the same masks.
void CheckGradients(CausalSelfAttention& attn, const Tensor& x) {
  Context ctx;
  attn.generator().set_offset(0);
  const Tensor y = attn.Run(x, ctx);
  const Tensor w = RandomTensor(y.shape(), 99);
  auto loss = [&](const Tensor&) {
    attn.generator().set_offset(0);
    Context c;
    return Dot(attn.Run(x, c), w);
  };
  attn.ZeroGrad(/*set_to_none=*/true);
  const Tensor gx = attn.RunBackward(w, ctx);
  EXPECT_EQ(gx.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2)) << "x";
  for (auto& [name, p] : attn.NamedParameters()) {
    ASSERT_TRUE(p->grad.defined()) << name;
    EXPECT_EQ(p->grad.dtype(), Dtype::kF32) << name;
    EXPECT_TRUE(AllClose(p->grad, NumericalGradient(loss, p->value), 1e-3, 1e-2)) << name;
  }
}

TEST(CausalSelfAttentionTest, GradientsMatchFiniteDifferences) {
  CausalSelfAttention attn(8, 2, 0.0f, 0.0f);
  Randomize(attn, 5);
  CheckGradients(attn, RandomTensor({2, 4, 8}, 6));
}

TEST(CausalSelfAttentionTest, GradientsWithDropoutMatchFiniteDifferences) {
  CausalSelfAttention attn(8, 2, 0.3f, 0.2f, {MinGptProjInit(2), /*seed=*/17});
  Randomize(attn, 7);
  const Tensor x = RandomTensor({2, 4, 8}, 8);
  // Dropout is really on: the training output differs from eval's.
  Context c1, c2;
  attn.generator().set_offset(0);
  const Tensor y_train = attn.Run(x, c1);
  attn.Train(false);
  const Tensor y_eval = attn.Run(x, c2);
  attn.Train(true);
  EXPECT_FALSE(AllClose(y_train, y_eval, 1e-3, 1e-3));
  CheckGradients(attn, x);
}

// The residual as a second input: residual + the output, with gradients
// {x's, the output's} and the same parameter gradients; without residual
// dropout running it joins in c_proj's GEMM, with it (training, p > 0) it is
// added after the dropout, with the same masks.
TEST(CausalSelfAttentionTest, ResidualInputEqualsAddingTheOutput) {
  for (const auto& [resid_pdrop, train] :
       {std::pair{0.0f, true}, std::pair{0.2f, true}, std::pair{0.2f, false}}) {
    SCOPED_TRACE(::testing::Message() << "resid_pdrop " << resid_pdrop << (train ? "" : ", eval"));
    CausalSelfAttention a(8, 2, 0.1f, resid_pdrop, {MinGptProjInit(2), /*seed=*/17});
    CausalSelfAttention b(8, 2, 0.1f, resid_pdrop, {MinGptProjInit(2), /*seed=*/17});
    Randomize(a, 30);
    Randomize(b, 30);
    a.Train(train);
    b.Train(train);
    const Tensor x = RandomTensor({2, 4, 8}, 31), r = RandomTensor({2, 4, 8}, 32);
    const Tensor g = RandomTensor({2, 4, 8}, 33);
    Context ca, cb;
    const Tensor want = tensor::Add(r, a.Run(x, ca));
    const Tensor got = b.Run({x, r}, cb).at(0);
    EXPECT_TRUE(AllClose(got, want, 1e-6, 1e-6));
    const Tensor want_gx = a.RunBackward(g, ca);
    const Tensors got_grads = b.RunBackward(Tensors{g}, cb);
    ASSERT_EQ(got_grads.size(), 2u);
    EXPECT_TRUE(AllClose(got_grads[0], want_gx, 0, 0));
    EXPECT_TRUE(AllClose(got_grads[1], g, 0, 0));
    testing::ExpectSameParamGrads(b, a);
    // Both drew the same counters (the next masks stay in step).
    EXPECT_EQ(a.generator().offset(), b.generator().offset());
  }
}

TEST(CausalSelfAttentionTest, EvalModeIsDeterministicAndDropoutFree) {
  CausalSelfAttention with_drop(8, 2, 0.5f, 0.5f, {InitSpec::Normal(0, 0.02f), 3});
  CausalSelfAttention no_drop(8, 2, 0.0f, 0.0f);
  Randomize(with_drop, 9);
  Randomize(no_drop, 9);
  with_drop.Train(false);
  const Tensor x = RandomTensor({1, 5, 8}, 10);
  Context c1, c2;
  EXPECT_TRUE(AllClose(with_drop.Run(x, c1), no_drop.Run(x, c2), 0, 0));
  EXPECT_EQ(with_drop.generator().offset(), 0u);
  // In training, successive calls draw fresh masks.
  with_drop.Train(true);
  Context c3, c4;
  const Tensor a = with_drop.Run(x, c3);
  const Tensor b = with_drop.Run(x, c4);
  EXPECT_FALSE(AllClose(a, b, 1e-4, 1e-4));
}

TEST(CausalSelfAttentionTest, GradientsAccumulateOverCalls) {
  CausalSelfAttention attn(8, 2, 0.0f, 0.0f);
  Randomize(attn, 11);
  const Tensor x = RandomTensor({1, 3, 8}, 12);
  const Tensor g = RandomTensor({1, 3, 8}, 13);
  Context ctx;
  attn.Run(x, ctx);
  attn.RunBackward(g, ctx);
  const Tensor first = attn.c_attn()->weight()->grad.Clone();
  attn.Run(x, ctx);
  attn.RunBackward(g, ctx);
  EXPECT_TRUE(AllClose(attn.c_attn()->weight()->grad, tensor::Scale(first, 2.0), 1e-5, 1e-5));
}

TEST(CausalSelfAttentionTest, Bf16WeightsStayCloseToF32WithFp32Gradients) {
  CausalSelfAttention ref(32, 4, 0.0f, 0.0f), low(32, 4, 0.0f, 0.0f);
  Randomize(ref, 14);
  Randomize(low, 14);
  for (auto& [name, p] : low.NamedParameters()) p->value = p->value.To(Dtype::kBF16);
  const Tensor x = RandomTensor({2, 16, 32}, 15);
  const Tensor g = RandomTensor({2, 16, 32}, 16);
  Context c1, c2;
  const Tensor y_ref = ref.Run(x, c1);
  const Tensor y_low = low.Run(x, c2);  // f32 input cast to bf16
  EXPECT_EQ(y_low.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(y_low, y_ref, 3e-2, 3e-2));
  const Tensor gx_ref = ref.RunBackward(g, c1);
  const Tensor gx_low = low.RunBackward(g, c2);
  EXPECT_EQ(gx_low.dtype(), Dtype::kF32);  // the caller's dtype
  EXPECT_TRUE(AllClose(gx_low, gx_ref, 5e-2, 5e-2));
  auto ref_params = ref.NamedParameters();
  auto low_params = low.NamedParameters();
  for (size_t i = 0; i < ref_params.size(); ++i) {
    const std::string& name = ref_params[i].first;
    EXPECT_EQ(low_params[i].second->grad.dtype(), Dtype::kF32) << name;
    // bf16 rounding of activations: compare relative to the gradient's scale.
    const Tensor& gr = ref_params[i].second->grad;
    double scale = 0;
    for (float v : gr.ToVector<float>()) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    EXPECT_TRUE(AllClose(low_params[i].second->grad, gr, 3e-2 * scale, 3e-2)) << name;
  }
  // bf16 input too: the input gradient comes back bf16.
  Context c3;
  low.Run(x.To(Dtype::kBF16), c3);
  EXPECT_EQ(low.RunBackward(g, c3).dtype(), Dtype::kBF16);
}

TEST(CausalSelfAttentionTest, BadInputIsAClearError) {
  CausalSelfAttention attn(8, 2, 0.0f, 0.0f);
  attn.Materialize(1);
  Context ctx;
  try {
    attn.Run(Tensor::Zeros({2, 3, 6}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[causal_self_attention] input (2,3,6) is not (B, T, C) with C = n_embd 8");
  }
  EXPECT_THROW(attn.Run(Tensor::Zeros({3, 8}), ctx), tensor::OpError);
  EXPECT_THROW(CausalSelfAttention(10, 3, 0.0f, 0.0f), tensor::OpError);
  EXPECT_THROW(CausalSelfAttention(8, 2, 1.5f, 0.0f), tensor::OpError);
  attn.Run(Tensor::Zeros({2, 3, 8}), ctx);
  EXPECT_THROW(attn.RunBackward(Tensor::Zeros({2, 4, 8}), ctx), tensor::OpError);
}

}  // namespace
}  // namespace nn
