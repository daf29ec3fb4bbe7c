// BatchNorm1d forward and backward, with its CPU kernels: per-channel
// statistics in double (parallel over channels, in a fixed order, so results
// do not depend on the thread count), then an elementwise pass parallel over
// the (n, c) rows of L elements.
#include "nn/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/checkpoint.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/elementwise.h"
#include "tensor/thread_pool.h"

namespace nn {
namespace {

using tensor::Dtype;

constexpr const char* kOp = "batch_norm1d";

// Rows of L contiguous elements: row r = n * C + c holds channel c.
struct Layout {
  int64_t n, c, l;
  int64_t m() const { return n * l; }  // values per channel
};

// (C) f32 contiguous copy of a parameter or buffer (no copy when already so).
Tensor F32(const Tensor& t) { return t.To(Dtype::kF32).Contiguous(); }

// Calls fn(c, row pointer offset) for every row of channel c, n in order.
template <typename Fn>
void ForChannelRows(const Layout& s, int64_t c, Fn&& fn) {
  for (int64_t n = 0; n < s.n; ++n) fn((n * s.c + c) * s.l);
}

// Batch mean, biased and unbiased variance per channel (two passes, double).
void BatchStats(const float* x, const Layout& s, std::vector<double>* mean,
                std::vector<double>* var, std::vector<double>* var_unbiased) {
  const double m = static_cast<double>(s.m());
  tensor::ParallelFor(s.c, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0.0;
      ForChannelRows(s, c, [&](int64_t off) {
        for (int64_t i = 0; i < s.l; ++i) sum += x[off + i];
      });
      const double mu = sum / m;
      double sq = 0.0;
      ForChannelRows(s, c, [&](int64_t off) {
        for (int64_t i = 0; i < s.l; ++i) {
          const double d = x[off + i] - mu;
          sq += d * d;
        }
      });
      (*mean)[c] = mu;
      (*var)[c] = sq / m;
      (*var_unbiased)[c] = s.m() > 1 ? sq / (m - 1.0) : NAN;
    }
  });
}

// out[row, i] = (x[row, i] - mean[c]) * scale[c] + shift[c] (centered first:
// exact even when |mean| is much larger than the spread).
void Affine(const float* x, const Layout& s, const float* mean, const std::vector<float>& scale,
            const std::vector<float>& shift, float* out) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.l));
  tensor::ParallelFor(s.n * s.c, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % s.c;
      const float mu = mean[c], a = scale[c], b = shift[c];
      const float* px = x + r * s.l;
      float* po = out + r * s.l;
      for (int64_t i = 0; i < s.l; ++i) po[i] = (px[i] - mu) * a + b;
    }
  });
}

}  // namespace

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNorm1dOptions options)
    : Module("BatchNorm1d"), c_(num_features), options_(options) {
  OP_CHECK(num_features > 0, kOp, "num_features must be > 0; got ", num_features);
  OP_CHECK(std::isfinite(options.eps) && options.eps >= 0.0f, kOp,
           "eps must be finite and >= 0; got ", options.eps);
  OP_CHECK(options.momentum >= 0.0f && options.momentum <= 1.0f, kOp,
           "momentum must be in [0, 1]; got ", options.momentum);
  if (options.affine) {
    weight_ = RegisterParameter("weight", {c_}, InitSpec::Ones(), /*weight_decay=*/false);
    bias_ = RegisterParameter("bias", {c_}, InitSpec::Zeros(), /*weight_decay=*/false);
  }
  if (options.track_running_stats) {
    // Model state, like the parameters (not this thread's current category).
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    running_mean_ = RegisterBuffer("running_mean", Tensor::Zeros({c_}));
    running_var_ = RegisterBuffer("running_var", Tensor::Full({c_}, 1.0));
    num_batches_tracked_ = RegisterBuffer("num_batches_tracked", Tensor::Zeros({}, Dtype::kI64));
  }
}

Tensors BatchNorm1d::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x_in = inputs.at(0);
  OP_CHECK(x_in.defined() && (x_in.rank() == 2 || x_in.rank() == 3) && x_in.dim(1) == c_, kOp,
           "input ", x_in.defined() ? x_in.shape().ToString() : "undefined",
           " must be (N, C) or (N, C, L) with C = ", c_);
  OP_CHECK(x_in.device().is_cpu(), kOp, "input ", x_in.shape().ToString(),
           " must be on the CPU (no CUDA kernel yet)");
  OP_CHECK(tensor::IsFloatingPoint(x_in.dtype()), kOp, "input ", x_in.shape().ToString(),
           " has dtype ", tensor::DtypeName(x_in.dtype()), "; expected f32, bf16 or f16");
  const Layout s{x_in.dim(0), c_, x_in.rank() == 3 ? x_in.dim(2) : 1};
  const bool batch_stats = is_training() || !options_.track_running_stats;
  OP_CHECK(!batch_stats || s.m() > 1, kOp,
           "training needs more than 1 value per channel; got input ", x_in.shape().ToString());
  const Tensor x = x_in.To(Dtype::kF32).Contiguous();  // (N, C, L) f32, no copy when already so
  const float* px = x.data<float>();

  Tensor mean = Tensor::Empty({c_});  // (C)
  Tensor rstd = Tensor::Empty({c_});  // (C)
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  if (batch_stats) {
    std::vector<double> mu(c_), var(c_), var_unbiased(c_);
    BatchStats(px, s, &mu, &var, &var_unbiased);
    for (int64_t c = 0; c < c_; ++c) {
      pm[c] = static_cast<float>(mu[c]);
      pr[c] = static_cast<float>(1.0 / std::sqrt(var[c] + options_.eps));
    }
    if (is_training() && options_.track_running_stats && !IsRecomputing()) {
      const Tensor rm = F32(*running_mean_);
      const Tensor rv = F32(*running_var_);
      Tensor new_rm = Tensor::Empty({c_}), new_rv = Tensor::Empty({c_});
      const double mom = options_.momentum;
      for (int64_t c = 0; c < c_; ++c) {
        new_rm.data<float>()[c] =
            static_cast<float>((1.0 - mom) * rm.data<float>()[c] + mom * mu[c]);
        new_rv.data<float>()[c] =
            static_cast<float>((1.0 - mom) * rv.data<float>()[c] + mom * var_unbiased[c]);
      }
      running_mean_->CopyFrom(new_rm);
      running_var_->CopyFrom(new_rv);
      num_batches_tracked_->CopyFrom(
          Tensor::Full({}, num_batches_tracked_->Item() + 1, num_batches_tracked_->dtype()));
    }
  } else {
    const Tensor rm = F32(*running_mean_);
    const Tensor rv = F32(*running_var_);
    for (int64_t c = 0; c < c_; ++c) {
      pm[c] = rm.data<float>()[c];
      pr[c] = static_cast<float>(
          1.0 / std::sqrt(static_cast<double>(rv.data<float>()[c]) + options_.eps));
    }
  }

  // y = (x - mean) * (rstd * w) + b.
  std::vector<float> scale(c_), shift(c_);
  const Tensor w = weight_ != nullptr ? F32(weight_->value) : Tensor();
  const Tensor b = bias_ != nullptr ? F32(bias_->value) : Tensor();
  for (int64_t c = 0; c < c_; ++c) {
    const float wc = w.defined() ? w.data<float>()[c] : 1.0f;
    const float bc = b.defined() ? b.data<float>()[c] : 0.0f;
    scale[c] = pr[c] * wc;
    shift[c] = bc;
  }
  Tensor y = Tensor::Empty(x_in.shape());  // f32
  Affine(px, s, pm, scale, shift, y.data<float>());
  ctx.Save(Saved{x, mean, rstd, batch_stats, x_in.dtype(), x_in.shape()});
  return {y};
}

Tensors BatchNorm1d::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& sv = ctx.Saved<Saved>();
  const Tensor& g_in = grad_outputs.at(0);
  OP_CHECK(g_in.defined() && g_in.shape() == sv.input_shape, kOp, "grad ",
           g_in.defined() ? g_in.shape().ToString() : "undefined",
           " does not match the forward's input ", sv.input_shape.ToString());
  const Tensor g = g_in.To(Dtype::kF32).Contiguous();
  const Layout s{sv.input_shape[0], c_, sv.input_shape.rank() == 3 ? sv.input_shape[2] : 1};
  const float* px = sv.x.data<float>();
  const float* pg = g.data<float>();
  const float* pm = sv.mean.data<float>();
  const float* pr = sv.rstd.data<float>();

  // Per channel: sum(g) and sum(g * xhat), xhat = (x - mean) * rstd.
  std::vector<double> sum_g(c_), sum_gx(c_);
  tensor::ParallelFor(c_, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double a = 0.0, b = 0.0;
      const double mu = pm[c];
      ForChannelRows(s, c, [&](int64_t off) {
        for (int64_t i = 0; i < s.l; ++i) {
          a += pg[off + i];
          b += pg[off + i] * (px[off + i] - mu);
        }
      });
      sum_g[c] = a;
      sum_gx[c] = b * pr[c];
    }
  });
  if (weight_ != nullptr) {
    Tensor gw = Tensor::Empty({c_}), gb = Tensor::Empty({c_});
    for (int64_t c = 0; c < c_; ++c) {
      gw.data<float>()[c] = static_cast<float>(sum_gx[c]);
      gb.data<float>()[c] = static_cast<float>(sum_g[c]);
    }
    tensor::AddInPlace(weight_->GradBuffer(), gw);
    tensor::AddInPlace(bias_->GradBuffer(), gb);
  }

  // grad_x = w rstd (g - sum_g / M - xhat sum_gx / M) with batch statistics
  //        = w rstd g                                with running statistics,
  // written as grad_x = g * a + (x - mean) * b + k per channel.
  const Tensor w = weight_ != nullptr ? F32(weight_->value) : Tensor();
  const double m = static_cast<double>(s.m());
  std::vector<float> ka(c_), kb(c_), kk(c_);
  for (int64_t c = 0; c < c_; ++c) {
    const double scale = static_cast<double>(pr[c]) * (w.defined() ? w.data<float>()[c] : 1.0f);
    ka[c] = static_cast<float>(scale);
    if (sv.batch_stats) {
      const double xb = -scale * pr[c] * sum_gx[c] / m;  // coefficient of (x - mean)
      kb[c] = static_cast<float>(xb);
      kk[c] = static_cast<float>(-scale * sum_g[c] / m);
    } else {
      kb[c] = 0.0f;
      kk[c] = 0.0f;
    }
  }
  Tensor gx = Tensor::Empty(sv.input_shape);  // f32
  float* po = gx.data<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.l));
  tensor::ParallelFor(s.n * s.c, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % s.c;
      const float mu = pm[c], a = ka[c], b = kb[c], k = kk[c];
      const int64_t off = r * s.l;
      for (int64_t i = 0; i < s.l; ++i) po[off + i] = pg[off + i] * a + (px[off + i] - mu) * b + k;
    }
  });
  return {gx.To(sv.input_dtype)};
}

}  // namespace nn
