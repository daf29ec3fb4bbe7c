// Tests of LayerNorm and RMSNorm (forward, saved statistics, backward) against
// plain double references and finite differences, with optional parameters,
// mixed precision (bf16 / f16 x with f32 or same-dtype parameters) and
// argument errors.
#include "tensor/ops/norm.h"

#include <cmath>
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

std::vector<double> AsDouble(const Tensor& t, int64_t n_if_undefined, double fill) {
  if (!t.defined()) return std::vector<double>(n_if_undefined, fill);
  const std::vector<float> v = t.ToVector<float>();
  return std::vector<double>(v.begin(), v.end());
}

Tensor FromDouble(const std::vector<double>& v, const Shape& shape) {
  return Tensor::FromVector(std::vector<float>(v.begin(), v.end()), shape);
}

// The normalization of a row in double: centered (LayerNorm) or not (RMSNorm).
struct Reference {
  Tensor y, mean, rstd, grad_x, grad_weight, grad_bias;
};

Reference ReferenceNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& grad_y, double eps, bool centered) {
  const int64_t c = x.dim(-1);
  const int64_t rows = x.numel() / c;
  const std::vector<double> xv = AsDouble(x, 0, 0), gv = AsDouble(grad_y, 0, 0);
  const std::vector<double> w = AsDouble(weight, c, 1.0), b = AsDouble(bias, c, 0.0);
  std::vector<double> y(rows * c), gx(rows * c), mean(rows), rstd(rows), gw(c, 0), gb(c, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &xv[r * c];
    const double* g = &gv[r * c];
    double m = 0;
    if (centered) {
      for (int64_t j = 0; j < c; ++j) m += xr[j];
      m /= c;
    }
    double var = 0;
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - m) * (xr[j] - m);
    const double rs = 1.0 / std::sqrt(var / c + eps);
    mean[r] = m;
    rstd[r] = rs;
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - m) * rs;
      y[r * c + j] = xhat * w[j] + b[j];
      sum_dxhat += g[j] * w[j];
      sum_dxhat_xhat += g[j] * w[j] * xhat;
      gw[j] += g[j] * xhat;
      gb[j] += g[j];
    }
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - m) * rs;
      const double a = centered ? sum_dxhat / c : 0.0;
      gx[r * c + j] = rs * (g[j] * w[j] - a - xhat * sum_dxhat_xhat / c);
    }
  }
  Shape rows_shape(absl::MakeConstSpan(x.shape().dims()).subspan(0, x.rank() - 1));
  return {FromDouble(y, x.shape()), FromDouble(mean, rows_shape),  FromDouble(rstd, rows_shape),
          FromDouble(gx, x.shape()), FromDouble(gw, {c}),           FromDouble(gb, {c})};
}

TEST(LayerNormTest, ForwardAndBackwardMatchReference) {
  for (int64_t c : {1, 5, 8, 37, 768}) {
    const Tensor x = RandomTensor({3, 7, c}, c, -2.0f, 3.0f);
    const Tensor w = RandomTensor({c}, c + 1, 0.5f, 1.5f);
    const Tensor b = RandomTensor({c}, c + 2);
    const Tensor g = RandomTensor({3, 7, c}, c + 3);
    const LayerNormResult res = LayerNorm(x, w, b, 1e-5f);
    const Reference ref = ReferenceNorm(x, w, b, g, 1e-5, true);
    EXPECT_TRUE(AllClose(res.y, ref.y, 1e-5, 1e-5)) << c;
    EXPECT_TRUE(AllClose(res.mean, ref.mean, 1e-6, 1e-6)) << c;
    EXPECT_TRUE(AllClose(res.rstd, ref.rstd, 1e-6, 1e-5)) << c;
    EXPECT_EQ(res.mean.shape(), Shape({3, 7}));
    const LayerNormGrads grads = LayerNormBackward(g, x, w, res.mean, res.rstd);
    EXPECT_TRUE(AllClose(grads.grad_x, ref.grad_x, 1e-4, 1e-4)) << c;
    EXPECT_TRUE(AllClose(grads.grad_weight, ref.grad_weight, 1e-5, 1e-5)) << c;
    EXPECT_TRUE(AllClose(grads.grad_bias, ref.grad_bias, 1e-5, 1e-5)) << c;
  }
}

TEST(LayerNormTest, WithoutWeightOrBias) {
  const Tensor x = RandomTensor({4, 13}, 1, -1.0f, 4.0f);
  const Tensor g = RandomTensor({4, 13}, 2);
  const LayerNormResult res = LayerNorm(x, Tensor(), Tensor());
  const Reference ref = ReferenceNorm(x, Tensor(), Tensor(), g, 1e-5, true);
  EXPECT_TRUE(AllClose(res.y, ref.y, 1e-5, 1e-5));
  const LayerNormGrads grads = LayerNormBackward(g, x, Tensor(), res.mean, res.rstd);
  EXPECT_TRUE(AllClose(grads.grad_x, ref.grad_x, 1e-4, 1e-4));
  EXPECT_FALSE(grads.grad_weight.defined());
  EXPECT_TRUE(AllClose(grads.grad_bias, ref.grad_bias, 1e-5, 1e-5));
  // Only a bias.
  const Tensor b = RandomTensor({13}, 3);
  EXPECT_TRUE(AllClose(LayerNorm(x, Tensor(), b).y,
                       ReferenceNorm(x, Tensor(), b, g, 1e-5, true).y, 1e-5, 1e-5));
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({2, 3, 6}, 11, -2.0f, 2.0f);
  Tensor w = RandomTensor({6}, 12, 0.5f, 1.5f);
  Tensor b = RandomTensor({6}, 13);
  const Tensor probe = RandomTensor({2, 3, 6}, 14);
  auto loss = [&](const Tensor&) { return Dot(LayerNorm(x, w, b, 1e-5f).y, probe); };
  const LayerNormResult res = LayerNorm(x, w, b, 1e-5f);
  const LayerNormGrads grads = LayerNormBackward(probe, x, w, res.mean, res.rstd);
  EXPECT_TRUE(AllClose(grads.grad_x, NumericalGradient(loss, x, 1e-2), 2e-3, 1e-2));
  EXPECT_TRUE(AllClose(grads.grad_weight, NumericalGradient(loss, w, 1e-2), 2e-3, 1e-2));
  EXPECT_TRUE(AllClose(grads.grad_bias, NumericalGradient(loss, b, 1e-2), 2e-3, 1e-2));
}

TEST(LayerNormTest, ParamGradsOverManyRowsAreAccurateAndDeterministic) {
  // 1000 rows: many blocks of partial sums.
  const Tensor x = RandomTensor({1000, 40}, 21, -3.0f, 3.0f);
  const Tensor w = RandomTensor({40}, 22);
  const Tensor g = RandomTensor({1000, 40}, 23);
  const LayerNormResult res = LayerNorm(x, w, Tensor());
  const LayerNormGrads a = LayerNormBackward(g, x, w, res.mean, res.rstd);
  const LayerNormGrads b = LayerNormBackward(g, x, w, res.mean, res.rstd);
  const Reference ref = ReferenceNorm(x, w, Tensor(), g, 1e-5, true);
  EXPECT_TRUE(AllClose(a.grad_weight, ref.grad_weight, 1e-4, 1e-5));
  EXPECT_TRUE(AllClose(a.grad_bias, ref.grad_bias, 1e-4, 1e-5));
  EXPECT_TRUE(AllClose(a.grad_weight, b.grad_weight, 0, 0));
  EXPECT_TRUE(AllClose(a.grad_x, b.grad_x, 0, 0));
}

TEST(LayerNormTest, LowPrecisionInputsWithF32AndSameDtypeParams) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    for (bool f32_params : {true, false}) {
      const Dtype pdtype = f32_params ? Dtype::kF32 : dtype;
      const Tensor x = RandomTensor({5, 48}, 31, -2.0f, 2.0f, dtype);
      const Tensor w = RandomTensor({48}, 32, 0.5f, 1.5f, pdtype);
      const Tensor b = RandomTensor({48}, 33, -1.0f, 1.0f, pdtype);
      const Tensor g = RandomTensor({5, 48}, 34, -1.0f, 1.0f, dtype);
      const LayerNormResult res = LayerNorm(x, w, b);
      EXPECT_EQ(res.y.dtype(), dtype);
      EXPECT_EQ(res.mean.dtype(), Dtype::kF32);
      // The f32 computation on the same (already rounded) values.
      const LayerNormResult r32 =
          LayerNorm(x.To(Dtype::kF32), w.To(Dtype::kF32), b.To(Dtype::kF32));
      const double tol = dtype == Dtype::kBF16 ? 1e-2 : 2e-3;
      EXPECT_TRUE(AllClose(res.y, r32.y, tol, tol));
      EXPECT_TRUE(AllClose(res.rstd, r32.rstd, 1e-6, 1e-6));
      const LayerNormGrads grads = LayerNormBackward(g, x, w, res.mean, res.rstd);
      const LayerNormGrads g32 =
          LayerNormBackward(g.To(Dtype::kF32), x.To(Dtype::kF32), w.To(Dtype::kF32),
                            r32.mean, r32.rstd);
      EXPECT_EQ(grads.grad_x.dtype(), dtype);
      EXPECT_EQ(grads.grad_weight.dtype(), pdtype);
      EXPECT_EQ(grads.grad_bias.dtype(), pdtype);
      EXPECT_TRUE(AllClose(grads.grad_x, g32.grad_x, tol, tol));
      EXPECT_TRUE(AllClose(grads.grad_weight, g32.grad_weight, tol, tol));
      EXPECT_TRUE(AllClose(grads.grad_bias, g32.grad_bias, tol, tol));
    }
  }
}

TEST(LayerNormTest, ConstantRowsUseEps) {
  const Tensor x = Tensor::Full({2, 16}, 3.0);
  const LayerNormResult res = LayerNorm(x, Tensor(), Tensor(), 1e-5f);
  for (float v : res.y.ToVector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : res.rstd.ToVector<float>()) EXPECT_NEAR(v, 1.0 / std::sqrt(1e-5), 1e-2);
}

// grad_x_add: grad_x is the add plus the gradient (f32: within an ulp, the
// add may contract into an FMA; bf16: one rounding instead of two), the
// parameter gradients unchanged.
TEST(LayerNormTest, BackwardAddsTheGivenGradient) {
  for (Dtype d : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(DtypeName(d));
    const Tensor x = RandomTensor({3, 5, 24}, 1, -2, 3, d);
    const Tensor gy = RandomTensor({3, 5, 24}, 2, -1, 1, d);
    const Tensor add = RandomTensor({3, 5, 24}, 3, -1, 1, d);
    const Tensor w = RandomTensor({24}, 4, 0.5f, 1.5f);
    const double tol = d == Dtype::kF32 ? 1e-6 : 1.6e-2;
    const LayerNormResult fwd = LayerNorm(x, w, Tensor());
    const LayerNormGrads plain = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
    const LayerNormGrads summed = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, add);
    EXPECT_EQ(summed.grad_x.dtype(), d);
    EXPECT_TRUE(AllClose(summed.grad_x, Add(plain.grad_x, add), tol, tol));
    EXPECT_TRUE(AllClose(summed.grad_weight, plain.grad_weight, 0, 0));
    EXPECT_TRUE(AllClose(summed.grad_bias, plain.grad_bias, 0, 0));

    const RmsNormResult rms = RmsNorm(x, w);
    const RmsNormGrads rplain = RmsNormBackward(gy, x, w, rms.rstd);
    const RmsNormGrads rsummed = RmsNormBackward(gy, x, w, rms.rstd, add);
    EXPECT_TRUE(AllClose(rsummed.grad_x, Add(rplain.grad_x, add), tol, tol));
    EXPECT_TRUE(AllClose(rsummed.grad_weight, rplain.grad_weight, 0, 0));
  }
  const Tensor x = Tensor::Zeros({2, 4});
  const LayerNormResult fwd = LayerNorm(x, Tensor(), Tensor());
  try {
    LayerNormBackward(x, x, Tensor(), fwd.mean, fwd.rstd, Tensor::Zeros({2, 4}, Dtype::kBF16));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[layer_norm_backward] grad_x_add (2,4) bf16 does not match x (2,4) f32");
  }
}

// NormGradsInto: each parameter gradient given a buffer is added into it (the
// bits of AddInPlace of the returned f32 gradient), or written without
// add_weight / add_bias, and not returned; one not given is returned as
// without; grad_x is unchanged; bad buffers are named.
TEST(LayerNormTest, BackwardAddsParameterGradientsInto) {
  for (Dtype d : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(DtypeName(d));
    const Tensor x = RandomTensor({3, 5, 24}, 1, -2, 3, d);
    const Tensor gy = RandomTensor({3, 5, 24}, 2, -1, 1, d);
    const Tensor w = RandomTensor({24}, 4, 0.5f, 1.5f);
    const Tensor b = RandomTensor({24}, 5, -0.5f, 0.5f);
    const LayerNormResult fwd = LayerNorm(x, w, b);
    const LayerNormGrads plain = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
    const Tensor old_w = RandomTensor({24}, 6, -1, 1), old_b = RandomTensor({24}, 7, -1, 1);
    Tensor want_w = old_w.Clone(), want_b = old_b.Clone();
    AddInPlace(want_w, plain.grad_weight);
    AddInPlace(want_b, plain.grad_bias);

    NormGradsInto both{old_w.Clone(), old_b.Clone()};
    const LayerNormGrads got = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), both);
    EXPECT_FALSE(got.grad_weight.defined());
    EXPECT_FALSE(got.grad_bias.defined());
    EXPECT_TRUE(AllClose(got.grad_x, plain.grad_x, 0, 0));
    EXPECT_TRUE(AllClose(both.weight, want_w, 0, 0));
    EXPECT_TRUE(AllClose(both.bias, want_b, 0, 0));

    NormGradsInto bias_only{Tensor(), old_b.Clone()};
    const LayerNormGrads some =
        LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), bias_only);
    EXPECT_TRUE(AllClose(some.grad_weight, plain.grad_weight, 0, 0));
    EXPECT_FALSE(some.grad_bias.defined());
    EXPECT_TRUE(AllClose(bias_only.bias, want_b, 0, 0));

    const RmsNormResult rms = RmsNorm(x, w);
    const RmsNormGrads rplain = RmsNormBackward(gy, x, w, rms.rstd);
    Tensor rwant = old_w.Clone();
    AddInPlace(rwant, rplain.grad_weight);
    NormGradsInto rinto{old_w.Clone(), Tensor()};
    const RmsNormGrads rgot = RmsNormBackward(gy, x, w, rms.rstd, Tensor(), rinto);
    EXPECT_FALSE(rgot.grad_weight.defined());
    EXPECT_TRUE(AllClose(rgot.grad_x, rplain.grad_x, 0, 0));
    EXPECT_TRUE(AllClose(rinto.weight, rwant, 0, 0));

    // add_weight / add_bias false: the buffers (full of NaN, as a new
    // gradient may be) get the gradient written, the bits of the returned
    // one; each flag on its own; RMSNorm's weight alike.
    const Tensor nan = Tensor::Full({24}, std::nan(""));
    NormGradsInto written{nan.Clone(), old_b.Clone()};
    written.add_weight = false;  // written; the bias added to
    const LayerNormGrads wgot = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), written);
    EXPECT_TRUE(AllClose(wgot.grad_x, plain.grad_x, 0, 0));
    EXPECT_TRUE(AllClose(written.weight, plain.grad_weight.To(Dtype::kF32), 0, 0));
    EXPECT_TRUE(AllClose(written.bias, want_b, 0, 0));
    NormGradsInto bias_written{Tensor(), nan.Clone()};
    bias_written.add_bias = false;
    LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd, Tensor(), bias_written);
    EXPECT_TRUE(AllClose(bias_written.bias, plain.grad_bias.To(Dtype::kF32), 0, 0));
    NormGradsInto rwritten{nan.Clone(), Tensor()};
    rwritten.add_weight = false;
    RmsNormBackward(gy, x, w, rms.rstd, Tensor(), rwritten);
    EXPECT_TRUE(AllClose(rwritten.weight, rplain.grad_weight.To(Dtype::kF32), 0, 0));
  }
  const Tensor x = Tensor::Zeros({2, 4});
  const Tensor w = Tensor::Full({4}, 1.0);
  const LayerNormResult fwd = LayerNorm(x, w, Tensor());
  try {
    LayerNormBackward(x, x, w, fwd.mean, fwd.rstd, Tensor(),
                      NormGradsInto{Tensor::Zeros({4}, Dtype::kBF16), Tensor()});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[layer_norm_backward] the gradient to add the weight's into must be (4) f32 "
                 "contiguous; got weight (4) bf16");
  }
  EXPECT_THROW(LayerNormBackward(x, x, w, fwd.mean, fwd.rstd, Tensor(),
                                 NormGradsInto{Tensor(), Tensor::Zeros({5})}),
               OpError);
  EXPECT_THROW(LayerNormBackward(x, x, Tensor(), fwd.mean, fwd.rstd, Tensor(),
                                 NormGradsInto{Tensor::Zeros({4}), Tensor()}),
               OpError);
  EXPECT_THROW(RmsNormBackward(x, x, w, RmsNorm(x, w).rstd, Tensor(),
                               NormGradsInto{Tensor(), Tensor::Zeros({4})}),
               OpError);
}

TEST(LayerNormTest, ErrorsNameTheOpAndShapes) {
  const Tensor x = Tensor::Zeros({2, 3, 4});
  try {
    LayerNorm(x, Tensor::Zeros({8}), Tensor());
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(), "[layer_norm] weight (8) does not match the last dimension of x (2,3,4)");
  }
  try {
    LayerNorm(x.To(Dtype::kF16), Tensor::Zeros({4}, Dtype::kBF16), Tensor());
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(), "[layer_norm] weight dtype bf16 must be f32 or the dtype of x (2,3,4) f16");
  }
  EXPECT_THROW(LayerNorm(x, Tensor(), Tensor::Zeros({3})), OpError);
  EXPECT_THROW(LayerNorm(x, Tensor(), Tensor(), -1.0f), OpError);
  EXPECT_THROW(LayerNorm(Tensor::Zeros({2, 0}), Tensor(), Tensor()), OpError);
  EXPECT_THROW(LayerNorm(Tensor::Zeros({2, 4}, Dtype::kI64), Tensor(), Tensor()), OpError);
  const LayerNormResult res = LayerNorm(x, Tensor(), Tensor());
  try {
    LayerNormBackward(x, x, Tensor(), Tensor::Zeros({2}), res.rstd);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[layer_norm_backward] mean (2) f32 does not match x (2,3,4): expected (2,3) f32");
  }
  EXPECT_THROW(LayerNormBackward(Tensor::Zeros({2, 3, 5}), x, Tensor(), res.mean, res.rstd),
               OpError);
}

TEST(RmsNormTest, ForwardAndBackwardMatchReference) {
  for (int64_t c : {1, 9, 64, 100}) {
    const Tensor x = RandomTensor({4, 5, c}, 40 + c, -2.0f, 3.0f);
    const Tensor w = RandomTensor({c}, 41 + c, 0.5f, 1.5f);
    const Tensor g = RandomTensor({4, 5, c}, 42 + c);
    const RmsNormResult res = RmsNorm(x, w, 1e-6f);
    const Reference ref = ReferenceNorm(x, w, Tensor(), g, 1e-6, false);
    EXPECT_TRUE(AllClose(res.y, ref.y, 1e-5, 1e-5)) << c;
    EXPECT_TRUE(AllClose(res.rstd, ref.rstd, 1e-6, 1e-5)) << c;
    const RmsNormGrads grads = RmsNormBackward(g, x, w, res.rstd);
    EXPECT_TRUE(AllClose(grads.grad_x, ref.grad_x, 1e-4, 1e-4)) << c;
    EXPECT_TRUE(AllClose(grads.grad_weight, ref.grad_weight, 1e-5, 1e-5)) << c;
  }
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({3, 7}, 51, -2.0f, 2.0f);
  Tensor w = RandomTensor({7}, 52, 0.5f, 1.5f);
  const Tensor probe = RandomTensor({3, 7}, 53);
  auto loss = [&](const Tensor&) { return Dot(RmsNorm(x, w).y, probe); };
  const RmsNormResult res = RmsNorm(x, w);
  const RmsNormGrads grads = RmsNormBackward(probe, x, w, res.rstd);
  EXPECT_TRUE(AllClose(grads.grad_x, NumericalGradient(loss, x, 1e-2), 2e-3, 1e-2));
  EXPECT_TRUE(AllClose(grads.grad_weight, NumericalGradient(loss, w, 1e-2), 2e-3, 1e-2));
  // Without weight.
  auto loss_nw = [&](const Tensor&) { return Dot(RmsNorm(x, Tensor()).y, probe); };
  const RmsNormGrads nw = RmsNormBackward(probe, x, Tensor(), RmsNorm(x, Tensor()).rstd);
  EXPECT_FALSE(nw.grad_weight.defined());
  EXPECT_TRUE(AllClose(nw.grad_x, NumericalGradient(loss_nw, x, 1e-2), 2e-3, 1e-2));
}

TEST(RmsNormTest, Bf16InputWithF32Weight) {
  const Tensor x = RandomTensor({6, 33}, 61, -2.0f, 2.0f, Dtype::kBF16);
  const Tensor w = RandomTensor({33}, 62, 0.5f, 1.5f);
  const Tensor g = RandomTensor({6, 33}, 63, -1.0f, 1.0f, Dtype::kBF16);
  const RmsNormResult res = RmsNorm(x, w);
  EXPECT_EQ(res.y.dtype(), Dtype::kBF16);
  const RmsNormResult r32 = RmsNorm(x.To(Dtype::kF32), w);
  EXPECT_TRUE(AllClose(res.y, r32.y, 1e-2, 1e-2));
  const RmsNormGrads grads = RmsNormBackward(g, x, w, res.rstd);
  const RmsNormGrads g32 = RmsNormBackward(g.To(Dtype::kF32), x.To(Dtype::kF32), w, r32.rstd);
  EXPECT_EQ(grads.grad_weight.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(grads.grad_x, g32.grad_x, 1e-2, 1e-2));
  EXPECT_TRUE(AllClose(grads.grad_weight, g32.grad_weight, 1e-5, 1e-5));
}

TEST(RmsNormTest, ErrorsNameTheOpAndShapes) {
  try {
    RmsNorm(Tensor::Zeros({2, 4}), Tensor::Zeros({2, 4}));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(), "[rms_norm] weight (2,4) does not match the last dimension of x (2,4)");
  }
  const Tensor x = Tensor::Zeros({2, 4});
  EXPECT_THROW(RmsNormBackward(x, x, Tensor(), Tensor::Zeros({2}, Dtype::kBF16)), OpError);
  EXPECT_THROW(RmsNormBackward(x.To(Dtype::kBF16), x, Tensor(), Tensor::Zeros({2})), OpError);
}

}  // namespace
}  // namespace tensor
