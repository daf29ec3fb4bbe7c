// BatchNorm: argument checks, then the CUDA kernels (tensor/cuda/batch_norm.h)
// for tensors on a GPU, or the CPU kernels below: per-channel statistics in
// double (parallel over channels, each channel's values in a fixed order),
// then an elementwise pass parallel over the (n, c) rows of L elements.
#include "tensor/ops/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cuda/batch_norm.h"
#include "tensor/ops/check.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace {

// Rows of L contiguous elements: row r = n * C + c holds channel c.
struct Layout {
  int64_t n, c, l;
  explicit Layout(const Tensor& x) : n(x.dim(0)), c(x.dim(1)), l(x.rank() == 3 ? x.dim(2) : 1) {}
  int64_t m() const { return n * l; }  // values per channel
};

// ---- Checks ----

// t is defined and on x's device.
void CheckDevice(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  OP_CHECK(t.defined(), op, name, " is undefined");
  OP_CHECK(t.device() == x.device(), op, name, " ", t.shape().ToString(), " is on ",
           t.device().ToString(), " but x ", x.shape().ToString(), " is on ",
           x.device().ToString());
}

void CheckInput(const char* op, const Tensor& x) {
  OP_CHECK(x.defined() && (x.rank() == 2 || x.rank() == 3) && x.dim(1) > 0, op, "x ",
           x.defined() ? x.shape().ToString() : "undefined",
           " must be (N, C) or (N, C, L) with C > 0");
  OP_CHECK(x.dtype() == Dtype::kF32, op, Describe("x", x), " must be f32");
}

// A (C) f32 per-channel tensor on x's device (contiguous when `in_place`).
void CheckChannels(const char* op, const char* name, const Tensor& t, const Tensor& x,
                   bool in_place = false) {
  CheckDevice(op, name, t, x);
  OP_CHECK(t.rank() == 1 && t.dim(0) == x.dim(1) && t.dtype() == Dtype::kF32, op, Describe(name, t),
           " does not match x ", x.shape().ToString(), ": expected (", x.dim(1), ") f32");
  OP_CHECK(!in_place || t.is_contiguous(), op, name, " must be contiguous (updated in place)");
}

Tensor ContiguousOrUndefined(const Tensor& t) { return t.defined() ? t.Contiguous() : t; }

// ---- CPU kernels ----

// Calls fn(row offset) for every row of channel c, n in order.
template <typename Fn>
void ForChannelRows(const Layout& s, int64_t c, Fn&& fn) {
  for (int64_t n = 0; n < s.n; ++n) fn((n * s.c + c) * s.l);
}

// Batch mean, biased and unbiased variance per channel (two passes, double).
void BatchStats(const float* x, const Layout& s, std::vector<double>* mean,
                std::vector<double>* var, std::vector<double>* var_unbiased) {
  const double m = static_cast<double>(s.m());
  ParallelFor(s.c, 1, [&](int64_t c0, int64_t c1) {
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
  ParallelFor(s.n * s.c, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % s.c;
      const float mu = mean[c], a = scale[c], b = shift[c];
      const float* px = x + r * s.l;
      float* po = out + r * s.l;
      for (int64_t i = 0; i < s.l; ++i) po[i] = (px[i] - mu) * a + b;
    }
  });
}

void CpuForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                const BatchNormRunningStats& running, bool training, float momentum, float eps,
                const BatchNormResult& out) {
  const Layout s(x);
  const float* px = x.data<float>();
  float* pm = out.mean.data<float>();
  float* pr = out.rstd.data<float>();
  if (training) {
    std::vector<double> mu(s.c), var(s.c), var_unbiased(s.c);
    BatchStats(px, s, &mu, &var, &var_unbiased);
    for (int64_t c = 0; c < s.c; ++c) {
      pm[c] = static_cast<float>(mu[c]);
      pr[c] = static_cast<float>(1.0 / std::sqrt(var[c] + eps));
    }
    if (running.mean.defined()) {
      float* rm = running.mean.data<float>();
      float* rv = running.var.data<float>();
      const double mom = momentum;
      for (int64_t c = 0; c < s.c; ++c) {
        rm[c] = static_cast<float>((1.0 - mom) * rm[c] + mom * mu[c]);
        rv[c] = static_cast<float>((1.0 - mom) * rv[c] + mom * var_unbiased[c]);
      }
      if (running.num_batches_tracked.defined()) {
        *running.num_batches_tracked.data<int64_t>() += 1;
      }
    }
  } else {
    const float* rm = running.mean.data<float>();
    const float* rv = running.var.data<float>();
    for (int64_t c = 0; c < s.c; ++c) {
      pm[c] = rm[c];
      pr[c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(rv[c]) + eps));
    }
  }
  // y = (x - mean) * (rstd * w) + b.
  std::vector<float> scale(s.c), shift(s.c);
  for (int64_t c = 0; c < s.c; ++c) {
    scale[c] = pr[c] * (weight.defined() ? weight.data<float>()[c] : 1.0f);
    shift[c] = bias.defined() ? bias.data<float>()[c] : 0.0f;
  }
  Affine(px, s, pm, scale, shift, out.y.data<float>());
}

void CpuBackward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                 const Tensor& rstd, bool training, const BatchNormGrads& out) {
  const Layout s(x);
  const float* px = x.data<float>();
  const float* pg = g.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();

  // Per channel: sum(g) and sum(g * xhat), xhat = (x - mean) * rstd.
  std::vector<double> sum_g(s.c), sum_gx(s.c);
  ParallelFor(s.c, 1, [&](int64_t c0, int64_t c1) {
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
  for (int64_t c = 0; c < s.c; ++c) {
    out.grad_weight.data<float>()[c] = static_cast<float>(sum_gx[c]);
    out.grad_bias.data<float>()[c] = static_cast<float>(sum_g[c]);
  }

  // grad_x = w rstd (g - sum_g / M - xhat sum_gx / M) with batch statistics
  //        = w rstd g                                with running statistics,
  // written as grad_x = g * a + (x - mean) * b + k per channel.
  const double m = static_cast<double>(s.m());
  std::vector<float> ka(s.c), kb(s.c), kk(s.c);
  for (int64_t c = 0; c < s.c; ++c) {
    const double scale =
        static_cast<double>(pr[c]) * (weight.defined() ? weight.data<float>()[c] : 1.0f);
    ka[c] = static_cast<float>(scale);
    kb[c] = training ? static_cast<float>(-scale * pr[c] * sum_gx[c] / m) : 0.0f;
    kk[c] = training ? static_cast<float>(-scale * sum_g[c] / m) : 0.0f;
  }
  float* po = out.grad_x.data<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.l));
  ParallelFor(s.n * s.c, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r % s.c;
      const float mu = pm[c], a = ka[c], b = kb[c], k = kk[c];
      const int64_t off = r * s.l;
      for (int64_t i = 0; i < s.l; ++i) po[off + i] = pg[off + i] * a + (px[off + i] - mu) * b + k;
    }
  });
}

}  // namespace

BatchNormResult BatchNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const BatchNormRunningStats& running, bool training, float momentum,
                          float eps) {
  const char* op = "batch_norm";
  CheckInput(op, x);
  if (weight.defined()) CheckChannels(op, "weight", weight, x);
  if (bias.defined()) CheckChannels(op, "bias", bias, x);
  OP_CHECK(std::isfinite(eps) && eps >= 0.0f, op, "eps must be finite and >= 0; got ", eps);
  OP_CHECK(momentum >= 0.0f && momentum <= 1.0f, op, "momentum must be in [0, 1]; got ", momentum);
  const Layout s(x);
  const bool has_running = running.mean.defined() || running.var.defined();
  if (training) {
    OP_CHECK(s.m() > 1, op, "training needs more than 1 value per channel; got x ",
             x.shape().ToString());
  } else {
    OP_CHECK(has_running, op, "eval needs running_mean and running_var");
  }
  if (has_running) {
    CheckChannels(op, "running_mean", running.mean, x, /*in_place=*/training);
    CheckChannels(op, "running_var", running.var, x, /*in_place=*/training);
    const Tensor& nbt = running.num_batches_tracked;
    if (training && nbt.defined()) {
      CheckDevice(op, "num_batches_tracked", nbt, x);
      OP_CHECK(nbt.numel() == 1 && nbt.dtype() == Dtype::kI64, op,
               Describe("num_batches_tracked", nbt), " must be a () i64 counter");
    }
  }

  BatchNormResult out;
  out.y = Tensor::Empty(x.shape(), Dtype::kF32, x.device());
  out.mean = Tensor::Empty({s.c}, Dtype::kF32, x.device());
  out.rstd = Tensor::Empty({s.c}, Dtype::kF32, x.device());
  const Tensor xc = x.Contiguous();
  const Tensor wc = ContiguousOrUndefined(weight);
  const Tensor bc = ContiguousOrUndefined(bias);
  // Training updates the running statistics in place; eval only reads them.
  BatchNormRunningStats run;
  if (has_running) {
    run.mean = training ? running.mean : running.mean.Contiguous();
    run.var = training ? running.var : running.var.Contiguous();
    if (training) run.num_batches_tracked = running.num_batches_tracked;
  }
  if (x.device().is_cuda()) {
    cuda::BatchNormForward(xc, wc, bc, run.mean, run.var, run.num_batches_tracked, training,
                           momentum, eps, out.y, out.mean, out.rstd);
  } else {
    CpuForward(xc, wc, bc, run, training, momentum, eps, out);
  }
  return out;
}

BatchNormGrads BatchNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, bool training) {
  const char* op = "batch_norm_backward";
  CheckInput(op, x);
  CheckDevice(op, "grad_y", grad_y, x);
  CheckSameShape(op, grad_y, x);
  CheckSameDtype(op, grad_y, x);
  if (weight.defined()) CheckChannels(op, "weight", weight, x);
  CheckChannels(op, "mean", mean, x);
  CheckChannels(op, "rstd", rstd, x);
  const int64_t c = x.dim(1);
  BatchNormGrads out;
  out.grad_x = Tensor::Empty(x.shape(), Dtype::kF32, x.device());
  out.grad_weight = Tensor::Empty({c}, Dtype::kF32, x.device());
  out.grad_bias = Tensor::Empty({c}, Dtype::kF32, x.device());
  const Tensor wc = ContiguousOrUndefined(weight);
  if (x.device().is_cuda()) {
    cuda::BatchNormBackward(grad_y.Contiguous(), x.Contiguous(), wc, mean.Contiguous(),
                            rstd.Contiguous(), training, out.grad_x, out.grad_weight,
                            out.grad_bias);
  } else {
    CpuBackward(grad_y.Contiguous(), x.Contiguous(), wc, mean.Contiguous(), rstd.Contiguous(),
                training, out);
  }
  return out;
}

}  // namespace tensor
