// CUDA kernels: LayerNorm and RMSNorm over the last dimension (one template
// serves both; kCentered subtracts the mean, as LayerNorm does).
//
// Forward and grad_x: a row per warp (rows of up to kWarpRowMaxCols elements)
// or per block (longer rows), float accumulation, reductions by warp shuffles
// (and shared memory across warps); 16-byte vector loads where every pointer
// is aligned and C is a multiple of the vector width, scalar loads otherwise.
// The row is read from global memory once. Warp rows of bf16 / f16 in 16-byte
// packs are held in the lanes' registers (rows.cuh's LanePacks, at most 4
// packs a lane): every load of a row issued at its start, the later passes
// reading registers (SetNormHoldRows); other rows' later passes hit L1/L2.
//
// Parameter gradients (column sums over rows) without atomics: partial sums
// per block of rows, then a column kernel that adds them in order in double.
// Rows of up to kWarpRowMaxCols: the grad_x kernel itself adds its warps' rows
// into the partial sums (one read of grad_y and x; each warp's sums in its
// own slice of shared memory); longer rows: a partial-sum kernel over a grid
// of (32-column tiles) x (fixed chunks of rows).
// Deterministic: the summation order depends only on the shapes.
#include <atomic>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/rows.cuh"
#include "tensor/cuda/norm.h"

namespace tensor {
namespace cuda {
namespace {

using namespace rows;  // NOLINT: the shared row helpers (rows.cuh)

// ---- Norm kernels ----

template <typename W>
const W* ParamPtr(const Tensor& p) {
  return p.defined() ? Ptr<W>(p) : nullptr;
}

// N elements of a parameter (or `fill` when it is absent).
template <int N, typename W>
__device__ __forceinline__ void LoadParam(const W* p, int64_t i, float fill, float (&out)[N]) {
  if (p != nullptr) {
    LoadF<N>(p + i, out);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = fill;
  }
}

// y = (x - mean) * rstd * w (+ b), saving mean (kCentered) and rstd. kHeld > 0
// (warp rows): the lane's packs of x held in registers (LanePacks).
template <bool kCentered, bool kWarpRows, int N, int kHeld, typename T, typename W>
__global__ void __launch_bounds__(kHeld > 0 ? kWarp * kWarpRowsPerBlock : kMaxRowThreads)
    NormForwardKernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                      float eps, T* __restrict__ y, float* __restrict__ mean,
                      float* __restrict__ rstd, int64_t rows, int64_t c) {
  static_assert(kHeld == 0 || kWarpRows, "a block row does not fit a lane's registers");
  __shared__ float smem[kWarp];
  const RowGroup<kWarpRows> g;
  const int64_t first = int64_t{g.rank} * N, step = int64_t{g.size} * N;
  const float fc = static_cast<float>(c);
  for (int64_t r = g.FirstRow(); r < rows; r += g.RowStride()) {
    const T* xr = x + r * c;  // (C)
    LanePacks<kHeld, N, T> xp(xr, first, step, c);
    float m = 0.0f;
    if constexpr (kCentered) {
      float s[1] = {0.0f};
      ForPacks<kHeld>(first, step, c, [&](int it, int64_t i) {
        float v[N];
        xp.Get(it, i, v);
#pragma unroll
        for (int k = 0; k < N; ++k) s[0] += v[k];
      });
      g.Sum(s, smem);
      m = s[0] / fc;
      xp.Refresh();
    }
    // Squared deviations from the mean (two passes: no cancellation).
    float ss[1] = {0.0f};
    ForPacks<kHeld>(first, step, c, [&](int it, int64_t i) {
      float v[N];
      xp.Get(it, i, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float d = v[k] - m;
        ss[0] += d * d;
      }
    });
    g.Sum(ss, smem);
    xp.Refresh();
    const float rs = 1.0f / sqrtf(ss[0] / fc + eps);
    T* yr = y + r * c;  // (C)
    ForPacks<kHeld>(first, step, c, [&](int it, int64_t i) {
      float v[N], wv[N], o[N];
      xp.Get(it, i, v);
      LoadParam<N>(w, i, 1.0f, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] = (v[k] - m) * rs * wv[k];
      if constexpr (kCentered) {
        float bv[N];
        LoadParam<N>(b, i, 0.0f, bv);
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] += bv[k];
      }
      StoreF<N>(yr + i, o);
    });
    if (g.rank == 0) {
      if constexpr (kCentered) mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// Blocks of the backward with the parameter-gradient partial sums
// (kPartials): kPartialWarps warps, each adding its rows' sums per column
// into its own slice of shared memory, then the block's warps added in order
// into one partial row. (The sums were in registers, 2 x 32 floats a lane:
// 124 registers a thread, 16 warps an SM on sm_90.)
constexpr int kPartialWarps = 4;

// grad_x per row: xhat = (x - mean) * rstd, dxhat = grad_y * w,
// grad_x = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
// (RMSNorm: no mean(dxhat) term); add (nullable): grad_x += add, in fp32.
// kHeld > 0 (warp rows): the lane's packs of grad_y, x and add held in
// registers (LanePacks), all three loaded at the row's start.
// kPartials (rows of a warp, C <= kWarpRowMaxCols): also the block's partial
// sums of the parameter gradients, part (kParams, gridDim.x, C): over the
// rows the block's warps visit (warp k of block b: rows (b kPartialWarps + k)
// + j gridDim.x kPartialWarps), grad_y * xhat (param 0, grad_weight) and
// grad_y (param 1, LayerNorm's grad_bias). Each lane adds its columns over
// its warp's rows in order, then the warps are added in order: the sums
// depend on the shapes and the grid only. This replaces a partial-sum kernel
// that read grad_y and x again.
template <bool kCentered, bool kWarpRows, int N, int kHeld, typename T, typename W,
          bool kPartials = false>
__global__ void __launch_bounds__(kPartials   ? kWarp * kPartialWarps
                                  : kHeld > 0 ? kWarp * kWarpRowsPerBlock
                                              : kMaxRowThreads)
    NormBackwardKernel(const T* __restrict__ gy, const T* __restrict__ x, const W* __restrict__ w,
                       const float* __restrict__ mean, const float* __restrict__ rstd,
                       const T* __restrict__ add, T* __restrict__ gx, int64_t rows, int64_t c,
                       float* __restrict__ part = nullptr) {
  static_assert(!kPartials || kWarpRows, "partial sums per warp need rows of a warp");
  static_assert(kHeld == 0 || kWarpRows, "a block row does not fit a lane's registers");
  constexpr int kParams = kCentered ? 2 : 1;
  __shared__ float smem[2 * kWarp];
  // kPartials: each warp's sums of each parameter, [kParams][kPartialWarps][kWarpRowMaxCols]
  // (32 KiB for LayerNorm); a lane only touches its own columns of its warp's slice.
  __shared__ float lanes[kPartials ? kParams : 1][kPartials ? kPartialWarps : 1]
                        [kPartials ? kWarpRowMaxCols : 1];
  const RowGroup<kWarpRows> g;
  const int warp = threadIdx.x / kWarp;
  const int64_t first = int64_t{g.rank} * N, step = int64_t{g.size} * N;
  const float inv_c = 1.0f / static_cast<float>(c);
  if constexpr (kPartials) {
    ForPacks<kHeld>(first, step, c, [&](int, int64_t i) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
#pragma unroll
        for (int p = 0; p < kParams; ++p) lanes[p][warp][i + k] = 0.0f;
      }
    });
  }
  for (int64_t r = g.FirstRow(); r < rows; r += g.RowStride()) {
    LanePacks<kHeld, N, T> xp(x + r * c, first, step, c);   // (C)
    LanePacks<kHeld, N, T> gp(gy + r * c, first, step, c);  // (C)
    const LanePacks<kHeld, N, T> ap(add != nullptr ? add + r * c : nullptr, first, step,
                                    add != nullptr ? c : 0);  // (C) or nothing
    const float m = kCentered ? mean[r] : 0.0f, rs = rstd[r];
    float sums[2] = {0.0f, 0.0f};  // sum(dxhat), sum(dxhat * xhat)
    ForPacks<kHeld>(first, step, c, [&](int it, int64_t i) {
      float xv[N], gv[N], wv[N];
      xp.Get(it, i, xv);
      gp.Get(it, i, gv);
      LoadParam<N>(w, i, 1.0f, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float dxhat = gv[k] * wv[k];
        sums[0] += dxhat;
        sums[1] += dxhat * ((xv[k] - m) * rs);
      }
    });
    g.Sum(sums, smem);
    xp.Refresh();
    gp.Refresh();
    const float a = kCentered ? sums[0] * inv_c : 0.0f, bc = sums[1] * inv_c;
    T* out = gx + r * c;  // (C)
    ForPacks<kHeld>(first, step, c, [&](int it, int64_t i) {
      float xv[N], gv[N], wv[N], xhat[N], o[N];
      xp.Get(it, i, xv);
      gp.Get(it, i, gv);
      LoadParam<N>(w, i, 1.0f, wv);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        xhat[k] = (xv[k] - m) * rs;
        o[k] = rs * (gv[k] * wv[k] - a - xhat[k] * bc);
      }
      if (add != nullptr) {
        float av[N];
        ap.Get(it, i, av);
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] += av[k];
      }
      StoreF<N>(out + i, o);
      if constexpr (kPartials) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
          lanes[0][warp][i + k] += gv[k] * xhat[k];
          if constexpr (kCentered) lanes[kParams - 1][warp][i + k] += gv[k];
        }
      }
    });
  }
  if constexpr (kPartials) {
    // The block's warps added in order.
    __syncthreads();
    const int64_t blocks = gridDim.x;
    for (int p = 0; p < kParams; ++p) {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < kPartialWarps; ++k) sum += lanes[p][k][j];
        part[(p * blocks + blockIdx.x) * c + j] = sum;
      }
    }
  }
}

constexpr int kColTile = 32;  // columns per partial-sum block (a warp's width)
constexpr int kRowLanes = 8;  // rows in flight per partial-sum block
constexpr int64_t kMaxChunks = 512;

// Rows per chunk of the parameter-gradient partial sums: at least 64, and at
// most kMaxChunks chunks (bounds the scratch to kMaxChunks x C floats a param).
int64_t RowsPerChunk(int64_t rows) {
  const int64_t by_count = (rows + kMaxChunks - 1) / kMaxChunks;
  return by_count > 64 ? by_count : 64;
}

// part (kParams, chunks, C): per chunk of rows, the column sums of
// grad_y * xhat (param 0, grad_weight) and of grad_y (param 1, LayerNorm's
// grad_bias). Block: kColTile columns x kRowLanes row lanes; grid (column
// tiles, chunks). Each row lane adds every kRowLanes-th row of the chunk, then
// the lanes are added in order.
template <bool kCentered, typename T>
__global__ void __launch_bounds__(kColTile* kRowLanes)
    NormParamPartialKernel(const T* __restrict__ gy, const T* __restrict__ x,
                           const float* __restrict__ mean, const float* __restrict__ rstd,
                           float* __restrict__ part, int64_t rows, int64_t c,
                           int64_t rows_per_chunk) {
  __shared__ float sw[kRowLanes][kColTile];
  __shared__ float sb[kRowLanes][kColTile];
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const int64_t col = int64_t{blockIdx.x} * kColTile + tx;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float aw = 0.0f, ab = 0.0f;
  if (col < c) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const float gv = ToF(gy[r * c + col]);
      const float xhat = (ToF(x[r * c + col]) - (kCentered ? mean[r] : 0.0f)) * rstd[r];
      aw += gv * xhat;
      ab += gv;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && col < c) {
    float w = 0.0f, b = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) {
      w += sw[k][tx];
      b += sb[k][tx];
    }
    part[chunk * c + col] = w;
    if constexpr (kCentered) part[(chunks + chunk) * c + col] = b;
  }
}

// out_p[j] = sum over chunks of part[p, chunk, j] for parameter p =
// blockIdx.y (out_0 grad_weight, out_1 grad_bias; null: not wanted), in
// double; with add_p, out_p[j] += that sum (in f32) instead. Block: kColTile
// columns x kRowLanes lanes; lane k adds chunks k, k + kRowLanes, ... in
// order, then the lanes are added in order: a fixed order, the same bits
// every run. (One thread per column adding all the chunks took
// 22 us a parameter on the H200 for C = 768: 3 blocks in flight.)
template <typename Out>
__global__ void __launch_bounds__(kColTile* kRowLanes)
    ColumnSumKernel(const float* __restrict__ part, int64_t chunks, int64_t c, Out* out_0,
                    Out* out_1, bool add_0, bool add_1) {
  __shared__ double lanes[kRowLanes][kColTile];
  Out* out = blockIdx.y == 0 ? out_0 : out_1;
  const bool add = blockIdx.y == 0 ? add_0 : add_1;
  if (out == nullptr) return;  // the whole block
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const int64_t col = int64_t{blockIdx.x} * kColTile + tx;
  const float* src = part + blockIdx.y * chunks * c;
  double acc = 0.0;
  if (col < c) {
    for (int64_t k = ty; k < chunks; k += kRowLanes) acc += src[k * c + col];
  }
  lanes[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < c) {
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) sum += lanes[k][tx];
    const float total = static_cast<float>(sum);
    out[col] = FromF<Out>(add ? ToF(out[col]) + total : total);
  }
}

// Calls fn(W{}) with W the parameters' element type: float when the
// parameter is f32 or undefined, else T.
template <typename T, typename Fn>
void DispatchParam(const Tensor& p, Fn&& fn) {
  if (!p.defined() || p.dtype() == Dtype::kF32) {
    fn(float{});
  } else {
    fn(T{});
  }
}

std::atomic<bool>& HoldRowsFlag() {
  static std::atomic<bool> flag{!EnvIs("FSDP_CUDA_NORM_HOLD_ROWS", "0")};
  return flag;
}

// Calls fn(std::bool_constant<warp_rows>, std::integral_constant<int, N>,
// std::integral_constant<int, held>): DispatchRows' first two, and held > 0
// for warp rows of a 16-bit dtype in 16-byte packs when NormHoldRows(): the
// packs a lane owns (1 to 4; C <= kWarpRowMaxCols = 4 x 32 lanes x 8), held
// in registers. f32 rows would take twice the registers (up to 8 packs a
// lane): they keep the loads (held 0), as do rows without 16-byte packs.
template <int kVec, typename T, typename Fn>
void DispatchNormRows(const RowPlan& plan, bool vec, int64_t c, Fn&& fn) {
  using W = std::true_type;
  using V = std::integral_constant<int, kVec>;
  if constexpr (sizeof(T) == 2) {
    static_assert(kWarpRowMaxCols <= 4 * kWarp * kVec,
                  "a 16-bit warp row is at most 4 packs a lane");
    if (plan.warp_rows && vec && NormHoldRows()) {
      switch ((c + kWarp * kVec - 1) / (kWarp * kVec)) {
        case 1:
          return fn(W{}, V{}, std::integral_constant<int, 1>{});
        case 2:
          return fn(W{}, V{}, std::integral_constant<int, 2>{});
        case 3:
          return fn(W{}, V{}, std::integral_constant<int, 3>{});
        default:
          return fn(W{}, V{}, std::integral_constant<int, 4>{});
      }
    }
  }
  DispatchRows<kVec>(plan.warp_rows, vec, [&](auto warp_rows, auto n) {
    fn(warp_rows, n, std::integral_constant<int, 0>{});
  });
}

template <bool kCentered>
void Forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
             const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  SetDevice(x, op);
  const int64_t c = x.dim(-1);
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  if (rows == 0) return;
  DispatchFloat(x.dtype(), op, [&](auto tz) {
    using T = decltype(tz);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec =
        c % kVec == 0 && Aligned16(x) && Aligned16(y) && Aligned16(weight) && Aligned16(bias);
    const RowPlan plan = PlanRows(rows, c, vec ? kVec : 1);
    // weight and bias share a dtype (checked by the op); either may be absent.
    DispatchParam<T>(weight.defined() ? weight : bias, [&](auto wz) {
      using W = decltype(wz);
      DispatchNormRows<kVec, T>(plan, vec, c, [&](auto warp_rows, auto n, auto held) {
        NormForwardKernel<kCentered, decltype(warp_rows)::value, decltype(n)::value,
                          decltype(held)::value, T, W>
            <<<plan.grid, plan.block, 0, ComputeStream()>>>(
                Ptr<T>(x), ParamPtr<W>(weight), kCentered ? ParamPtr<W>(bias) : nullptr, eps,
                Ptr<T>(y), kCentered ? Ptr<float>(mean) : nullptr, Ptr<float>(rstd), rows, c);
      });
    });
  });
  CheckLaunch(op);
}

// grad_weight / grad_bias (each written, or added to with add_weight /
// add_bias, when defined) = the column sums of part (kParams, chunks, C), one
// launch for both.
template <bool kCentered>
void ColumnSums(const char* op, const Tensor& part, int64_t chunks, int64_t c,
                const Tensor& grad_weight, const Tensor& grad_bias, bool add_weight,
                bool add_bias) {
  constexpr unsigned kParams = kCentered ? 2 : 1;
  // Both parameters' sums in one launch (grid.y = parameter); they share a dtype.
  const Tensor& first = grad_weight.defined() ? grad_weight : grad_bias;
  if (!first.defined() || c == 0) return;
  const dim3 grid(static_cast<unsigned>((c + kColTile - 1) / kColTile), kParams);
  DispatchFloat(first.dtype(), op, [&](auto oz) {
    using O = decltype(oz);
    O* bias_out = kCentered && grad_bias.defined() ? Ptr<O>(grad_bias) : nullptr;
    ColumnSumKernel<O><<<grid, kColTile * kRowLanes, 0, ComputeStream()>>>(
        chunks > 0 ? Ptr<float>(part) : nullptr, chunks, c,
        grad_weight.defined() ? Ptr<O>(grad_weight) : nullptr, bias_out, add_weight, add_bias);
  });
  CheckLaunch(op);
}

// The parameter gradients of rows longer than a warp's (a block per row in
// the backward): the partial-sum kernel over grad_y and x, then the column
// sums.
template <bool kCentered, typename T>
void ParamGrads(const char* op, const Tensor& grad_y, const Tensor& x, const Tensor& mean,
                const Tensor& rstd, int64_t rows, int64_t c, const Tensor& grad_weight,
                const Tensor& grad_bias, bool add_weight, bool add_bias) {
  constexpr int kParams = kCentered ? 2 : 1;
  const int64_t rows_per_chunk = RowsPerChunk(rows);
  const int64_t chunks = rows == 0 ? 0 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  // (kParams, chunks, C) f32 scratch.
  const Tensor part = Tensor::Empty({kParams, chunks, c}, Dtype::kF32, x.device());
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>((c + kColTile - 1) / kColTile),
                    static_cast<unsigned>(chunks));
    NormParamPartialKernel<kCentered, T><<<grid, kColTile * kRowLanes, 0, ComputeStream()>>>(
        Ptr<T>(grad_y), Ptr<T>(x), kCentered ? Ptr<float>(mean) : nullptr, Ptr<float>(rstd),
        Ptr<float>(part), rows, c, rows_per_chunk);
    CheckLaunch(op);
  }
  ColumnSums<kCentered>(op, part, chunks, c, grad_weight, grad_bias, add_weight, add_bias);
}

// Blocks of the backward that also sums the parameter gradients: about 4
// rows a warp at gpt2's 16384 rows, from the row count alone (the sums'
// order must not depend on the device).
constexpr int64_t kMaxPartialBlocks = 512;
int64_t PartialBlocks(int64_t rows) {
  const int64_t by_rows = (rows + kPartialWarps - 1) / kPartialWarps;
  return by_rows < kMaxPartialBlocks ? by_rows : kMaxPartialBlocks;
}

template <bool kCentered>
void Backward(const char* op, const Tensor& grad_y, const Tensor& x, const Tensor& weight,
              const Tensor& mean, const Tensor& rstd, const Tensor& add, const Tensor& grad_x,
              const Tensor& grad_weight, const Tensor& grad_bias, bool add_weight,
              bool add_bias) {
  SetDevice(x, op);
  const int64_t c = x.dim(-1);
  const int64_t rows = c == 0 ? 0 : x.numel() / c;
  DispatchFloat(x.dtype(), op, [&](auto tz) {
    using T = decltype(tz);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = c % kVec == 0 && Aligned16(x) && Aligned16(grad_y) && Aligned16(grad_x) &&
                     Aligned16(weight) && Aligned16(add);
    const RowPlan plan = PlanRows(rows, c, vec ? kVec : 1);
    const bool param_grads = grad_weight.defined() || (kCentered && grad_bias.defined());
    // Rows of a warp: the grad_x kernel also makes the parameter gradients'
    // partial sums (one pass over grad_y and x); otherwise ParamGrads reads
    // them again after it.
    const bool partials = rows > 0 && plan.warp_rows && param_grads;
    constexpr int kParams = kCentered ? 2 : 1;
    const int64_t blocks = partials ? PartialBlocks(rows) : 0;
    const Tensor part =
        partials ? Tensor::Empty({kParams, blocks, c}, Dtype::kF32, x.device()) : Tensor();
    if (rows > 0) {
      DispatchParam<T>(weight, [&](auto wz) {
        using W = decltype(wz);
        DispatchNormRows<kVec, T>(plan, vec, c, [&](auto warp_rows, auto n, auto held) {
          constexpr bool kWarpRows = decltype(warp_rows)::value;
          constexpr int N = decltype(n)::value;
          constexpr int kHeld = decltype(held)::value;
          auto launch = [&](auto* kernel, dim3 grid, dim3 block, float* partial_sums) {
            kernel<<<grid, block, 0, ComputeStream()>>>(
                Ptr<T>(grad_y), Ptr<T>(x), ParamPtr<W>(weight),
                kCentered ? Ptr<float>(mean) : nullptr, Ptr<float>(rstd),
                add.defined() ? Ptr<T>(add) : nullptr, Ptr<T>(grad_x), rows, c, partial_sums);
          };
          if constexpr (kWarpRows) {
            if (partials) {
              launch(NormBackwardKernel<kCentered, true, N, kHeld, T, W, true>,
                     dim3(static_cast<unsigned>(blocks)), dim3(kWarp * kPartialWarps),
                     Ptr<float>(part));
              return;
            }
          }
          launch(NormBackwardKernel<kCentered, kWarpRows, N, kHeld, T, W>, plan.grid, plan.block,
                 nullptr);
        });
      });
      CheckLaunch(op);
    }
    if (partials) {
      ColumnSums<kCentered>(op, part, blocks, c, grad_weight, grad_bias, add_weight, add_bias);
      return;
    }
    if (!param_grads) return;  // no weight (nor bias) to sum for
    ParamGrads<kCentered, T>(op, grad_y, x, mean, rstd, rows, c, grad_weight, grad_bias,
                             add_weight, add_bias);
  });
}

}  // namespace

void SetNormHoldRows(bool hold) { HoldRowsFlag().store(hold); }

bool NormHoldRows() { return HoldRowsFlag().load(std::memory_order_relaxed); }

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  Forward<true>("layer_norm", x, weight, bias, eps, y, mean, rstd);
}

void LayerNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, const Tensor& add,
                       const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                       bool add_weight, bool add_bias) {
  Backward<true>("layer_norm_backward", grad_y, x, weight, mean, rstd, add, grad_x, grad_weight,
                 grad_bias, add_weight, add_bias);
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd) {
  Forward<false>("rms_norm", x, weight, Tensor(), eps, y, Tensor(), rstd);
}

void RmsNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Tensor& rstd, const Tensor& add, const Tensor& grad_x,
                     const Tensor& grad_weight, bool add_weight) {
  Backward<false>("rms_norm_backward", grad_y, x, weight, Tensor(), rstd, add, grad_x, grad_weight,
                  Tensor(), add_weight, false);
}

}  // namespace cuda
}  // namespace tensor
