// Tests of Softmax / SoftmaxBackward against a plain double reference and
// finite differences: scale, causal masks (T_q == T_k and T_q < T_k), low
// precision inputs, extreme values, in-place use and argument errors.
#include "tensor/ops/softmax.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using testing::AllClose;
using testing::Dot;
using testing::NumericalGradient;
using testing::RandomTensor;

// Whether row r of scores (..., t_q, cols) may see key j.
bool Visible(int64_t r, int64_t j, int64_t cols, int64_t t_q, bool causal) {
  return !causal || j <= r % t_q + (cols - t_q);
}

// softmax(scale * x) per row in double, masked entries 0.
Tensor ReferenceSoftmax(const Tensor& x, float scale, bool causal) {
  const std::vector<float> v = x.ToVector<float>();
  const int64_t cols = x.dim(-1);
  const int64_t t_q = x.rank() >= 2 ? x.dim(-2) : 1;
  const int64_t rows = x.numel() / cols;
  std::vector<float> out(v.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) {
      if (Visible(r, j, cols, t_q, causal)) m = std::max(m, double{scale} * v[r * cols + j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      if (Visible(r, j, cols, t_q, causal)) sum += std::exp(double{scale} * v[r * cols + j] - m);
    }
    for (int64_t j = 0; j < cols; ++j) {
      if (Visible(r, j, cols, t_q, causal)) {
        out[r * cols + j] = static_cast<float>(std::exp(double{scale} * v[r * cols + j] - m) / sum);
      }
    }
  }
  return Tensor::FromVector(out, x.shape());
}

// scale * y * (g - sum(g * y)) per row in double.
Tensor ReferenceSoftmaxBackward(const Tensor& g, const Tensor& y, float scale) {
  const std::vector<float> gv = g.ToVector<float>();
  const std::vector<float> yv = y.ToVector<float>();
  const int64_t cols = y.dim(-1);
  std::vector<float> out(gv.size());
  for (int64_t r = 0; r < y.numel() / cols; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < cols; ++j) dot += double{gv[r * cols + j]} * yv[r * cols + j];
    for (int64_t j = 0; j < cols; ++j) {
      out[r * cols + j] = static_cast<float>(scale * yv[r * cols + j] * (gv[r * cols + j] - dot));
    }
  }
  return Tensor::FromVector(out, y.shape());
}

TEST(SoftmaxTest, MatchesReferenceForManyRowLengths) {
  for (int64_t cols : {1, 3, 8, 13, 37, 64, 1000}) {
    const Tensor x = RandomTensor({3, 5, cols}, 10 + cols, -4.0f, 4.0f);
    const Tensor y = Softmax(x);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(y.dtype(), Dtype::kF32);
    EXPECT_TRUE(AllClose(y, ReferenceSoftmax(x, 1.0f, false), 1e-7, 2e-6)) << "cols " << cols;
  }
}

TEST(SoftmaxTest, RowsSumToOneOverAVocabularySizedRow) {
  const Tensor x = RandomTensor({2, 50257}, 3, -10.0f, 10.0f);
  const Tensor y = Softmax(x);
  const std::vector<float> v = y.ToVector<float>();
  for (int r = 0; r < 2; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < 50257; ++j) sum += v[r * 50257 + j];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  EXPECT_TRUE(AllClose(y, ReferenceSoftmax(x, 1.0f, false), 1e-9, 1e-5));
}

TEST(SoftmaxTest, ScaleIsAppliedBeforeTheSoftmax) {
  const Tensor x = RandomTensor({4, 19}, 5, -3.0f, 3.0f);
  for (float scale : {0.125f, 2.0f, -1.5f}) {
    SoftmaxOptions opt;
    opt.scale = scale;
    EXPECT_TRUE(AllClose(Softmax(x, opt), ReferenceSoftmax(x, scale, false), 1e-7, 2e-6))
        << "scale " << scale;
  }
}

TEST(SoftmaxTest, HugeLogitsAreStable) {
  const Tensor x = Tensor::FromVector({1e4f, -1e4f, 0.0f, 1e4f, 3e38f, -3e38f, 1.0f, 2.0f},
                                      {2, 4});
  const std::vector<float> y = Softmax(x).ToVector<float>();
  const std::vector<float> expected = {0.5f, 0.0f, 0.0f, 0.5f, 1.0f, 0.0f, 0.0f, 0.0f};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y[i], expected[i]) << i;
}

TEST(SoftmaxTest, AccurateOverTheWholeExpRange) {
  // Rows (0, -d): the second probability is exp(-d) / (1 + exp(-d)), which
  // walks the exponential over its whole float range.
  std::vector<float> v;
  std::vector<double> d_values;
  for (double d = 0; d < 87.0; d += 0.173) d_values.push_back(d);
  for (double d : d_values) {
    v.push_back(0.0f);
    v.push_back(static_cast<float>(-d));
  }
  const int64_t rows = d_values.size();
  const std::vector<float> y = Softmax(Tensor::FromVector(v, {rows, 2})).ToVector<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const double e = std::exp(static_cast<double>(v[2 * r + 1]));
    EXPECT_NEAR(y[2 * r + 1], e / (1 + e), 1e-6 * e / (1 + e)) << v[2 * r + 1];
  }
  // Below exp's normal range the probability flushes to exactly 0.
  const std::vector<float> tiny = Softmax(Tensor::FromVector({0.0f, -90.0f}, {2})).ToVector<float>();
  EXPECT_EQ(tiny[0], 1.0f);
  EXPECT_EQ(tiny[1], 0.0f);
}

TEST(SoftmaxTest, NanInARowMakesTheRowNan) {
  for (int64_t where : {0, 5, 12}) {
    std::vector<float> v(13, 0.5f);
    v[where] = NAN;
    const std::vector<float> y = Softmax(Tensor::FromVector(v, {13})).ToVector<float>();
    for (float p : y) EXPECT_TRUE(std::isnan(p)) << where;
  }
}

TEST(SoftmaxTest, CausalSquareMasksTheFuture) {
  const Tensor x = RandomTensor({2, 3, 7, 7}, 7, -2.0f, 2.0f);
  SoftmaxOptions opt;
  opt.causal = true;
  opt.scale = 0.5f;
  const Tensor y = Softmax(x, opt);
  EXPECT_TRUE(AllClose(y, ReferenceSoftmax(x, 0.5f, true), 1e-7, 2e-6));
  const std::vector<float> v = y.ToVector<float>();
  for (int64_t r = 0; r < 2 * 3 * 7; ++r) {
    for (int64_t j = 0; j < 7; ++j) {
      if (j > r % 7) {
        EXPECT_EQ(v[r * 7 + j], 0.0f) << r << "," << j;
      } else {
        EXPECT_GT(v[r * 7 + j], 0.0f) << r << "," << j;
      }
    }
  }
  // Query 0 sees only key 0.
  EXPECT_EQ(v[0], 1.0f);
}

TEST(SoftmaxTest, CausalWithFewerQueriesThanKeys) {
  // T_q = 3 new queries over T_k = 20 keys (a KV cache): query i sees keys j <= i + 17.
  const Tensor x = RandomTensor({2, 3, 20}, 8, -2.0f, 2.0f);
  SoftmaxOptions opt;
  opt.causal = true;
  const Tensor y = Softmax(x, opt);
  EXPECT_TRUE(AllClose(y, ReferenceSoftmax(x, 1.0f, true), 1e-7, 2e-6));
  const std::vector<float> v = y.ToVector<float>();
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < 20; ++j) {
      EXPECT_EQ(v[r * 20 + j] == 0.0f, j > r % 3 + 17) << r << "," << j;
    }
  }
  // The last query sees everything: the same as no mask.
  EXPECT_TRUE(AllClose(y.Select(1, 2), Softmax(x.Select(1, 2)), 0, 0));
}

TEST(SoftmaxTest, BackwardMatchesReference) {
  for (bool causal : {false, true}) {
    const Tensor x = RandomTensor({2, 9, 21}, 11, -3.0f, 3.0f);
    const Tensor g = RandomTensor({2, 9, 21}, 12);
    SoftmaxOptions opt;
    opt.causal = causal;
    opt.scale = 0.7f;
    const Tensor y = Softmax(x, opt);
    const Tensor gx = SoftmaxBackward(g, y, opt);
    EXPECT_TRUE(AllClose(gx, ReferenceSoftmaxBackward(g, y, 0.7f), 1e-7, 1e-5));
    if (causal) {
      const std::vector<float> v = gx.ToVector<float>();
      for (int64_t r = 0; r < 18; ++r) {
        for (int64_t j = 0; j < 21; ++j) {
          if (j > r % 9 + 12) {
            EXPECT_EQ(v[r * 21 + j], 0.0f);
          }
        }
      }
    }
  }
}

TEST(SoftmaxTest, BackwardMatchesFiniteDifferences) {
  struct Case {
    Shape shape;
    SoftmaxOptions opt;
  };
  const std::vector<Case> cases = {
      {{3, 10}, {1.0f, false}},
      {{2, 5, 5}, {0.5f, true}},
      {{1, 2, 3, 11}, {1.3f, true}},
  };
  for (const Case& c : cases) {
    Tensor x = RandomTensor(c.shape, 21, -2.0f, 2.0f);
    const Tensor w = RandomTensor(c.shape, 22);
    auto loss = [&](const Tensor& xx) { return Dot(Softmax(xx, c.opt), w); };
    const Tensor numeric = NumericalGradient(loss, x, 1e-2);
    const Tensor analytic = SoftmaxBackward(w, Softmax(x, c.opt), c.opt);
    EXPECT_TRUE(AllClose(analytic, numeric, 2e-4, 1e-2)) << c.shape.ToString();
  }
}

TEST(SoftmaxTest, LowPrecisionMatchesF32) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    const Tensor x = RandomTensor({4, 6, 45}, 31, -4.0f, 4.0f, dtype);
    SoftmaxOptions opt;
    opt.causal = true;
    opt.scale = 0.25f;
    const Tensor y = Softmax(x, opt);
    EXPECT_EQ(y.dtype(), dtype);
    const Tensor y32 = Softmax(x.To(Dtype::kF32), opt);
    const double tol = dtype == Dtype::kBF16 ? 8e-3 : 1e-3;  // a rounding of the output
    EXPECT_TRUE(AllClose(y, y32, 1e-6, tol)) << DtypeName(dtype);

    const Tensor g = RandomTensor(x.shape(), 32, -1.0f, 1.0f, dtype);
    const Tensor gx = SoftmaxBackward(g, y, opt);
    EXPECT_EQ(gx.dtype(), dtype);
    const Tensor gx32 = SoftmaxBackward(g.To(Dtype::kF32), y.To(Dtype::kF32), opt);
    EXPECT_TRUE(AllClose(gx, gx32, 1e-5, tol)) << DtypeName(dtype);
  }
}

TEST(SoftmaxTest, InPlaceAndStridedInputs) {
  const Tensor x = RandomTensor({3, 4, 17}, 41, -3.0f, 3.0f, Dtype::kBF16);
  const Tensor expected = Softmax(x);
  const Tensor buf = x.Clone();
  SoftmaxInto(buf, buf);
  EXPECT_TRUE(AllClose(buf, expected, 0, 0));

  const Tensor x32 = RandomTensor({6, 9}, 42);
  const Tensor xt = x32.Transpose(0, 1);  // (9, 6), not contiguous
  ASSERT_FALSE(xt.is_contiguous());
  EXPECT_TRUE(AllClose(Softmax(xt), ReferenceSoftmax(xt.Contiguous(), 1.0f, false), 1e-7, 2e-6));
}

TEST(SoftmaxTest, EmptyTensors) {
  EXPECT_EQ(Softmax(Tensor::Zeros({0, 5})).shape(), Shape({0, 5}));
  EXPECT_EQ(Softmax(Tensor::Zeros({2, 0})).shape(), Shape({2, 0}));
}

TEST(SoftmaxTest, ErrorsNameTheOpAndShapes) {
  SoftmaxOptions causal;
  causal.causal = true;
  try {
    Softmax(Tensor::Zeros({2, 5, 3}), causal);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[softmax] the causal mask needs T_q <= T_k; got T_q 5 and T_k 3 in x (2,5,3) f32");
  }
  EXPECT_THROW(Softmax(Tensor::Zeros({4}), causal), OpError);
  EXPECT_THROW(Softmax(Tensor::Zeros({2, 3}, Dtype::kI32)), OpError);
  try {
    SoftmaxBackward(Tensor::Zeros({2, 3}), Tensor::Zeros({2, 4}));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(), "[softmax_backward] shapes (2,3) and (2,4) differ");
  }
  EXPECT_THROW(SoftmaxBackward(Tensor::Zeros({2, 3}), Tensor::Zeros({2, 3}, Dtype::kBF16)),
               OpError);
  EXPECT_THROW(SoftmaxInto(Tensor::Zeros({2, 3}), Tensor::Zeros({3, 2}).Transpose(0, 1)),
               OpError);
  SoftmaxOptions bad_scale;
  bad_scale.scale = NAN;
  EXPECT_THROW(Softmax(Tensor::Zeros({2, 3}), bad_scale), OpError);
}

}  // namespace
}  // namespace tensor
