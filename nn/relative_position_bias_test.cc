// RelativePositionBias: the bucket function against hand-computed tables (the
// Hugging Face / Mesh TF formula), the bias lookup, the scatter backward
// (by hand and by finite differences), bf16 and bad input.
#include "nn/relative_position_bias.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

struct BucketCase {
  int64_t relative_position;
  int64_t bucket;
};

// Bidirectional, 32 buckets, max_distance 128 (T5 encoder). Derivation:
// the sign splits the buckets, 16 each: keys before the query (rel < 0) use
// 0..15, keys after it (rel > 0) use 16..31 (offset 16). With n = |rel| and
// max_exact = 16 / 2 = 8: n < 8 is its own bucket; otherwise bucket
// 8 + trunc(ln(n / 8) / ln(128 / 8) * (16 - 8)) = 8 + trunc(2 log2(n / 8)),
// capped at 15.
//   -200: 8 + trunc(ln 25 / ln 16 * 8 = 3.2189 / 2.7726 * 8 = 9.29) = 17 -> cap 15
//    -91: 8 + trunc(ln 11.375 / ln 16 * 8 = 7.016) = 15
//    -90: 8 + trunc(ln 11.25 / ln 16 * 8 = 6.984) = 14
//    -64: 8 + trunc(ln 8 / ln 16 * 8 = 0.75 * 8 = 6) = 14
//    -46: 8 + trunc(ln 5.75 / ln 16 * 8 = 5.047) = 13
//    -45: 8 + trunc(ln 5.625 / ln 16 * 8 = 4.984) = 12
//    -32: 8 + trunc(2 log2 4 = 4) = 12
//    -16: 8 + trunc(2 log2 2 = 2) = 10
//    -12: 8 + trunc(2 log2 1.5 = 1.17) = 9
//    -11: 8 + trunc(2 log2 1.375 = 0.92) = 8
//    -10: 8 + trunc(ln 1.25 / ln 16 * 8 = 0.644) = 8
//     -8: 8 + trunc(ln 1 = 0) = 8
//     -7: exact, 7;  -1: exact, 1;  0: 0
//      1: 16 + 1 = 17;  7: 16 + 7 = 23;  8: 16 + 8 = 24;  10: 16 + 8 = 24
//     64: 16 + 14 = 30;  200: 16 + 15 = 31
TEST(RelativePositionBucketTest, BidirectionalMatchesHandComputedTable) {
  const std::vector<BucketCase> cases = {
      {-200, 15}, {-128, 15}, {-91, 15}, {-90, 14}, {-64, 14},    {-46, 13}, {-45, 12},
      {-32, 12},  {-16, 10},  {-12, 9},  {-11, 8},  {-10, 8},     {-8, 8},   {-7, 7},
      {-1, 1},    {0, 0},     {1, 17},   {7, 23},   {8, 24},      {10, 24},  {16, 26},
      {64, 30},   {90, 30},   {91, 31},  {200, 31}, {100000, 31},
  };
  for (const BucketCase& c : cases) {
    EXPECT_EQ(RelativePositionBucket(c.relative_position, /*bidirectional=*/true, 32, 128),
              c.bucket)
        << "relative position " << c.relative_position;
  }
}

// Unidirectional (T5 decoder self-attention), 32 buckets, max_distance 128:
// keys after the query (rel > 0) count as distance 0; n = -min(rel, 0) with
// max_exact = 32 / 2 = 16: n < 16 exact, else 16 + trunc(ln(n / 16) / ln 8 * 16),
// capped at 31.
//    -15: 15;  -16: 16 + 0 = 16
//    -20: 16 + trunc(ln 1.25 / ln 8 * 16 = 0.2231 / 2.0794 * 16 = 1.717) = 17
//    -64: 16 + trunc(ln 4 / ln 8 * 16 = 10.67) = 26
//   -100: 16 + trunc(ln 6.25 / ln 8 * 16 = 14.10) = 30
//   -127: 16 + trunc(ln 7.9375 / ln 8 * 16 = 15.94) = 31
//   -128: 16 + 16 = 32 -> cap 31;  -200: 31
//   0, 1, 200: distance 0 -> 0
TEST(RelativePositionBucketTest, UnidirectionalMatchesHandComputedTable) {
  const std::vector<BucketCase> cases = {
      {-200, 31}, {-128, 31}, {-127, 31}, {-100, 30}, {-64, 26}, {-20, 17},
      {-16, 16},  {-15, 15},  {-1, 1},    {0, 0},     {1, 0},    {200, 0},
  };
  for (const BucketCase& c : cases) {
    EXPECT_EQ(RelativePositionBucket(c.relative_position, /*bidirectional=*/false, 32, 128),
              c.bucket)
        << "relative position " << c.relative_position;
  }
}

TEST(RelativePositionBucketTest, OtherSizes) {
  // 8 buckets bidirectional, max_distance 20: 4 per side, max_exact 2;
  // n >= 2: 2 + trunc(ln(n / 2) / ln 10 * 2): n=4 -> 2 + trunc(0.602) = 2,
  // n=7 -> 2 + trunc(1.088) = 3, n=20 -> 2 + 2 = 4 -> cap 3.
  EXPECT_EQ(RelativePositionBucket(-1, true, 8, 20), 1);
  EXPECT_EQ(RelativePositionBucket(-4, true, 8, 20), 2);
  EXPECT_EQ(RelativePositionBucket(-7, true, 8, 20), 3);
  EXPECT_EQ(RelativePositionBucket(-20, true, 8, 20), 3);
  EXPECT_EQ(RelativePositionBucket(7, true, 8, 20), 7);
  EXPECT_THROW(RelativePositionBucket(1, true, 3, 20), tensor::OpError);  // odd, bidirectional
  EXPECT_THROW(RelativePositionBucket(1, true, 32, 8), tensor::OpError);  // max_distance <= 8
}

TEST(RelativePositionBiasTest, ForwardLooksUpBucketRowsPerHead) {
  RelativePositionBias rpb(/*n_heads=*/3, /*bidirectional=*/true);
  EXPECT_EQ(rpb.class_name(), "RelativePositionBias");
  ASSERT_EQ(rpb.NamedParameters().size(), 1u);
  EXPECT_EQ(rpb.NamedParameters()[0].first, "weight");
  EXPECT_EQ(rpb.weight()->shape, tensor::Shape({32, 3}));
  EXPECT_FALSE(rpb.weight()->weight_decay);
  rpb.Materialize(1);
  const std::vector<float> w = rpb.weight()->value.ToVector<float>();
  Context ctx;
  const int64_t t_q = 5, t_k = 70;
  Tensor bias = rpb.Run(t_q, t_k, ctx);
  ASSERT_EQ(bias.shape(), tensor::Shape({1, 3, t_q, t_k}));
  const std::vector<float> b = bias.ToVector<float>();
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t i = 0; i < t_q; ++i) {
      for (int64_t j = 0; j < t_k; ++j) {
        const int64_t bucket = RelativePositionBucket(j - i, true, 32, 128);
        ASSERT_EQ(b[(h * t_q + i) * t_k + j], w[bucket * 3 + h]) << h << " " << i << " " << j;
      }
    }
  }
  // Query offset: queries at positions 10.. see keys 0..; the first query's
  // relative positions are -10..-10 + t_k - 1.
  Tensor rel = RelativePositionBias::RelativePositions(2, 3, /*query_offset=*/10);
  EXPECT_EQ(rel.ToVector<int64_t>(), (std::vector<int64_t>{-10, -9, -8, -11, -10, -9}));
}

TEST(RelativePositionBiasTest, BackwardScattersIntoBuckets) {
  // Unidirectional, 4 buckets, max_distance 8 (max_exact 2): T = 3 gives
  // relative positions 0 (diagonal, and all keys after), -1, -2.
  RelativePositionBiasOptions opts;
  opts.n_buckets = 4;
  opts.max_distance = 8;
  RelativePositionBias rpb(/*n_heads=*/2, /*bidirectional=*/false, opts);
  rpb.Materialize(2);
  Context ctx;
  rpb.Run(3, 3, ctx);
  // grad[0, h, i, j] = 1 for head 0, 10 for head 1.
  std::vector<float> g(2 * 9);
  for (int i = 0; i < 9; ++i) {
    g[i] = 1.0f;
    g[9 + i] = 10.0f;
  }
  Tensors grads = rpb.RunBackward(Tensors{Tensor::FromVector(g, {1, 2, 3, 3})}, ctx);
  EXPECT_FALSE(grads.at(0).defined());
  // Bucket 0: rel >= 0, 6 pairs (i <= j); bucket 1: rel -1, 2 pairs; bucket
  // 2: rel -2 is 2 + trunc(ln 1 ...) = 2, 1 pair; bucket 3: none.
  EXPECT_EQ(rpb.weight()->grad.dtype(), Dtype::kF32);
  EXPECT_EQ(rpb.weight()->grad.ToVector<float>(), (std::vector<float>{6, 60, 2, 20, 1, 10, 0, 0}));
}

TEST(RelativePositionBiasTest, GradientMatchesFiniteDifferences) {
  for (bool bidirectional : {true, false}) {
    RelativePositionBiasOptions opts;
    opts.n_buckets = 8;
    opts.max_distance = 12;
    RelativePositionBias rpb(2, bidirectional, opts);
    rpb.Materialize(3);
    rpb.weight()->value = RandomTensor({8, 2}, 4);
    const Tensor w_out = RandomTensor({1, 2, 4, 9}, 5);
    auto loss = [&](const Tensor&) {
      Context c;
      return Dot(rpb.Run(4, 9, c, /*query_offset=*/3), w_out);
    };
    Context ctx;
    rpb.Run(4, 9, ctx, 3);
    rpb.ZeroGrad();
    rpb.RunBackward(Tensors{w_out}, ctx);
    EXPECT_TRUE(
        AllClose(rpb.weight()->grad, NumericalGradient(loss, rpb.weight()->value), 1e-3, 1e-2))
        << "bidirectional " << bidirectional;
  }
}

TEST(RelativePositionBiasTest, Bf16WeightsGiveBf16BiasAndFp32Grad) {
  RelativePositionBias rpb(2, true);
  rpb.Materialize(6);
  const Tensor w32 = rpb.weight()->value;
  rpb.weight()->value = w32.To(Dtype::kBF16);
  Context ctx;
  Tensor bias = rpb.Run(3, 4, ctx);
  EXPECT_EQ(bias.dtype(), Dtype::kBF16);
  const Tensor g = RandomTensor({1, 2, 3, 4}, 7);
  rpb.RunBackward(Tensors{g}, ctx);
  EXPECT_EQ(rpb.weight()->grad.dtype(), Dtype::kF32);
  // The same lookup in f32 agrees to bf16 rounding.
  RelativePositionBias ref(2, true);
  ref.Materialize(6);
  Context c2;
  EXPECT_TRUE(AllClose(bias, ref.Run(3, 4, c2), 1e-2, 1e-2));
  ref.RunBackward(Tensors{g}, c2);
  EXPECT_TRUE(AllClose(rpb.weight()->grad, ref.weight()->grad, 1e-6, 1e-6));
}

TEST(RelativePositionBiasTest, BadInputIsAClearError) {
  RelativePositionBias rpb(2, true);
  rpb.Materialize(1);
  Context ctx;
  try {
    rpb.Run(Tensors{Tensor::Zeros({2, 3})}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[relative_position_bias] relative positions must be (T_q, T_k) i32 or i64; got "
              "relative_positions (2,3) f32");
  }
  EXPECT_THROW(RelativePositionBias(2, true, {/*n_buckets=*/5}), tensor::OpError);
  rpb.Run(2, 2, ctx);
  EXPECT_THROW(rpb.RunBackward(Tensors{Tensor::Zeros({1, 2, 2, 3})}, ctx), tensor::OpError);
}

}  // namespace
}  // namespace nn
