// The shared attention core: forward against a plain-loop reference and
// gradients by finite differences for q, k, v (strided views) and the bias,
// across masks (causal with T_q <, =, > T_k, key padding, fully masked rows),
// scale with bias, dropout, bf16 and bad shapes.
#include "nn/attention_core.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/attention_testing.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;
using testing::NaiveAttention;

struct Case {
  std::string name;
  int64_t b, nh, t_q, t_k, hs;
  float scale;
  bool causal;
  int bias_batch;           // 0: no bias, else its leading dim (1 or b)
  std::vector<float> mask;  // (b, t_k) or empty
};

// q, k, v as strided (B, nh, T, hs) views of contiguous (B, T, nh, hs)
// tensors, as the layers produce them.
struct Inputs {
  Tensor q_base, k_base, v_base;  // (B, T, nh, hs), contiguous f32
  Tensor q, k, v;                 // (B, nh, T, hs) views
  Tensor bias, mask;
};

Inputs MakeInputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.q_base = RandomTensor({c.b, c.t_q, c.nh, c.hs}, seed, -1.5f, 1.5f);
  in.k_base = RandomTensor({c.b, c.t_k, c.nh, c.hs}, seed + 1, -1.5f, 1.5f);
  in.v_base = RandomTensor({c.b, c.t_k, c.nh, c.hs}, seed + 2);
  in.q = in.q_base.Transpose(1, 2);
  in.k = in.k_base.Transpose(1, 2);
  in.v = in.v_base.Transpose(1, 2);
  if (c.bias_batch > 0) in.bias = RandomTensor({c.bias_batch, c.nh, c.t_q, c.t_k}, seed + 3);
  if (!c.mask.empty()) in.mask = Tensor::FromVector(c.mask, {c.b, c.t_k});
  return in;
}

std::vector<Case> Cases() {
  return {
      {"causal_square", 2, 2, 4, 4, 3, 0.5f, true, 0, {}},
      {"causal_fewer_queries", 1, 2, 3, 5, 2, 1.0f, true, 0, {}},
      {"causal_more_queries", 1, 2, 5, 3, 2, 1.0f, true, 0, {}},  // first rows see no key
      {"scaled_bias_mask", 2, 2, 3, 4, 2, 0.7f, false, 1, {1, 0, 1, 1, 0, 1, 1, 0}},
      {"batched_bias_dead_batch", 2, 3, 3, 2, 2, 1.0f, false, 2, {0, 0, 1, 1}},
      {"causal_mask_bias", 2, 1, 4, 4, 3, 1.0f, true, 2, {0, 1, 1, 1, 1, 1, 0, 1}},
  };
}

AttentionOptions Options(const Case& c) {
  AttentionOptions o;
  o.scale = c.scale;
  o.causal = c.causal;
  return o;
}

TEST(AttentionCoreTest, ForwardMatchesPlainLoops) {
  for (const Case& c : Cases()) {
    Inputs in = MakeInputs(c, 10);
    tensor::Generator gen(1);
    AttentionState st;
    Tensor y = AttentionForward(in.q, in.k, in.v, in.bias, in.mask, Options(c), gen, &st);
    EXPECT_EQ(y.shape(), tensor::Shape({c.b, c.nh, c.t_q, c.hs})) << c.name;
    EXPECT_TRUE(AllClose(y, NaiveAttention(in.q, in.k, in.v, in.bias, in.mask, c.scale, c.causal),
                         1e-5, 1e-4))
        << c.name;
    // Saved q, k, v are the caller's views (no copies).
    EXPECT_TRUE(st.q.SharesStorageWith(in.q_base)) << c.name;
    EXPECT_TRUE(st.v.SharesStorageWith(in.v_base)) << c.name;
  }
}

TEST(AttentionCoreTest, GradientsMatchFiniteDifferences) {
  for (const Case& c : Cases()) {
    Inputs in = MakeInputs(c, 20);
    const Tensor w = RandomTensor({c.b, c.nh, c.t_q, c.hs}, 30);
    auto loss = [&](const Tensor&) {
      tensor::Generator gen(1);
      AttentionState st;
      return Dot(AttentionForward(in.q, in.k, in.v, in.bias, in.mask, Options(c), gen, &st), w);
    };
    tensor::Generator gen(1);
    AttentionState st;
    AttentionForward(in.q, in.k, in.v, in.bias, in.mask, Options(c), gen, &st);
    AttentionGrads g = AttentionBackward(w, st);
    // Gradients are (B, nh, T, hs); the perturbed bases are (B, T, nh, hs).
    EXPECT_TRUE(AllClose(g.dq.Transpose(1, 2), NumericalGradient(loss, in.q_base), 1e-3, 1e-2))
        << c.name;
    EXPECT_TRUE(AllClose(g.dk.Transpose(1, 2), NumericalGradient(loss, in.k_base), 1e-3, 1e-2))
        << c.name;
    EXPECT_TRUE(AllClose(g.dv.Transpose(1, 2), NumericalGradient(loss, in.v_base), 1e-3, 1e-2))
        << c.name;
    if (in.bias.defined()) {
      ASSERT_TRUE(g.dbias.defined());
      EXPECT_EQ(g.dbias.shape(), in.bias.shape());
      EXPECT_TRUE(AllClose(g.dbias, NumericalGradient(loss, in.bias), 1e-3, 1e-2)) << c.name;
    } else {
      EXPECT_FALSE(g.dbias.defined());
    }
  }
}

TEST(AttentionCoreTest, FullyMaskedRowsGiveZerosNotNan) {
  const Case c = Cases()[4];  // batch 0 has every key masked
  Inputs in = MakeInputs(c, 40);
  tensor::Generator gen(1);
  AttentionState st;
  Tensor y = AttentionForward(in.q, in.k, in.v, in.bias, in.mask, Options(c), gen, &st);
  const std::vector<float> vy = y.ToVector<float>();
  const int64_t per_batch = c.nh * c.t_q * c.hs;
  for (int64_t i = 0; i < static_cast<int64_t>(vy.size()); ++i) {
    ASSERT_FALSE(std::isnan(vy[i])) << i;
    if (i < per_batch) {
      EXPECT_EQ(vy[i], 0.0f) << i;
    }
  }
  EXPECT_NE(vy[per_batch], 0.0f);
  AttentionGrads g = AttentionBackward(Tensor::Full(y.shape(), 1.0), st);
  const std::vector<float> dq = g.dq.ToVector<float>();
  for (int64_t i = 0; i < per_batch; ++i) EXPECT_EQ(dq[i], 0.0f);
  for (float v : g.dbias.ToVector<float>()) EXPECT_FALSE(std::isnan(v));
}

TEST(AttentionCoreTest, DropoutUsesOneMaskForForwardAndBackward) {
  const Case c = Cases()[3];
  Inputs in = MakeInputs(c, 50);
  AttentionOptions o = Options(c);
  o.dropout = 0.4f;
  tensor::Generator gen(7);
  AttentionState st;
  Tensor y = AttentionForward(in.q, in.k, in.v, in.bias, in.mask, o, gen, &st);
  ASSERT_TRUE(st.dropout.active);
  EXPECT_GT(gen.offset(), 0u);
  // Reference: dropout's mask applied to the reference probabilities
  // (attention with v = identity rows gives the probabilities themselves).
  Tensor eye_base = Tensor::Zeros({c.b, c.t_k, c.nh, c.t_k});
  {
    float* p = eye_base.data<float>();
    for (int64_t b = 0; b < c.b; ++b) {
      for (int64_t j = 0; j < c.t_k; ++j) {
        for (int64_t h = 0; h < c.nh; ++h) p[((b * c.t_k + j) * c.nh + h) * c.t_k + j] = 1.0f;
      }
    }
  }
  const Tensor probs =
      NaiveAttention(in.q, in.k, eye_base.Transpose(1, 2), in.bias, in.mask, c.scale, false);
  const Tensor mask = tensor::DropoutMask(probs.shape(), st.dropout).To(Dtype::kF32);
  const Tensor dropped = tensor::Scale(tensor::Mul(probs, mask), 1.0 / 0.6);
  // y = dropped @ v, by plain loops.
  std::vector<float> ref(c.b * c.nh * c.t_q * c.hs, 0.0f);
  const std::vector<float> vd = dropped.ToVector<float>();
  const std::vector<float> vv = in.v.ToVector<float>();
  for (int64_t r = 0; r < c.b * c.nh; ++r) {
    for (int64_t i = 0; i < c.t_q; ++i) {
      for (int64_t d = 0; d < c.hs; ++d) {
        for (int64_t j = 0; j < c.t_k; ++j) {
          ref[(r * c.t_q + i) * c.hs + d] +=
              vd[(r * c.t_q + i) * c.t_k + j] * vv[(r * c.t_k + j) * c.hs + d];
        }
      }
    }
  }
  EXPECT_TRUE(AllClose(y, Tensor::FromVector(ref, y.shape()), 1e-5, 1e-4));

  // Gradients by finite differences, replaying the same mask.
  const Tensor w = RandomTensor(y.shape(), 51);
  auto loss = [&](const Tensor&) {
    tensor::Generator g2(7);
    AttentionState s2;
    return Dot(AttentionForward(in.q, in.k, in.v, in.bias, in.mask, o, g2, &s2), w);
  };
  AttentionGrads g = AttentionBackward(w, st);
  EXPECT_TRUE(AllClose(g.dq.Transpose(1, 2), NumericalGradient(loss, in.q_base), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(g.dv.Transpose(1, 2), NumericalGradient(loss, in.v_base), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(g.dbias, NumericalGradient(loss, in.bias), 1e-3, 1e-2));

  // Eval mode: no dropout, the generator untouched.
  o.training = false;
  tensor::Generator gen_eval(7);
  AttentionState s3;
  Tensor y_eval = AttentionForward(in.q, in.k, in.v, in.bias, in.mask, o, gen_eval, &s3);
  EXPECT_EQ(gen_eval.offset(), 0u);
  EXPECT_TRUE(AllClose(y_eval, NaiveAttention(in.q, in.k, in.v, in.bias, in.mask, c.scale, false),
                       1e-5, 1e-4));
}

TEST(AttentionCoreTest, Bf16InputsStayCloseToF32) {
  const Case c{"bf16", 2, 2, 6, 6, 4, 0.5f, true, 1, {}};
  Inputs in = MakeInputs(c, 60);
  tensor::Generator gen(1);
  AttentionState s32, s16;
  Tensor y32 = AttentionForward(in.q, in.k, in.v, in.bias, in.mask, Options(c), gen, &s32);
  Tensor q16 = in.q_base.To(Dtype::kBF16).Transpose(1, 2);
  Tensor k16 = in.k_base.To(Dtype::kBF16).Transpose(1, 2);
  Tensor v16 = in.v_base.To(Dtype::kBF16).Transpose(1, 2);
  Tensor y16 = AttentionForward(q16, k16, v16, in.bias, in.mask, Options(c), gen, &s16);
  EXPECT_EQ(y16.dtype(), Dtype::kBF16);
  EXPECT_EQ(s16.probs.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(y16, y32, 3e-2, 3e-2));
  const Tensor w = RandomTensor(y32.shape(), 61);
  AttentionGrads g32 = AttentionBackward(w, s32);
  AttentionGrads g16 = AttentionBackward(w, s16);  // f32 grad_y converted to bf16
  EXPECT_EQ(g16.dq.dtype(), Dtype::kBF16);
  EXPECT_EQ(g16.dbias.dtype(), Dtype::kF32);  // the bias's dtype
  EXPECT_TRUE(AllClose(g16.dq, g32.dq, 5e-2, 5e-2));
  EXPECT_TRUE(AllClose(g16.dk, g32.dk, 5e-2, 5e-2));
  EXPECT_TRUE(AllClose(g16.dv, g32.dv, 5e-2, 5e-2));
  EXPECT_TRUE(AllClose(g16.dbias, g32.dbias, 5e-2, 5e-2));
}

TEST(AttentionCoreTest, BadShapesAreClearErrors) {
  const Case c = Cases()[3];
  Inputs in = MakeInputs(c, 70);
  AttentionOptions o = Options(c);
  o.op = "my_attention";
  tensor::Generator gen(1);
  AttentionState st;
  try {
    AttentionForward(in.q, in.k, in.v, Tensor::Zeros({1, 2, 3, 3}), Tensor(), o, gen, &st);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[my_attention] position bias (1,2,3,3) must be (2 or 1, 2, 3, 4) for scores "
              "(2,2,3,4)");
  }
  EXPECT_THROW(AttentionForward(in.q, in.k, in.v, Tensor(), Tensor::Full({2, 3}, 1.0), o, gen, &st),
               tensor::OpError);
  EXPECT_THROW(AttentionForward(in.q, in.q, in.v, Tensor(), Tensor(), o, gen, &st),
               tensor::OpError);  // v has T_k rows, k has T_q
  // A scale of 0 or below would turn masked scores (-inf) into NaN or +inf;
  // with or without a key mask or a bias, it is refused alike.
  for (float scale : {0.0f, -0.5f, std::nanf(""), HUGE_VALF}) {
    o.scale = scale;
    for (const Tensor& mask : {Tensor(), Tensor::Full({2, 4}, 1.0)}) {
      for (const Tensor& bias : {Tensor(), Tensor::Zeros({1, 2, 3, 4})}) {
        try {
          AttentionForward(in.q, in.k, in.v, bias, mask, o, gen, &st);
          ADD_FAILURE() << "scale " << scale << " was taken";
        } catch (const tensor::OpError& e) {
          EXPECT_NE(std::string(e.what()).find(
                        "[my_attention] scale must be a positive finite number; got "),
                    std::string::npos)
              << e.what();
        }
      }
    }
  }
}

// Beam search's reordering: row i takes row rows[i]'s positions, sources
// repeated or themselves moved ({2, 0, 0, 1}: a chain through staged copies);
// appends after it land on the new rows; bad rows are named.
TEST(AttentionCoreTest, SelectKvCacheRowsReordersHeldPositions) {
  const int64_t B = 4, nh = 2, cap = 6, hs = 3, n = 4;
  KvCache cache;
  std::vector<float> values(B * nh * n * hs);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const Tensor kv = Tensor::FromData<float>(values, {B, nh, n, hs});
  AppendToKvCache(cache, kv, tensor::Scale(kv, -1.0f), cap, "test");
  const std::vector<int64_t> rows = {2, 0, 0, 1};
  SelectKvCacheRows(cache, rows, "test");
  ASSERT_EQ(cache.length, n);
  for (int64_t i = 0; i < B; ++i) {
    const Tensor want = kv.Narrow(0, rows[i], 1);
    EXPECT_TRUE(tensor::testing::AllClose(cache.k.Narrow(0, i, 1).Narrow(2, 0, n), want, 0, 0))
        << "row " << i;
    EXPECT_TRUE(tensor::testing::AllClose(cache.v.Narrow(0, i, 1).Narrow(2, 0, n),
                                          tensor::Scale(want, -1.0f), 0, 0))
        << "row " << i;
  }
  const Tensor one = Tensor::Full({B, nh, 1, hs}, 7.0f, tensor::Dtype::kF32);
  AppendToKvCache(cache, one, one, cap, "test");
  EXPECT_EQ(cache.length, n + 1);
  EXPECT_TRUE(tensor::testing::AllClose(cache.k.Narrow(2, n, 1), one, 0, 0));
  for (const auto& [bad, message] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{0, 1, 2}, "[test] 3 rows for a cache of 4"},
           {{0, 1, 4, 2}, "[test] row 4 of a cache of 4"}}) {
    try {
      SelectKvCacheRows(cache, bad, "test");
      FAIL() << message;
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

TEST(AttentionCoreTest, SplitAndMergeHeads) {
  Tensor qkv = RandomTensor({2, 3, 12}, 80);
  Tensor k = SplitHeads(qkv.Narrow(2, 4, 4), 2);  // (2, 2, 3, 2), a view
  EXPECT_TRUE(k.SharesStorageWith(qkv));
  EXPECT_TRUE(AllClose(k, testing::NaiveSplitHeads(qkv.Narrow(2, 4, 4).Contiguous(), 2), 0, 0));
  EXPECT_TRUE(AllClose(MergeHeads(k), qkv.Narrow(2, 4, 4), 0, 0));
  EXPECT_THROW(SplitHeads(qkv, 5), tensor::OpError);
}

}  // namespace
}  // namespace nn
