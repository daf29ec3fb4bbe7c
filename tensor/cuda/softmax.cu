// CUDA kernels: softmax over the last dimension (optional scale and causal
// mask) and its backward.
//
// A row per warp (rows of up to kWarpRowMaxCols elements, e.g. attention
// scores) or per block (longer rows). The forward reads the row twice: an
// online max / sum of exponentials (each thread keeps a running max and a sum
// rescaled when the max grows; the threads' pairs are combined by warp
// shuffles and shared memory), then exp(scale * x - max) / sum is written.
// Masked entries are not read and get exactly 0. 16-byte vector accesses where
// the pointers are aligned and the row length is a multiple of the vector
// width, scalar accesses otherwise; float math throughout.
#include <cmath>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/rows.cuh"
#include "tensor/cuda/softmax.h"

namespace tensor {
namespace cuda {
namespace {

using namespace rows;  // NOLINT: the shared row helpers (rows.cuh)

// Over the row's group (warp or block); every thread gets the same result.
// smem holds 2 * 32 floats.
template <bool kWarpRows>
__device__ __forceinline__ MaxSum GroupMaxSum(MaxSum a, float* smem) {
  a = WarpMaxSum(a);
  if constexpr (kWarpRows) return a;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // an earlier call's readers are done with smem
  if (lane == 0) {
    smem[warp] = a.m;
    smem[kWarp + warp] = a.s;
  }
  __syncthreads();
  const bool live = lane < blockDim.x / kWarp;
  a = {live ? smem[lane] : -INFINITY, live ? smem[kWarp + lane] : 0.0f};
  return WarpMaxSum(a);
}

// ---- Softmax kernels ----

// Keys row r may attend: all, or i + (T_k - T_q) + 1 under the causal mask.
__device__ __forceinline__ int64_t ValidCols(int64_t r, int64_t cols, int64_t causal_t_q) {
  if (causal_t_q <= 0) return cols;
  const int64_t n = r % causal_t_q + (cols - causal_t_q) + 1;
  return n < cols ? n : cols;
}

// n rounded up to a multiple of N, at most cols (cols is a multiple of N when N > 1).
template <int N>
__device__ __forceinline__ int64_t VecEnd(int64_t n, int64_t cols) {
  const int64_t e = (n + N - 1) / N * N;
  return e < cols ? e : cols;
}

// y = softmax(scale * x) per row; y may be x (each element is read by the
// thread that writes it, after the row's reduction).
template <bool kWarpRows, int N, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    SoftmaxForwardKernel(const T* x, T* y, int64_t rows, int64_t cols, int64_t causal_t_q,
                         float scale) {
  __shared__ float smem[2 * kWarp];
  const RowGroup<kWarpRows> g;
  const int64_t first = int64_t{g.rank} * N, step = int64_t{g.size} * N;
  for (int64_t r = g.FirstRow(); r < rows; r += g.RowStride()) {
    const int64_t n = ValidCols(r, cols, causal_t_q);
    const T* xr = x + r * cols;  // (cols)
    T* yr = y + r * cols;        // (cols)
    MaxSum ms{-INFINITY, 0.0f};
    const int64_t end = VecEnd<N>(n, cols);
    for (int64_t i = first; i < end; i += step) {
      float v[N];
      LoadF<N>(xr + i, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (i + k < n) Add(ms, v[k] * scale);
      }
    }
    ms = GroupMaxSum<kWarpRows>(ms, smem);
    const float inv = 1.0f / ms.s;
    for (int64_t i = first; i < cols; i += step) {
      float o[N];
      if (i < n) {
        float v[N];
        LoadF<N>(xr + i, v);
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = i + k < n ? expf(v[k] * scale - ms.m) * inv : 0.0f;
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = 0.0f;
      }
      StoreF<N>(yr + i, o);
    }
  }
}

// grad_x = scale * y * (grad_y - sum(grad_y * y)) per row; grad_x may be grad_y.
template <bool kWarpRows, int N, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    SoftmaxBackwardKernel(const T* gy, const T* y, T* gx, int64_t rows, int64_t cols,
                          int64_t causal_t_q, float scale) {
  __shared__ float smem[kWarp];
  const RowGroup<kWarpRows> g;
  const int64_t first = int64_t{g.rank} * N, step = int64_t{g.size} * N;
  for (int64_t r = g.FirstRow(); r < rows; r += g.RowStride()) {
    const int64_t n = ValidCols(r, cols, causal_t_q);
    const T* gr = gy + r * cols;  // (cols)
    const T* yr = y + r * cols;   // (cols)
    T* out = gx + r * cols;       // (cols)
    float dot[1] = {0.0f};
    const int64_t end = VecEnd<N>(n, cols);
    for (int64_t i = first; i < end; i += step) {
      float gv[N], yv[N];
      LoadF<N>(gr + i, gv);
      LoadF<N>(yr + i, yv);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (i + k < n) dot[0] += gv[k] * yv[k];
      }
    }
    g.Sum(dot, smem);
    for (int64_t i = first; i < cols; i += step) {
      float o[N];
      if (i < n) {
        float gv[N], yv[N];
        LoadF<N>(gr + i, gv);
        LoadF<N>(yr + i, yv);
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = i + k < n ? yv[k] * (gv[k] - dot[0]) * scale : 0.0f;
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] = 0.0f;
      }
      StoreF<N>(out + i, o);
    }
  }
}

// Rows and columns of x's last dimension.
void RowsCols(const Tensor& x, int64_t* rows, int64_t* cols) {
  *cols = x.rank() == 0 ? 1 : x.dim(-1);
  *rows = *cols == 0 ? 0 : x.numel() / *cols;
}

}  // namespace

void SoftmaxForward(const Tensor& x, const Tensor& y, int64_t causal_t_q, float scale) {
  const char* op = "softmax";
  SetDevice(x, op);
  int64_t rows, cols;
  RowsCols(x, &rows, &cols);
  if (rows == 0) return;
  DispatchFloat(x.dtype(), op, [&](auto tz) {
    using T = decltype(tz);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned16(x) && Aligned16(y);
    const RowPlan plan = PlanRows(rows, cols, vec ? kVec : 1);
    DispatchRows<kVec>(plan.warp_rows, vec, [&](auto warp_rows, auto n) {
      SoftmaxForwardKernel<decltype(warp_rows)::value, decltype(n)::value, T>
          <<<plan.grid, plan.block, 0, ComputeStream()>>>(Ptr<T>(x), Ptr<T>(y), rows, cols,
                                                          causal_t_q, scale);
    });
  });
  CheckLaunch(op);
}

void SoftmaxBackward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                     int64_t causal_t_q, float scale) {
  const char* op = "softmax_backward";
  SetDevice(y, op);
  int64_t rows, cols;
  RowsCols(y, &rows, &cols);
  if (rows == 0) return;
  DispatchFloat(y.dtype(), op, [&](auto tz) {
    using T = decltype(tz);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && Aligned16(grad_y) && Aligned16(y) && Aligned16(grad_x);
    const RowPlan plan = PlanRows(rows, cols, vec ? kVec : 1);
    DispatchRows<kVec>(plan.warp_rows, vec, [&](auto warp_rows, auto n) {
      SoftmaxBackwardKernel<decltype(warp_rows)::value, decltype(n)::value, T>
          <<<plan.grid, plan.block, 0, ComputeStream()>>>(Ptr<T>(grad_y), Ptr<T>(y), Ptr<T>(grad_x),
                                                          rows, cols, causal_t_q, scale);
    });
  });
  CheckLaunch(op);
}

}  // namespace cuda
}  // namespace tensor
