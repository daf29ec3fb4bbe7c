// LayerNorm / RMSNorm kernels. One template serves both (kCentered: subtract
// the mean, as LayerNorm does). Rows are converted to float once (bf16 / f16)
// and every pass runs on 8-wide vectors (tensor/cpu/vec8.h).
#include "tensor/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace cpu {
namespace {

using vec::F8;
using vec::LoadAs;
using vec::Splat;
using vec::StoreAs;

// Rows per block of the param-grad partial sums: fixed, so the summation order
// depends only on the shapes.
constexpr int64_t kBlockRows = 64;

// mean (kCentered) or 0 from the row's sum, and 1 / sqrt(mean((x - mean)^2) + eps).
template <bool kCentered>
inline void RowStats(const float* xr, float sum, int64_t c, float eps, float* mean,
                     float* rstd) {
  const float m = kCentered ? sum / static_cast<float>(c) : 0.0f;
  const F8 mv = Splat(m);
  F8 acc = Splat(0.0f);
  vec::ForEachBlock(c, [&](int64_t i, auto k) {
    const F8 d = LoadAs(xr + i, k, m) - mv;  // padding lanes hold m: d = 0
    acc += d * d;
  });
  *mean = m;
  *rstd = 1.0f / std::sqrt(vec::HSum(acc) / static_cast<float>(c) + eps);
}

// y = (x - mean) * rstd * w (+ b). mean and bias are null for RMSNorm.
template <typename T, bool kCentered>
void ForwardRows(const T* x, const float* w, const float* b, float eps, T* y, float* mean,
                 float* rstd, int64_t rows, int64_t c) {
  ParallelFor(rows, vec::RowGrain(c), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : c);
    for (int64_t r = begin; r < end; ++r) {
      // Three passes: (convert and) sum, squared deviations, normalize (and convert).
      float sum, m, rs;
      const float* xr = vec::RowAsFloatSum(x + r * c, c, scratch.data(), &sum);  // (C)
      RowStats<kCentered>(xr, sum, c, eps, &m, &rs);
      T* out = y + r * c;  // (C)
      const F8 mv = Splat(m), rv = Splat(rs);
      vec::ForEachBlock(c, [&](int64_t i, auto k) {
        F8 v = (LoadAs(xr + i, k) - mv) * rv * LoadAs(w + i, k);
        if constexpr (kCentered) v += LoadAs(b + i, k);
        vec::StoreAs(out + i, v, k);
      });
      if constexpr (kCentered) mean[r] = m;
      rstd[r] = rs;
    }
  });
}

// grad_x per row and param-grad partial sums per block of kBlockRows rows:
//   xhat = (x - mean) * rstd, dxhat = grad_y * w,
//   grad_x = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   (RMSNorm: no mean(dxhat) term), grad_w += grad_y * xhat, grad_b += grad_y.
// add (nullable): grad_x += add, in fp32 before grad_x is rounded.
template <typename T, bool kCentered>
void BackwardRows(const T* gy, const T* x, const float* w, const float* mean, const float* rstd,
                  const T* add, T* gx, float* gw, float* gb, int64_t rows, int64_t c) {
  constexpr int64_t kParams = kCentered ? 2 : 1;
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  // (blocks, kParams, C): per block, the partial sums of grad_w (and grad_b).
  Tensor partial = Tensor::Empty({blocks, kParams, c});
  float* part = partial.data<float>();
  const float inv_c = 1.0f / static_cast<float>(c);
  ParallelFor(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    const bool convert = !std::is_same_v<T, float>;
    std::vector<float> x_buf(convert ? c : 0), g_buf(convert ? c : 0);
    std::vector<float> a_buf(convert && add != nullptr ? c : 0);
    for (int64_t blk = block_begin; blk < block_end; ++blk) {
      float* pw = part + blk * kParams * c;  // (C)
      float* pb = pw + c;                    // (C), LayerNorm only
      std::fill(pw, pw + kParams * c, 0.0f);
      const int64_t row_end = std::min(rows, (blk + 1) * kBlockRows);
      for (int64_t r = blk * kBlockRows; r < row_end; ++r) {
        const float* xr = vec::RowAsFloat(x + r * c, c, x_buf.data());  // (C)
        const float* g = vec::RowAsFloat(gy + r * c, c, g_buf.data());  // (C)
        const F8 mv = Splat(kCentered ? mean[r] : 0.0f), rv = Splat(rstd[r]);
        F8 sum_dxhat = Splat(0.0f), sum_dxhat_xhat = Splat(0.0f);
        vec::ForEachBlock(c, [&](int64_t i, auto k) {
          const F8 xhat = (LoadAs(xr + i, k) - mv) * rv;
          const F8 gv = LoadAs(g + i, k);  // padding lanes 0: they add nothing
          const F8 dxhat = gv * LoadAs(w + i, k);
          sum_dxhat += dxhat;
          sum_dxhat_xhat += dxhat * xhat;
          StoreAs(pw + i, LoadAs(pw + i, k) + gv * xhat, k);
          if constexpr (kCentered) StoreAs(pb + i, LoadAs(pb + i, k) + gv, k);
        });
        const F8 a = Splat(kCentered ? vec::HSum(sum_dxhat) * inv_c : 0.0f);
        const F8 bc = Splat(vec::HSum(sum_dxhat_xhat) * inv_c);
        T* out = gx + r * c;  // (C)
        if (add == nullptr) {
          vec::ForEachBlock(c, [&](int64_t i, auto k) {
            const F8 xhat = (LoadAs(xr + i, k) - mv) * rv;
            const F8 dxhat = LoadAs(g + i, k) * LoadAs(w + i, k);
            vec::StoreAs(out + i, rv * (dxhat - a - xhat * bc), k);
          });
        } else {
          const float* ar = vec::RowAsFloat(add + r * c, c, a_buf.data());  // (C)
          vec::ForEachBlock(c, [&](int64_t i, auto k) {
            const F8 xhat = (LoadAs(xr + i, k) - mv) * rv;
            const F8 dxhat = LoadAs(g + i, k) * LoadAs(w + i, k);
            vec::StoreAs(out + i, LoadAs(ar + i, k) + rv * (dxhat - a - xhat * bc), k);
          });
        }
      }
    }
  });
  // Sum the blocks in order, in double, a range of columns per chunk.
  ParallelFor(c, 1024, [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(c1 - c0);
    for (int64_t p = 0; p < kParams; ++p) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const float* src = part + (blk * kParams + p) * c;
        for (int64_t j = c0; j < c1; ++j) acc[j - c0] += src[j];
      }
      float* dst = p == 0 ? gw : gb;
      for (int64_t j = c0; j < c1; ++j) dst[j] = static_cast<float>(acc[j - c0]);
    }
  });
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const int64_t c = x.dim(-1);
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  DispatchFloating("layer_norm", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ForwardRows<T, true>(x.data<T>(), weight.data<float>(), bias.data<float>(), eps,
                         y.data<T>(), mean.data<float>(), rstd.data<float>(), rows, c);
  });
}

void LayerNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, const Tensor& add,
                       const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  const int64_t c = x.dim(-1);
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  DispatchFloating("layer_norm_backward", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BackwardRows<T, true>(grad_y.data<T>(), x.data<T>(), weight.data<float>(), mean.data<float>(),
                          rstd.data<float>(), add.defined() ? add.data<T>() : nullptr,
                          grad_x.data<T>(), grad_weight.data<float>(), grad_bias.data<float>(),
                          rows, c);
  });
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd) {
  const int64_t c = x.dim(-1);
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  DispatchFloating("rms_norm", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ForwardRows<T, false>(x.data<T>(), weight.data<float>(), nullptr, eps, y.data<T>(),
                          nullptr, rstd.data<float>(), rows, c);
  });
}

void RmsNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Tensor& rstd, const Tensor& add, const Tensor& grad_x,
                     const Tensor& grad_weight) {
  const int64_t c = x.dim(-1);
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  DispatchFloating("rms_norm_backward", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BackwardRows<T, false>(grad_y.data<T>(), x.data<T>(), weight.data<float>(), nullptr,
                           rstd.data<float>(), add.defined() ? add.data<T>() : nullptr,
                           grad_x.data<T>(), grad_weight.data<float>(), nullptr, rows, c);
  });
}

}  // namespace cpu
}  // namespace tensor
