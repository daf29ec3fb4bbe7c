// CUDA kernels: the float family of the fused attention (f32, bf16, f16;
// plain FMA, one warp per row, tiles of 32 rows staged as float). The
// design is in attention.h, the shared argument block and score terms in
// attention_internal.cuh, the launches in attention.cu.
#include <type_traits>

#include "tensor/cuda/attention_internal.cuh"

namespace tensor {
namespace cuda {
namespace flash {
namespace {

// ---------------------------------------------------------------------------
// Float path: one warp per row, plain FMA; tiles of 32 rows staged as float.
// ---------------------------------------------------------------------------

template <int kD>
constexpr FlashAttentionTiles FloatTiles(FlashAttentionPass pass) {
  return FlashAttentionTilesFor(FlashAttentionKernel::kFloat, pass, kD, 4);
}

// Rows [row0, row0 + n) of a (T, kD) slice into float shared memory (ld),
// zeros at or past `valid`.
template <typename T, int kD>
__device__ __forceinline__ void LoadRowsF(float* s, int ld, const T* src, int64_t stride, int row0,
                                          int valid, int n) {
  for (int i = threadIdx.x; i < n * kD; i += blockDim.x) {
    const int r = i / kD, c = i % kD;
    s[r * ld + c] = r < valid ? ToF(src[(row0 + r) * stride + c]) : 0.0f;
  }
}

template <int kD>
__device__ __forceinline__ float Dot(const float* x, const float* y) {
  float s = 0.0f;
#pragma unroll 8
  for (int d = 0; d < kD; ++d) s = fmaf(x[d], y[d], s);
  return s;
}

// Forward: CTA = 8 query rows (a warp each); lane j scores key k0 + j.
template <typename T, int kD, bool kDrop, bool kTerms>
__global__ void __launch_bounds__(256) ForwardFloatKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = FloatTiles<kD>(FlashAttentionPass::kForward);
  constexpr int kRows = kTiles.rows, kTile = kTiles.step, kLd = kD + 1, kPer = kD / 32;
  static_assert(kTile == 32 && kRows * 32 == kTiles.threads, "a warp per row, a lane per key");
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);  // [kRows][kD]
  float* ks = qs + kRows * kD;                 // [kTile][kLd]
  float* vs = ks + kTile * kLd;                // [kTile][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kRows, row = row0 + warp;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  LoadRowsF<T, kD>(qs, kD, q, a.sq.t, row0, a.t_q - row0, kRows);

  float o[kPer] = {};
  float m = -kInf, l = 0.0f;
  int k_end = a.t_k;
  if (a.causal) k_end = min(k_end, min(row0 + kRows, a.t_q) + a.causal_offset);
  for (int k0 = 0; k0 < k_end; k0 += kTile) {
    __syncthreads();
    LoadRowsF<T, kD>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, kTile);
    LoadRowsF<T, kD>(vs, kLd, v, a.sv.t, k0, a.t_k - k0, kTile);
    __syncthreads();
    const float s = Dot<kD>(qs + warp * kD, ks + lane * kLd);
    const float x = Visible<kTerms>(a, b, row, k0 + lane)
                        ? s * a.scale_log2 + Bias2<kTerms>(a, b, h, row, k0 + lane)
                        : -kInf;
    const float m_new = fmaxf(m, WarpAllMax(x));
    const float m_use = m_new == -kInf ? 0.0f : m_new;
    const float alpha = exp2f(m - m_use);
    const float p = exp2f(x - m_use);
    l = l * alpha + WarpAllSum(p);
    m = m_new;
#pragma unroll
    for (int c = 0; c < kPer; ++c) o[c] *= alpha;
    const float pd = p * DropFactor<kDrop>(a, bh, row, k0 + lane);  // the sum above is undropped
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(kFullMask, pd, jj);
#pragma unroll
      for (int c = 0; c < kPer; ++c) o[c] = fmaf(pj, vs[jj * kLd + lane + 32 * c], o[c]);
    }
  }
  if (row >= a.t_q) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* y = static_cast<T*>(a.y) + b * a.sy.b + h * a.sy.h + row * a.sy.t;
#pragma unroll
  for (int c = 0; c < kPer; ++c) y[lane + 32 * c] = FromF<T>(o[c] * inv);
  if (lane == 0) {
    a.lse[static_cast<int64_t>(bh) * a.t_q + row] = l > 0.0f ? (m + log2f(l)) * kLn2 : -kInf;
  }
}

// Backward dq: CTA = 8 query rows; lane j takes key k0 + j.
template <typename T, int kD, bool kDrop, bool kTerms>
__global__ void __launch_bounds__(256) BackwardDqFloatKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = FloatTiles<kD>(FlashAttentionPass::kBackwardDq);
  constexpr int kRows = kTiles.rows, kTile = kTiles.step, kLd = kD + 1, kPer = kD / 32;
  static_assert(kTile == 32 && kRows * 32 == kTiles.threads, "a warp per row, a lane per key");
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);  // [kRows][kD]
  float* dos = qs + kRows * kD;                // [kRows][kD]
  float* ks = dos + kRows * kD;                // [kTile][kLd]
  float* vs = ks + kTile * kLd;                // [kTile][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int b, h;
  if (!DqExample(a, &b, &h)) return;
  const int bh = b * a.heads + h;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * kRows, row = row0 + warp;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h;
  LoadRowsF<T, kD>(qs, kD, q, a.sq.t, row0, a.t_q - row0, kRows);
  LoadRowsF<T, kD>(dos, kD, dout, a.sdo.t, row0, a.t_q - row0, kRows);
  const int64_t ri = static_cast<int64_t>(bh) * a.t_q + row;
  const float lse2 = row < a.t_q ? Lse2(a.lse[ri]) : kInf;
  const float delta = row < a.t_q ? a.delta[ri] : 0.0f;

  float dq[kPer] = {};
  int k_end = a.t_k;
  if (a.causal) k_end = min(k_end, min(row0 + kRows, a.t_q) + a.causal_offset);
  for (int k0 = 0; k0 < k_end; k0 += kTile) {
    __syncthreads();
    LoadRowsF<T, kD>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, kTile);
    LoadRowsF<T, kD>(vs, kLd, v, a.sv.t, k0, a.t_k - k0, kTile);
    __syncthreads();
    const float s = Dot<kD>(qs + warp * kD, ks + lane * kLd);
    const float dp = Dot<kD>(dos + warp * kD, vs + lane * kLd);
    const float p = Visible<kTerms>(a, b, row, k0 + lane)
                        ? exp2f(s * a.scale_log2 + Bias2<kTerms>(a, b, h, row, k0 + lane) - lse2)
                        : 0.0f;
    const float ds = p * (dp * DropFactor<kDrop>(a, bh, row, k0 + lane) - delta);
    AddDScore<kTerms>(a, row, k0 + lane, ds);
    for (int jj = 0; jj < kTile; ++jj) {
      const float dsj = __shfl_sync(kFullMask, ds, jj);
#pragma unroll
      for (int c = 0; c < kPer; ++c) dq[c] = fmaf(dsj, ks[jj * kLd + lane + 32 * c], dq[c]);
    }
  }
  if (row >= a.t_q) return;
  T* out = static_cast<T*>(a.dq) + b * a.sdq.b + h * a.sdq.h + row * a.sdq.t;
#pragma unroll
  for (int c = 0; c < kPer; ++c) out[lane + 32 * c] = FromF<T>(dq[c] * a.scale);
}

// Backward dk, dv: CTA = 8 key rows (a warp each); lane i takes query q0 + i.
template <typename T, int kD, bool kDrop, bool kTerms>
__global__ void __launch_bounds__(256) BackwardDkDvFloatKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = FloatTiles<kD>(FlashAttentionPass::kBackwardDkDv);
  constexpr int kRows = kTiles.rows, kTile = kTiles.step, kLd = kD + 1, kPer = kD / 32;
  static_assert(kTile == 32 && kRows * 32 == kTiles.threads, "a warp per row, a lane per query");
  extern __shared__ __align__(16) unsigned char smem[];
  float* kr = reinterpret_cast<float*>(smem);  // [kRows][kD]
  float* vr = kr + kRows * kD;                 // [kRows][kD]
  float* qs = vr + kRows * kD;                 // [kTile][kLd]
  float* dos = qs + kTile * kLd;               // [kTile][kLd]
  float* lse_s = dos + kTile * kLd;            // [kTile]
  float* delta_s = lse_s + kTile;              // [kTile]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int key0 = blockIdx.y * kRows, key = key0 + warp;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h;
  const float* lse = a.lse + static_cast<int64_t>(bh) * a.t_q;
  const float* delta = a.delta + static_cast<int64_t>(bh) * a.t_q;
  LoadRowsF<T, kD>(kr, kD, k, a.sk.t, key0, a.t_k - key0, kRows);
  LoadRowsF<T, kD>(vr, kD, v, a.sv.t, key0, a.t_k - key0, kRows);

  float dk[kPer] = {}, dv[kPer] = {};
  int q_begin = 0;
  if (a.causal) q_begin = max(0, key0 - a.causal_offset) / kTile * kTile;
  for (int q0 = q_begin; q0 < a.t_q; q0 += kTile) {
    __syncthreads();
    LoadRowsF<T, kD>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, kTile);
    LoadRowsF<T, kD>(dos, kLd, dout, a.sdo.t, q0, a.t_q - q0, kTile);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const bool in = q0 + i < a.t_q;
      lse_s[i] = in ? Lse2(lse[q0 + i]) : kInf;
      delta_s[i] = in ? delta[q0 + i] : 0.0f;
    }
    __syncthreads();
    const float s = Dot<kD>(kr + warp * kD, qs + lane * kLd);
    const float dp = Dot<kD>(vr + warp * kD, dos + lane * kLd);
    const float p =
        Visible<kTerms>(a, b, q0 + lane, key)
            ? exp2f(s * a.scale_log2 + Bias2<kTerms>(a, b, h, q0 + lane, key) - lse_s[lane])
            : 0.0f;
    const float f = DropFactor<kDrop>(a, bh, q0 + lane, key);
    const float ds = p * (dp * f - delta_s[lane]);
    const float pd = p * f;
    for (int ii = 0; ii < kTile; ++ii) {
      const float pi = __shfl_sync(kFullMask, pd, ii);
      const float dsi = __shfl_sync(kFullMask, ds, ii);
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        dv[c] = fmaf(pi, dos[ii * kLd + lane + 32 * c], dv[c]);
        dk[c] = fmaf(dsi, qs[ii * kLd + lane + 32 * c], dk[c]);
      }
    }
  }
  if (key >= a.t_k) return;
  T* dkp = static_cast<T*>(a.dk) + b * a.sdk.b + h * a.sdk.h + key * a.sdk.t;
  T* dvp = static_cast<T*>(a.dv) + b * a.sdv.b + h * a.sdv.h + key * a.sdv.t;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    dkp[lane + 32 * c] = FromF<T>(dk[c] * a.scale);
    dvp[lane + 32 * c] = FromF<T>(dv[c]);
  }
}

}  // namespace

Kernels FloatKernels(Dtype dtype, int64_t d, bool dropout, bool terms) {
  return SelectKernels(dtype, d, dropout, terms, [](auto zero, auto dim, auto drop, auto extra) {
    using T = decltype(zero);
    constexpr int kD = decltype(dim)::value;
    constexpr bool kDrop = decltype(drop)::value, kTerms = decltype(extra)::value;
    return Kernels{ForwardFloatKernel<T, kD, kDrop, kTerms>,
                   BackwardDkDvFloatKernel<T, kD, kDrop, kTerms>,
                   BackwardDqFloatKernel<T, kD, kDrop, kTerms>};
  });
}

}  // namespace flash
}  // namespace cuda
}  // namespace tensor
