// Softmax kernels: per row, max (of scale * x), exp and sum, normalize; the
// backward is one dot product and one pass. Rows are converted to float once
// (bf16 / f16) and the passes run on 8-wide vectors (tensor/cpu/vec8.h).
#include "tensor/cpu/softmax.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace cpu {
namespace {

// Keys row r may attend: all of them, or i + (T_k - T_q) + 1 under the causal mask.
inline int64_t ValidCols(const SoftmaxShape& s, int64_t r) {
  if (s.causal_t_q <= 0) return s.cols;
  return std::min(s.cols, r % s.causal_t_q + (s.cols - s.causal_t_q) + 1);
}

template <typename T>
void ForwardRows(const T* x, T* y, const SoftmaxShape& s, float scale) {
  const int64_t cols = s.cols;
  ParallelFor(s.rows, vec::RowGrain(cols), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(std::is_same_v<T, float> ? 0 : cols);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = ValidCols(s, r);
      if (n > 0) {
        // Three passes: (convert and) max, exp and sum, normalize (and convert).
        float m;
        const float* xr =
            vec::RowAsFloatScaledMax(x + r * cols, n, scratch.data(), scale, &m);  // (n)
        float* e = vec::OutRowAsFloat(y + r * cols, scratch.data());  // (n), may alias xr
        const float sum = vec::RowExpSum(xr, scale, m, e, n);
        vec::StoreRowScaled(e, 1.0f / sum, y + r * cols, n);
      }
      vec::ZeroRow(y + r * cols + n, cols - n);
    }
  });
}

template <typename T>
void BackwardRows(const T* gy, const T* y, T* gx, const SoftmaxShape& s, float scale) {
  const int64_t cols = s.cols;
  ParallelFor(s.rows, vec::RowGrain(cols, 16384), [&](int64_t begin, int64_t end) {
    const bool convert = !std::is_same_v<T, float>;
    std::vector<float> g_buf(convert ? cols : 0), y_buf(convert ? cols : 0);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = ValidCols(s, r);
      const float* g = vec::RowAsFloat(gy + r * cols, n, g_buf.data());  // (n)
      const float* yr = vec::RowAsFloat(y + r * cols, n, y_buf.data());  // (n)
      T* out = gx + r * cols;                                            // (cols)
      const vec::F8 dot = vec::Splat(vec::RowDot(g, yr, n));
      const vec::F8 sc = vec::Splat(scale);
      vec::ForEachBlock(n, [&](int64_t i, auto k) {
        const vec::F8 v = vec::LoadAs(yr + i, k) * (vec::LoadAs(g + i, k) - dot);
        vec::StoreAs(out + i, v * sc, k);
      });
      vec::ZeroRow(out + n, cols - n);
    }
  });
}

}  // namespace

void SoftmaxForward(const Tensor& x, const Tensor& y, const SoftmaxShape& shape, float scale) {
  DispatchFloating("softmax", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ForwardRows<T>(x.data<T>(), y.data<T>(), shape, scale);
  });
}

void SoftmaxBackward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                     const SoftmaxShape& shape, float scale) {
  DispatchFloating("softmax_backward", y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BackwardRows<T>(grad_y.data<T>(), y.data<T>(), grad_x.data<T>(), shape, scale);
  });
}

}  // namespace cpu
}  // namespace tensor
