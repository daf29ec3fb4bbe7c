// Tests of Dropout / DropoutBackward / DropoutMask: keep rate and scaling, the
// documented Philox mask, reproducibility from (seed, offset), the backward
// reusing the forward's mask (for one tensor or two at once), identity and
// p == 1 cases, and errors.
#include "tensor/ops/dropout.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using testing::AllClose;
using testing::Dot;
using testing::NumericalGradient;
using testing::RandomTensor;

// The mask as documented in dropout.h, element by element.
std::vector<uint8_t> ReferenceMask(int64_t n, float p, uint64_t seed, uint64_t offset) {
  Generator gen(seed);
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = gen.Bits(offset + i / 4)[i % 4];
    mask[i] = UniformFromBits(word) >= p;
  }
  return mask;
}

TEST(DropoutTest, KeepsAboutOneMinusPAndScalesKeptValues) {
  const int64_t n = 200003;
  const Tensor x = RandomTensor({n}, 1, 0.5f, 1.5f);
  const std::vector<float> xv = x.ToVector<float>();
  for (float p : {0.1f, 0.5f, 0.9f}) {
    Generator gen(42);
    const DropoutResult res = Dropout(x, p, gen);
    ASSERT_TRUE(res.state.active);
    const std::vector<float> y = res.y.ToVector<float>();
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0;
    double sum_x = 0, sum_y = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (y[i] != 0.0f) {
        ++kept;
        ASSERT_EQ(y[i], xv[i] * scale) << i;
      }
      sum_x += xv[i];
      sum_y += y[i];
    }
    const double frac = static_cast<double>(kept) / n;
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(frac, 1 - p, 5 * sigma) << p;
    // The expected value is preserved (inverted dropout).
    EXPECT_NEAR(sum_y / n, sum_x / n, 0.02 * sum_x / n) << p;
  }
}

TEST(DropoutTest, MaskFollowsTheDocumentedPhiloxDefinition) {
  const Tensor x = Tensor::Full({3, 37}, 1.0);
  Generator gen(7, 1000);
  const DropoutResult res = Dropout(x, 0.3f, gen);
  EXPECT_EQ(res.state.seed, 7u);
  EXPECT_EQ(res.state.offset, 1000u);
  EXPECT_EQ(gen.offset(), 1000u + (3 * 37 + 3) / 4);  // ceil(numel / 4) counters reserved
  const std::vector<uint8_t> ref = ReferenceMask(3 * 37, 0.3f, 7, 1000);
  EXPECT_EQ(DropoutMask(x.shape(), res.state).ToVector<uint8_t>(), ref);
  const std::vector<float> y = res.y.ToVector<float>();
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(y[i], ref[i] ? static_cast<float>(1.0 / 0.7) : 0.0f) << i;
  }
  // Seeds with high bits, counters crossing 2^32, several sizes and rates.
  const uint64_t seeds[] = {0, 0x123456789abcdefull, ~0ull};
  const uint64_t offsets[] = {0, 0xfffffff0ull, 0xfffffffffffffff0ull};
  for (uint64_t seed : seeds) {
    for (uint64_t offset : offsets) {
      for (int64_t n : {1, 31, 32, 33, 1000}) {
        Generator g(seed, offset);
        const DropoutResult r = Dropout(Tensor::Full({n}, 1.0), 0.6f, g);
        EXPECT_EQ(DropoutMask({n}, r.state).ToVector<uint8_t>(),
                  ReferenceMask(n, 0.6f, seed, offset))
            << seed << " " << offset << " " << n;
      }
    }
  }
}

TEST(DropoutTest, SameSeedAndOffsetGiveTheSameMask) {
  const Tensor x = RandomTensor({64, 33}, 2);
  Generator a(5), b(5);
  const DropoutResult ra = Dropout(x, 0.5f, a);
  const DropoutResult rb = Dropout(x, 0.5f, b);
  EXPECT_TRUE(AllClose(ra.y, rb.y, 0, 0));
  // The generator moved on: the next call draws another mask.
  const DropoutResult rc = Dropout(x, 0.5f, a);
  EXPECT_NE(rc.state.offset, ra.state.offset);
  EXPECT_FALSE(AllClose(rc.y, ra.y, 0, 0));
  // Element i depends only on (seed, offset + i): a prefix of a bigger tensor
  // gets the same decisions, whatever the split into threads.
  DropoutState big = ra.state;
  big.numel = 10 * x.numel();
  const std::vector<uint8_t> long_mask = DropoutMask({10 * x.numel()}, big).ToVector<uint8_t>();
  const std::vector<uint8_t> short_mask = DropoutMask(x.shape(), ra.state).ToVector<uint8_t>();
  EXPECT_TRUE(std::equal(short_mask.begin(), short_mask.end(), long_mask.begin()));
}

TEST(DropoutTest, BackwardUsesTheForwardMask) {
  const Tensor x = RandomTensor({5, 29}, 3);
  const Tensor g = RandomTensor({5, 29}, 4);
  Generator gen(11);
  const DropoutResult res = Dropout(x, 0.4f, gen);
  const Tensor gx = DropoutBackward(g, res.state);
  const std::vector<uint8_t> mask = DropoutMask(x.shape(), res.state).ToVector<uint8_t>();
  const std::vector<float> gv = g.ToVector<float>(), gxv = gx.ToVector<float>();
  const float scale = static_cast<float>(1.0 / 0.6);
  for (size_t i = 0; i < gv.size(); ++i) EXPECT_EQ(gxv[i], mask[i] ? gv[i] * scale : 0.0f) << i;
  // And against finite differences, replaying the same (seed, offset).
  Tensor xx = x.Clone();
  const Tensor w = RandomTensor({5, 29}, 5);
  auto loss = [&](const Tensor& t) {
    Generator replay(res.state.seed, res.state.offset);
    return Dot(Dropout(t, 0.4f, replay).y, w);
  };
  EXPECT_TRUE(AllClose(DropoutBackward(w, res.state), NumericalGradient(loss, xx), 1e-3, 1e-3));
}

// The two tensors' backwards with one generation of the mask: bit for bit
// DropoutBackward of each, whatever their dtypes and layouts, over sizes
// that end inside a block and inside a vector; inactive and p == 1 states
// too.
TEST(DropoutTest, BackwardOfBothIsBackwardOfEach) {
  for (int64_t cols : {29, 64, 3}) {
    const Tensor x = RandomTensor({7, cols}, 12);
    Generator gen(13);
    const DropoutResult res = Dropout(x, 0.3f, gen);
    const Tensor a = RandomTensor({7, cols}, 14).To(Dtype::kBF16);
    const Tensor b = RandomTensor({cols, 7}, 15).Transpose(0, 1);  // (7, cols), strided
    const auto [ga, gb] = DropoutBackwardOfBoth(a, b, res.state);
    EXPECT_EQ(ga.dtype(), Dtype::kBF16);
    EXPECT_EQ(gb.dtype(), Dtype::kF32);
    EXPECT_TRUE(AllClose(ga, DropoutBackward(a, res.state), 0, 0)) << cols;
    EXPECT_TRUE(AllClose(gb, DropoutBackward(b, res.state), 0, 0)) << cols;
  }
  Generator gen(1);
  const Tensor a = RandomTensor({4, 4}, 16), b = RandomTensor({4, 4}, 17);
  const DropoutResult off = Dropout(a, 0.5f, gen, /*training=*/false);
  const auto [ia, ib] = DropoutBackwardOfBoth(a, b, off.state);
  EXPECT_TRUE(ia.SharesStorageWith(a));
  EXPECT_TRUE(ib.SharesStorageWith(b));
  const DropoutResult all = Dropout(a, 1.0f, gen);
  for (const Tensor& t : DropoutBackwardOfBoth(a, b, all.state)) {
    for (float v : t.ToVector<float>()) EXPECT_EQ(v, 0.0f);
  }
  const DropoutResult res = Dropout(a, 0.5f, gen);
  try {
    DropoutBackwardOfBoth(a, Tensor::Zeros({4, 5}), res.state);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[dropout_backward] grad_y (4,5) f32 has 20 elements but the forward's x had 16");
  }
}

// DropoutAdd = residual + Dropout(x): in f32 the same bits as the two ops
// (the same generator state: the same mask), at sizes that end mid-block,
// with strided inputs and a block of +0 in x; with a bf16 x the f32 sum
// rounded once; inactive and p = 1 states; errors.
TEST(DropoutTest, DropoutAddIsResidualPlusDropout) {
  for (int64_t cols : {29, 64, 3}) {
    const Tensor residual = RandomTensor({cols, 7}, 20).Transpose(0, 1);  // (7, cols), strided
    Tensor x = RandomTensor({7, cols}, 21);
    x.Narrow(0, 1, 5).CopyFrom(Tensor::Zeros({5, cols}));  // +0 blocks
    Generator gen_a(22), gen_b(22);
    const DropoutResult want = Dropout(x, 0.3f, gen_a);
    const DropoutResult got = DropoutAdd(residual, x, 0.3f, gen_b);
    EXPECT_EQ(got.state.offset, want.state.offset);
    EXPECT_EQ(gen_a.offset(), gen_b.offset());
    EXPECT_TRUE(AllClose(got.y, Add(residual, want.y), 0, 0)) << cols;
    // A bf16 branch joining an f32 stream: y is f32, residual + x * scale.
    const Tensor x16 = x.To(Dtype::kBF16);
    Generator gen_c(22);
    const DropoutResult mixed = DropoutAdd(residual, x16, 0.3f, gen_c);
    EXPECT_EQ(mixed.y.dtype(), Dtype::kF32);
    const std::vector<uint8_t> mask = DropoutMask(x.shape(), mixed.state).ToVector<uint8_t>();
    const std::vector<float> r = residual.ToVector<float>(), xv = x16.ToVector<float>();
    const float scale = static_cast<float>(1.0 / (1.0 - 0.3));
    std::vector<float> expected(r.size());
    for (size_t i = 0; i < r.size(); ++i) expected[i] = r[i] + (mask[i] ? xv[i] * scale : 0.0f);
    EXPECT_TRUE(AllClose(mixed.y, Tensor::FromVector(expected, x.shape()), 0, 0)) << cols;
  }
  const Tensor residual = RandomTensor({4, 4}, 23), x = RandomTensor({4, 4}, 24);
  Generator gen(25);
  const DropoutResult off = DropoutAdd(residual, x, 0.5f, gen, /*training=*/false);
  EXPECT_FALSE(off.state.active);
  EXPECT_TRUE(AllClose(off.y, Add(residual, x), 0, 0));
  const DropoutResult all = DropoutAdd(residual, x, 1.0f, gen);
  EXPECT_TRUE(AllClose(all.y, residual, 0, 0));
  EXPECT_FALSE(all.y.SharesStorageWith(residual));
  try {
    DropoutAdd(Tensor::Zeros({4, 5}), x, 0.5f, gen);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[dropout_add] the residual must have x's shape and "
                                         "device; got residual (4,5) f32"),
              std::string::npos)
        << e.what();
  }
}

// Blocks of +0 inputs skip the mask's generation; the result is still the
// documented mask's, bit for bit (kept or dropped, +0 stays +0), and a block
// holding -0 (whose kept value is -0) is not skipped. The layout of causal
// attention probabilities: rows whose tail is zero, lengths not multiples of
// the 32-element block.
TEST(DropoutTest, ZeroBlocksGiveTheMasksResult) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const int64_t rows = 9, cols = 100;
    std::vector<float> v = RandomTensor({rows, cols}, 18).ToVector<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 10 * r + 1; c < cols; ++c) v[r * cols + c] = 0.0f;  // causal-like
    }
    for (int64_t c = 40; c < cols; ++c) v[8 * cols + c] = -0.0f;  // a tail of -0
    const Tensor x = Tensor::FromData<float>(v, {rows, cols}).To(dtype);
    Generator gen(19);
    const DropoutResult res = Dropout(x, 0.5f, gen);
    const std::vector<uint8_t> mask = DropoutMask(x.shape(), res.state).ToVector<uint8_t>();
    const std::vector<float> y = res.y.To(Dtype::kF32).ToVector<float>();
    const std::vector<float> xv = x.To(Dtype::kF32).ToVector<float>();
    int negative_zeros = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const float want = mask[i] ? xv[i] * 2.0f : 0.0f;  // 1 / (1 - p) = 2: exact
      EXPECT_EQ(y[i], want) << i;
      EXPECT_EQ(std::signbit(y[i]), std::signbit(want)) << i;
      negative_zeros += y[i] == 0.0f && std::signbit(y[i]);
    }
    EXPECT_GT(negative_zeros, 0);  // kept -0 inputs stayed -0: that block was not skipped
    // The backward through the same mask, in place of a gradient with zero blocks.
    EXPECT_TRUE(AllClose(DropoutBackward(x, res.state), res.y, 0, 0)) << DtypeName(dtype);
  }
}

TEST(DropoutTest, EvalAndZeroPAreTheIdentity) {
  const Tensor x = RandomTensor({4, 4}, 6);
  Generator gen(1);
  for (const DropoutResult& res : {Dropout(x, 0.5f, gen, /*training=*/false), Dropout(x, 0.0f, gen)}) {
    EXPECT_FALSE(res.state.active);
    EXPECT_TRUE(res.y.SharesStorageWith(x));
    const Tensor g = RandomTensor({4, 4}, 7);
    EXPECT_TRUE(DropoutBackward(g, res.state).SharesStorageWith(g));
  }
  EXPECT_EQ(gen.offset(), 0u);  // nothing drawn
}

TEST(DropoutTest, POneGivesZeros) {
  const Tensor x = RandomTensor({3, 5}, 8);
  Generator gen(1);
  const DropoutResult res = Dropout(x, 1.0f, gen);
  for (float v : res.y.ToVector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : DropoutBackward(x, res.state).ToVector<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(DropoutTest, LowPrecisionStridedAndNonFiniteInputs) {
  const Tensor x = RandomTensor({9, 13}, 9);
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    const Tensor xl = x.To(dtype);
    Generator a(3), b(3);
    const DropoutResult rl = Dropout(xl, 0.25f, a);
    const DropoutResult r32 = Dropout(xl.To(Dtype::kF32), 0.25f, b);
    EXPECT_EQ(rl.y.dtype(), dtype);
    // The same mask; kept values rounded once to the low precision type.
    EXPECT_TRUE(AllClose(rl.y, r32.y.To(dtype), 0, 0)) << DtypeName(dtype);
  }
  // A transposed view is masked by its logical (row-major) index.
  const Tensor xt = x.Transpose(0, 1);
  Generator a(4), b(4);
  EXPECT_TRUE(AllClose(Dropout(xt, 0.5f, a).y, Dropout(xt.Contiguous(), 0.5f, b).y, 0, 0));
  // Dropped infinities and NaNs become 0, kept ones stay.
  const Tensor bad = Tensor::Full({64}, INFINITY);
  Generator c(5);
  const DropoutResult rb = Dropout(bad, 0.5f, c);
  const std::vector<uint8_t> mask = DropoutMask(bad.shape(), rb.state).ToVector<uint8_t>();
  const std::vector<float> y = rb.y.ToVector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], mask[i] ? INFINITY : 0.0f) << i;
}

TEST(DropoutTest, ErrorsNameTheOpAndShapes) {
  Generator gen(1);
  try {
    Dropout(Tensor::Zeros({2, 3}), 1.5f, gen);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(), "[dropout] p must be in [0, 1]; got 1.5");
  }
  EXPECT_THROW(Dropout(Tensor::Zeros({2}), -0.1f, gen), OpError);
  EXPECT_THROW(Dropout(Tensor::Zeros({2}), NAN, gen), OpError);
  EXPECT_THROW(Dropout(Tensor::Zeros({2}, Dtype::kI32), 0.5f, gen), OpError);
  const DropoutResult res = Dropout(Tensor::Zeros({2, 3}), 0.5f, gen);
  try {
    DropoutBackward(Tensor::Zeros({2, 4}), res.state);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[dropout_backward] grad_y (2,4) f32 has 8 elements but the forward's x had 6");
  }
}

}  // namespace
}  // namespace tensor
