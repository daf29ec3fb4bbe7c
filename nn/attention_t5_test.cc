// T5Attention: names and init, forward against plain loops (encoder, causal
// decoder and cross-attention, with position bias and key padding masks),
// gradients by finite differences for x, the encoder output, the position bias
// and every parameter (own relative bias included), fully masked rows,
// dropout, bf16 and bad input.
#include "nn/attention_t5.h"

#include <algorithm>
#include <cmath>
#include <string>
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

constexpr int64_t kModel = 6, kHeads = 2, kKv = 4;

void Randomize(T5Attention& attn, uint64_t seed) {
  attn.Materialize(seed);
  for (auto& [name, p] : attn.NamedParameters()) {
    p->value = RandomTensor(p->shape, seed++, -0.6f, 0.6f);
  }
}

// T5 attention by plain loops; bias is the total additive bias (undefined for none).
Tensor Reference(T5Attention& attn, const Tensor& x, const Tensor& kv, const Tensor& bias,
                 const Tensor& mask) {
  const Tensor src = kv.defined() ? kv : x;
  const int64_t nh = attn.n_heads();
  const Tensor q =
      testing::NaiveSplitHeads(testing::NaiveLinear(x, attn.q()->weight()->value, {}), nh);
  const Tensor k =
      testing::NaiveSplitHeads(testing::NaiveLinear(src, attn.k()->weight()->value, {}), nh);
  const Tensor v =
      testing::NaiveSplitHeads(testing::NaiveLinear(src, attn.v()->weight()->value, {}), nh);
  const Tensor y =
      testing::NaiveAttention(q, k, v, bias, mask, /*scale=*/1.0, attn.options().causal);
  return testing::NaiveLinear(testing::NaiveMergeHeads(y), attn.o()->weight()->value, {});
}

T5AttentionOptions Opts(bool has_bias, bool causal, bool cross, float dropout = 0.0f) {
  T5AttentionOptions o;
  o.has_relative_bias = has_bias;
  o.causal = causal;
  o.cross_attention = cross;
  o.dropout = dropout;
  o.relative_attention_num_buckets = 8;
  o.relative_attention_max_distance = 16;
  o.seed = 5;
  return o;
}

TEST(T5AttentionTest, NamesShapesAndInit) {
  T5AttentionOptions o;
  o.has_relative_bias = true;
  T5Attention attn(512, 8, 64, o);
  EXPECT_EQ(attn.class_name(), "T5Attention");
  std::vector<std::string> names;
  for (auto& [name, p] : attn.NamedParameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"q.weight", "k.weight", "v.weight", "o.weight",
                                             "relative_attention_bias.weight"}));
  EXPECT_EQ(attn.q()->weight()->shape, tensor::Shape({512, 512}));
  EXPECT_EQ(attn.o()->weight()->shape, tensor::Shape({512, 512}));
  EXPECT_EQ(attn.q()->bias(), nullptr);
  EXPECT_EQ(attn.relative_attention_bias()->weight()->shape, tensor::Shape({32, 8}));
  EXPECT_TRUE(attn.relative_attention_bias()->bidirectional());
  // Hugging Face's _init_weights for T5Attention (factor 1).
  EXPECT_FLOAT_EQ(attn.q()->weight()->init.b, 1.0f / std::sqrt(512.0f * 64.0f));
  EXPECT_FLOAT_EQ(attn.k()->weight()->init.b, 1.0f / std::sqrt(512.0f));
  EXPECT_FLOAT_EQ(attn.v()->weight()->init.b, 1.0f / std::sqrt(512.0f));
  EXPECT_FLOAT_EQ(attn.o()->weight()->init.b, 1.0f / std::sqrt(8.0f * 64.0f));
  EXPECT_FLOAT_EQ(attn.relative_attention_bias()->weight()->init.b, 1.0f / std::sqrt(512.0f));

  T5AttentionOptions dec = o;
  dec.causal = true;
  EXPECT_FALSE(T5Attention(16, 2, 8, dec).relative_attention_bias()->bidirectional());
  T5AttentionOptions cross;
  cross.cross_attention = true;
  T5Attention ca(16, 2, 8, cross);
  EXPECT_EQ(ca.relative_attention_bias(), nullptr);
  EXPECT_EQ(ca.NamedParameters().size(), 4u);
}

TEST(T5AttentionTest, ForwardMatchesPlainLoops) {
  const Tensor x = RandomTensor({2, 5, kModel}, 1);
  const Tensor enc = RandomTensor({2, 3, kModel}, 2);
  const Tensor mask5 = Tensor::FromVector({1, 1, 0, 1, 1, 1, 1, 1, 1, 0}, {2, 5}, Dtype::kU8);
  const Tensor mask3 = Tensor::FromVector({1, 0, 1, 1, 1, 1}, {2, 3}, Dtype::kI64);
  {  // Encoder self-attention with a shared position bias and padding.
    T5Attention attn(kModel, kHeads, kKv, Opts(false, false, false));
    Randomize(attn, 3);
    const Tensor bias = RandomTensor({1, kHeads, 5, 5}, 4);
    Context ctx;
    Tensors out = attn.Run(Tensors{x, Tensor(), bias, mask5}, ctx);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(AllClose(out[0], Reference(attn, x, Tensor(), bias, mask5), 1e-5, 1e-4));
  }
  {  // Decoder self-attention with its own relative bias, returned as output 1.
    T5Attention attn(kModel, kHeads, kKv, Opts(true, true, false));
    Randomize(attn, 5);
    Context ctx;
    Tensors out = attn.Run(Tensors{x}, ctx);
    ASSERT_EQ(out.size(), 2u);
    Context c2;
    const Tensor bias = attn.relative_attention_bias()->Run(5, 5, c2);  // (1, nh, 5, 5)
    EXPECT_TRUE(AllClose(out[1], bias, 0, 0));
    EXPECT_TRUE(AllClose(out[0], Reference(attn, x, Tensor(), bias, Tensor()), 1e-5, 1e-4));
  }
  {  // Cross-attention with a per-batch bias and encoder padding.
    T5Attention attn(kModel, kHeads, kKv, Opts(false, false, true));
    Randomize(attn, 7);
    const Tensor bias = RandomTensor({2, kHeads, 5, 3}, 8);
    Context ctx;
    Tensors out = attn.Run(Tensors{x, enc, bias, mask3}, ctx);
    EXPECT_EQ(out[0].shape(), x.shape());
    EXPECT_TRUE(AllClose(out[0], Reference(attn, x, enc, bias, mask3), 1e-5, 1e-4));
  }
}

// Checks every gradient of L = <y, w_y> (+ <bias_out, w_b> for layers that
// return their bias) against finite differences. inputs[i] for i in
// `check_inputs` must be contiguous f32.
void CheckGradients(T5Attention& attn, const Tensors& inputs,
                    const std::vector<size_t>& check_inputs) {
  Context ctx;
  attn.generator().set_offset(0);
  const Tensors out = attn.Run(inputs, ctx);
  const Tensor w_y = RandomTensor(out[0].shape(), 91);
  const Tensor w_b = out.size() > 1 ? RandomTensor(out[1].shape(), 92) : Tensor();
  auto loss = [&](const Tensor&) {
    attn.generator().set_offset(0);
    Context c;
    const Tensors o = attn.Run(inputs, c);
    return Dot(o[0], w_y) + (o.size() > 1 ? Dot(o[1], w_b) : 0.0);
  };
  attn.ZeroGrad(/*set_to_none=*/true);
  Tensors grad_out = {w_y};
  if (w_b.defined()) grad_out.push_back(w_b);
  const Tensors grads = attn.RunBackward(grad_out, ctx);
  ASSERT_EQ(grads.size(), inputs.size());
  for (size_t i : check_inputs) {
    ASSERT_TRUE(grads[i].defined()) << "input " << i;
    EXPECT_EQ(grads[i].dtype(), inputs[i].dtype()) << "input " << i;
    EXPECT_TRUE(AllClose(grads[i], NumericalGradient(loss, inputs[i]), 1e-3, 1e-2))
        << "input " << i;
  }
  for (auto& [name, p] : attn.NamedParameters()) {
    ASSERT_TRUE(p->grad.defined()) << name;
    EXPECT_EQ(p->grad.dtype(), Dtype::kF32) << name;
    EXPECT_TRUE(AllClose(p->grad, NumericalGradient(loss, p->value), 1e-3, 1e-2)) << name;
  }
}

TEST(T5AttentionTest, EncoderSelfAttentionGradients) {
  T5Attention attn(kModel, kHeads, kKv, Opts(false, false, false));
  Randomize(attn, 11);
  const Tensor x = RandomTensor({2, 4, kModel}, 12);
  const Tensor bias = RandomTensor({1, kHeads, 4, 4}, 13);
  const Tensor mask = Tensor::FromVector({1, 1, 1, 0, 0, 1, 1, 1}, {2, 4});
  CheckGradients(attn, {x, Tensor(), bias, mask}, {0, 2});
}

// The residual input (slot 4): residual + the output, added in o's GEMM; the
// other gradients and the parameters' as without it, the residual's = grad_y.
TEST(T5AttentionTest, ResidualInputEqualsAddingTheOutput) {
  T5Attention a(kModel, kHeads, kKv, Opts(true, true, false)),
      b(kModel, kHeads, kKv, Opts(true, true, false));
  Randomize(a, 40);
  Randomize(b, 40);
  const Tensor x = RandomTensor({2, 4, kModel}, 41), r = RandomTensor({2, 4, kModel}, 42);
  const Tensor g = RandomTensor({2, 4, kModel}, 43);
  Context ca, cb;
  const Tensors want = a.Run(Tensors{x}, ca);
  const Tensors got = b.Run(Tensors{x, Tensor(), Tensor(), Tensor(), r}, cb);
  ASSERT_EQ(got.size(), 2u);  // y and the relative bias
  EXPECT_TRUE(AllClose(got[0], tensor::Add(r, want[0]), 1e-6, 1e-6));
  EXPECT_TRUE(AllClose(got[1], want[1], 0, 0));
  const Tensors want_grads = a.RunBackward(Tensors{g, Tensor()}, ca);
  const Tensors got_grads = b.RunBackward(Tensors{g, Tensor()}, cb);
  ASSERT_EQ(got_grads.size(), 5u);
  EXPECT_TRUE(AllClose(got_grads[0], want_grads[0], 0, 0));
  EXPECT_TRUE(AllClose(got_grads[4], g, 0, 0));
  testing::ExpectSameParamGrads(b, a);
  Context bad;
  EXPECT_THROW(
      b.Run(Tensors{x, Tensor(), Tensor(), Tensor(), RandomTensor({2, 3, kModel}, 44)}, bad),
      tensor::OpError);
}

TEST(T5AttentionTest, DecoderSelfAttentionWithOwnRelativeBiasGradients) {
  T5Attention attn(kModel, kHeads, kKv, Opts(true, true, false));
  Randomize(attn, 14);
  CheckGradients(attn, {RandomTensor({2, 5, kModel}, 15)}, {0});
  // Without the returned bias's gradient (no other layer used it).
  Context ctx;
  const Tensor x = RandomTensor({1, 3, kModel}, 16);
  const Tensors out = attn.Run(Tensors{x}, ctx);
  attn.ZeroGrad();
  const Tensors grads = attn.RunBackward(Tensors{RandomTensor(out[0].shape(), 17), Tensor()}, ctx);
  EXPECT_EQ(grads.size(), 1u);
  EXPECT_TRUE(grads[0].defined());
}

TEST(T5AttentionTest, CrossAttentionGradientsWithMaskAndBias) {
  T5Attention attn(kModel, kHeads, kKv, Opts(false, false, true));
  Randomize(attn, 18);
  const Tensor x = RandomTensor({2, 3, kModel}, 19);
  const Tensor enc = RandomTensor({2, 4, kModel}, 20);
  const Tensor bias = RandomTensor({2, kHeads, 3, 4}, 21);
  const Tensor mask = Tensor::FromVector({1, 0, 1, 1, 1, 1, 0, 0}, {2, 4}, Dtype::kI32);
  CheckGradients(attn, {x, enc, bias, mask}, {0, 1, 2});
}

TEST(T5AttentionTest, FullyMaskedEncoderRowGivesZerosAndFiniteGradients) {
  T5Attention attn(kModel, kHeads, kKv, Opts(false, false, true));
  Randomize(attn, 22);
  const Tensor x = RandomTensor({2, 3, kModel}, 23);
  const Tensor enc = RandomTensor({2, 4, kModel}, 24);
  const Tensor mask = Tensor::FromVector({0, 0, 0, 0, 1, 1, 1, 0}, {2, 4});  // batch 0: all pad
  Context ctx;
  const Tensor y = attn.Run(Tensors{x, enc, Tensor(), mask}, ctx)[0];
  const std::vector<float> vy = y.ToVector<float>();
  for (size_t i = 0; i < vy.size(); ++i) {
    ASSERT_FALSE(std::isnan(vy[i])) << i;
    if (i < 3 * kModel) {
      EXPECT_EQ(vy[i], 0.0f) << i;  // no bias in o: exactly 0
    }
  }
  EXPECT_TRUE(AllClose(y, Reference(attn, x, enc, Tensor(), mask), 1e-5, 1e-4));
  CheckGradients(attn, {x, enc, Tensor(), mask}, {0, 1});
}

TEST(T5AttentionTest, DropoutGradientsMatchFiniteDifferences) {
  T5Attention attn(kModel, kHeads, kKv, Opts(true, false, false, /*dropout=*/0.3f));
  Randomize(attn, 25);
  const Tensor x = RandomTensor({2, 4, kModel}, 26);
  Context c1, c2;
  const Tensor y_train = attn.Run(Tensors{x}, c1)[0];
  attn.Train(false);
  const Tensor y_eval = attn.Run(Tensors{x}, c2)[0];
  attn.Train(true);
  EXPECT_FALSE(AllClose(y_train, y_eval, 1e-3, 1e-3));
  CheckGradients(attn, {x}, {0});
}

TEST(T5AttentionTest, Bf16WeightsStayCloseToF32WithFp32Gradients) {
  T5Attention ref(32, 4, 8, Opts(false, false, true)), low(32, 4, 8, Opts(false, false, true));
  Randomize(ref, 27);
  Randomize(low, 27);
  for (auto& [name, p] : low.NamedParameters()) p->value = p->value.To(Dtype::kBF16);
  const Tensor x = RandomTensor({2, 6, 32}, 28, -0.5f, 0.5f);
  const Tensor enc = RandomTensor({2, 7, 32}, 29, -0.5f, 0.5f);
  const Tensor bias = RandomTensor({1, 4, 6, 7}, 30);
  const Tensor g = RandomTensor({2, 6, 32}, 31);
  Context c1, c2;
  const Tensor y_ref = ref.Run(Tensors{x, enc, bias}, c1)[0];
  const Tensor y_low = low.Run(Tensors{x, enc, bias}, c2)[0];
  EXPECT_EQ(y_low.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(y_low, y_ref, 3e-2, 3e-2));
  const Tensors g_ref = ref.RunBackward(Tensors{g}, c1);
  const Tensors g_low = low.RunBackward(Tensors{g}, c2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(g_low[i].dtype(), Dtype::kF32) << i;  // the callers' dtypes
    EXPECT_TRUE(AllClose(g_low[i], g_ref[i], 5e-2, 5e-2)) << i;
  }
  auto rp = ref.NamedParameters();
  auto lp = low.NamedParameters();
  for (size_t i = 0; i < rp.size(); ++i) {
    EXPECT_EQ(lp[i].second->grad.dtype(), Dtype::kF32) << rp[i].first;
    double scale = 0;
    for (float v : rp[i].second->grad.ToVector<float>()) {
      scale = std::max(scale, std::fabs(static_cast<double>(v)));
    }
    EXPECT_TRUE(AllClose(lp[i].second->grad, rp[i].second->grad, 3e-2 * scale, 3e-2))
        << rp[i].first;
  }
}

TEST(T5AttentionTest, BadInputIsAClearError) {
  T5Attention self(kModel, kHeads, kKv, Opts(false, false, false));
  T5Attention cross(kModel, kHeads, kKv, Opts(false, false, true));
  T5Attention with_bias(kModel, kHeads, kKv, Opts(true, false, false));
  self.Materialize(1);
  cross.Materialize(2);
  with_bias.Materialize(3);
  const Tensor x = Tensor::Zeros({2, 3, kModel});
  const Tensor enc = Tensor::Zeros({2, 4, kModel});
  Context ctx;
  try {
    self.Run(Tensors{x, Tensor(), Tensor::Zeros({1, kHeads, 3, 4})}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[t5_attention] position bias (1,2,3,4) must be (2 or 1, 2, 3, 3) for scores "
              "(2,2,3,3)");
  }
  try {
    cross.Run(Tensors{x}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[t5_attention] cross-attention needs kv (B, S, d_model) for x (2,3,6); got "
              "undefined");
  }
  EXPECT_THROW(self.Run(Tensors{x, enc}, ctx), tensor::OpError);
  EXPECT_THROW(self.Run(Tensors{Tensor::Zeros({2, 3, 5})}, ctx), tensor::OpError);
  EXPECT_THROW(cross.Run(Tensors{x, enc, Tensor(), Tensor::Zeros({2, 3})}, ctx), tensor::OpError);
  EXPECT_THROW(with_bias.Run(Tensors{x, Tensor(), Tensor::Zeros({1, kHeads, 3, 3})}, ctx),
               tensor::OpError);
  EXPECT_THROW(T5Attention(kModel, kHeads, kKv, Opts(false, true, true)), tensor::OpError);
  EXPECT_THROW(T5Attention(kModel, kHeads, kKv, Opts(true, false, true)), tensor::OpError);
  self.Run(Tensors{x}, ctx);
  EXPECT_THROW(
      self.RunBackward(Tensors{Tensor::Zeros({2, 3, kModel}), Tensor::Zeros({1, 2, 3, 3})}, ctx),
      tensor::OpError);  // no bias was returned
}

}  // namespace
}  // namespace nn
