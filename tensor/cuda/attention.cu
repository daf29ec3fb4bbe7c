// CUDA kernels: fused causal attention forward and backward (FlashAttention-2
// style, see attention.h for the design), with attention dropout. The
// unfused baseline's softmax is in attention_unfused.cu.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/philox.cuh"

namespace tensor {
namespace cuda {
namespace {

constexpr char kOp[] = "flash_attention";
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

// Element strides of a (B, H, T, D) tensor with unit stride in D.
struct Strides {
  int64_t b, h, t;
};

Strides StridesOf(const Tensor& x) { return {x.strides()[0], x.strides()[1], x.strides()[2]}; }

// Everything a kernel needs; passed by value.
struct Args {
  const void* q;
  const void* k;
  const void* v;
  const void* out;       // backward: the forward's output (contiguous)
  const void* grad_out;  // backward
  void* y;               // forward: out; backward: unused
  void* dq;
  void* dk;
  void* dv;
  float* lse;    // (B, H, T_q)
  float* delta;  // backward workspace (B, H, T_q)
  Strides sq, sk, sv, sdo;
  int heads;
  int t_q, t_k;
  int causal_offset;  // T_k - T_q: query i sees keys j <= i + causal_offset
  bool causal;
  bool vec;  // every (q, k, v, grad_out) row start is 16-byte aligned
  float scale;
  float scale_log2;  // scale * log2(e): scores go through exp2
  // Dropout of the probabilities (FlashDropout); drop_scale 1 when none.
  bool dropout;
  uint32_t drop_threshold;  // ceil(p 2^24)
  float drop_scale;         // float(1 / (1 - p))
  uint64_t drop_seed, drop_offset;
};

__device__ __forceinline__ bool Visible(const Args& a, int query, int key) {
  return query < a.t_q && key < a.t_k && (!a.causal || key <= query + a.causal_offset);
}

// The dropout factor of probability (bh, query, key): 0 or drop_scale; 1
// in the kernels compiled without dropout (kDrop false: the kernels of plain
// attention keep their registers). Outside the (T_q, T_k) range the
// probability is 0 anyway.
// The element index of probability (bh, query, key) in (B, H, T_q, T_k).
__device__ __forceinline__ uint64_t ProbIndex(const Args& a, int bh, int query, int key) {
  return (static_cast<uint64_t>(bh) * a.t_q + query) * a.t_k + key;
}

template <bool kDrop>
__device__ __forceinline__ float DropFactor(const Args& a, int bh, int query, int key) {
  if constexpr (!kDrop) return 1.0f;
  return DropoutKeeps(a.drop_seed, a.drop_offset, a.drop_threshold, ProbIndex(a, bh, query, key))
             ? a.drop_scale
             : 0.0f;
}

// The factors of (bh, query, key) and (bh, query, key + 1), mostly from one
// Philox evaluation (the tensor-core kernels hold keys in pairs).
template <bool kDrop>
__device__ __forceinline__ void DropFactorPair(const Args& a, int bh, int query, int key,
                                               float (&f)[2]) {
  if constexpr (!kDrop) {
    f[0] = f[1] = 1.0f;
  } else {
    bool keep[2];
    DropoutKeepsPair(a.drop_seed, a.drop_offset, a.drop_threshold, ProbIndex(a, bh, query, key),
                     keep);
    f[0] = keep[0] ? a.drop_scale : 0.0f;
    f[1] = keep[1] ? a.drop_scale : 0.0f;
  }
}

// ---------------------------------------------------------------------------
// Tensor-core path: mma.sync.m16n8k16, bf16/f16 inputs, f32 accumulators.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A (16x16, row major), 4 registers of 2 elements (low half = lower column):
//     a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16x8, "col"): b0: (k = 2t..2t+1, n = g)  b1: (k = 2t+8..2t+9, n = g)
//   C (16x8) f32: c0, c1: (g, 2t..2t+1)  c2, c3: (g+8, 2t..2t+1)
// Two C tiles side by side (columns 0-7 and 8-15) are exactly the A fragment
// of a 16x16 block, which is how the probabilities feed the next product
// without going through shared memory.
// ---------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ uint16_t Bits(T x) {
  return *reinterpret_cast<const uint16_t*>(&x);
}
// Two elements as one register, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t Pack2(T lo, T hi) {
  return static_cast<uint32_t>(Bits(lo)) | (static_cast<uint32_t>(Bits(hi)) << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t PackF(float lo, float hi) {
  return Pack2(FromF<T>(lo), FromF<T>(hi));
}
template <typename T>
__device__ __forceinline__ uint32_t Ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::MmaM16N8K16<__nv_bfloat16>(c, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void Mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
#ifdef TENSOR_CUDA_EMULATION
  ::cuda_emu::MmaM16N8K16<__half>(c, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// acc (16 x kN) += A (16 x kK) * B^T, A: 16 rows of shared memory at `a`, B:
// kN rows at `b` (both row major, leading dimension ld): e.g. S = Q K^T.
template <typename T, int kK, int kN>
__device__ __forceinline__ void WarpGemmABt(float (&acc)[kN / 8][4], const T* a, const T* b, int ld,
                                            int g, int t) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    const uint32_t af[4] = {Ld32(a + g * ld + c), Ld32(a + (g + 8) * ld + c),
                            Ld32(a + g * ld + c + 8), Ld32(a + (g + 8) * ld + c + 8)};
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const T* brow = b + (j * 8 + g) * ld + c;
      Mma<T>(acc[j], af, Ld32(brow), Ld32(brow + 8));
    }
  }
}

// acc (16 x kN) += P (16 x kK, registers in C layout) * B, B: kK rows x kN
// columns of shared memory at `b` (row major, ld): e.g. O += P V. P is rounded
// to T for the product.
template <typename T, int kK, int kN>
__device__ __forceinline__ void WarpGemmPB(float (&acc)[kN / 8][4], const float (&p)[kK / 8][4],
                                           const T* b, int ld, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t af[4] = {
        PackF<T>(p[2 * kk][0], p[2 * kk][1]), PackF<T>(p[2 * kk][2], p[2 * kk][3]),
        PackF<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]), PackF<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    const T* r0 = b + (kk * 16 + 2 * t) * ld + g;  // rows k = 2t, 2t+1, 2t+8, 2t+9; column n = g
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const T* col = r0 + j * 8;
      Mma<T>(acc[j], af, Pack2(col[0], col[ld]), Pack2(col[8 * ld], col[9 * ld]));
    }
  }
}

// Copies rows [row0, row0 + n_rows) of a (T, kD) slice (row stride `stride`)
// into shared memory (leading dimension ld); rows at or past `valid` (relative
// to row0) become zeros, so padded keys and values never inject NaN.
template <typename T, int kD>
__device__ __forceinline__ void LoadTile(T* s, int ld, const T* src, int64_t stride, int row0,
                                         int valid, int n_rows, bool vec) {
  if (vec) {
    constexpr int kChunks = kD / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < n_rows * kChunks; i += blockDim.x) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < valid) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * stride + c);
      *reinterpret_cast<uint4*>(s + r * ld + c) = val;
    }
  } else {
    for (int i = threadIdx.x; i < n_rows * kD; i += blockDim.x) {
      const int r = i / kD, c = i % kD;
      s[r * ld + c] = r < valid ? src[(row0 + r) * stride + c] : FromF<T>(0.0f);
    }
  }
}

template <typename T, int kD>
constexpr FlashAttentionTiles MmaTiles(FlashAttentionPass pass) {
  return FlashAttentionTilesFor(FlashAttentionKernel::kTensorCore, pass, kD, sizeof(T));
}

// Forward: CTA = 64 queries (4 warps x 16 rows) of one (batch, head); loops
// over key tiles of 64 up to the causal limit with the online softmax.
template <typename T, int kD, bool kDrop>
__global__ void __launch_bounds__(128) ForwardMmaKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = MmaTiles<T, kD>(FlashAttentionPass::kForward);
  constexpr int kBr = kTiles.rows, kBc = kTiles.step, kLd = kD + 8;
  static_assert(kBr == 64 && kBc % 16 == 0, "4 warps of 16 rows");
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [kBr][kLd]
  T* ks = qs + kBr * kLd;              // [kBc][kLd]
  T* vs = ks + kBc * kLd;              // [kBc][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;  // causal: the longest rows start first
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;

  LoadTile<T, kD>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, kBr, a.vec);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float o[kD / 8][4] = {};
  float m[2] = {-kInf, -kInf};  // running max of the base-2 scores
  float l[2] = {0.0f, 0.0f};    // this thread's part of the running sum
  int k_end = a.t_k;
  if (a.causal) k_end = min(k_end, min(q0 + kBr, a.t_q) + a.causal_offset);

  for (int k0 = 0; k0 < k_end; k0 += kBc) {
    __syncthreads();  // the previous tiles are consumed (and Q is loaded)
    LoadTile<T, kD>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, kBc, a.vec);
    LoadTile<T, kD>(vs, kLd, v, a.sv.t, k0, a.t_k - k0, kBc, a.vec);
    __syncthreads();

    float s[kBc / 8][4] = {};
    WarpGemmABt<T, kD, kBc>(s, qs + warp * 16 * kLd, ks, kLd, g, t);
    const bool masked = k0 + kBc > a.t_k || (a.causal && k0 + kBc - 1 > q0 + a.causal_offset);
#pragma unroll
    for (int j = 0; j < kBc / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * t + (e & 1);
        const bool keep =
            !masked || (key < a.t_k && (!a.causal || key <= row[e / 2] + a.causal_offset));
        s[j][e] = keep ? s[j][e] * a.scale_log2 : -kInf;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -kInf;
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));  // the 4 threads of a row
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      const float m_use = m_new == -kInf ? 0.0f : m_new;  // no row key yet: avoid inf - inf
      const float alpha = exp2f(m[r] - m_use);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
        s[j][2 * r] = exp2f(s[j][2 * r] - m_use);
        s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - m_use);
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[j][2 * r] *= alpha;
        o[j][2 * r + 1] *= alpha;
      }
    }
    if constexpr (kDrop) {  // after the row sums: they normalize the undropped softmax
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float f[2];
          DropFactorPair<kDrop>(a, bh, row[r], k0 + j * 8 + 2 * t, f);
          s[j][2 * r] *= f[0];
          s[j][2 * r + 1] *= f[1];
        }
      }
    }
    WarpGemmPB<T, kBc, kD>(o, s, vs, kLd, g, t);
  }

  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(bh) * a.t_q * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r];
    lt += __shfl_xor_sync(kFullMask, lt, 1);
    lt += __shfl_xor_sync(kFullMask, lt, 2);
    if (row[r] >= a.t_q) continue;
    const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
    T* yr = y + static_cast<int64_t>(row[r]) * kD + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(yr + j * 8) = PackF<T>(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    }
    if (t == 0) {
      a.lse[static_cast<int64_t>(bh) * a.t_q + row[r]] =
          lt > 0.0f ? (m[r] + log2f(lt)) * kLn2 : -kInf;
    }
  }
}

// The stored natural-log lse as the base-2 offset of the backward's exp2;
// rows with no visible key (-inf) get +inf so that every probability is 0.
__device__ __forceinline__ float Lse2(float lse) { return lse == -kInf ? kInf : lse * kLog2e; }

// Backward dk, dv: CTA = 64 keys (4 warps x 16 rows) of one (batch, head);
// loops over query tiles from the first query that sees the block.
template <typename T, int kD, bool kDrop>
__global__ void __launch_bounds__(128) BackwardDkDvMmaKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = MmaTiles<T, kD>(FlashAttentionPass::kBackwardDkDv);
  constexpr int kBc = kTiles.rows, kBr = kTiles.step, kLd = kD + 8;
  static_assert(kBc == 64 && kBr % 16 == 0, "4 warps of 16 keys");
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);                        // [kBc][kLd]
  T* vs = ks + kBc * kLd;                                    // [kBc][kLd]
  T* qs = vs + kBc * kLd;                                    // [kBr][kLd]
  T* dos = qs + kBr * kLd;                                   // [kBr][kLd]
  float* lse_s = reinterpret_cast<float*>(dos + kBr * kLd);  // [kBr], base 2
  float* delta_s = lse_s + kBr;                              // [kBr]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int k0 = blockIdx.y * kBc;  // causal: the first key blocks see the most queries
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h;
  const float* lse = a.lse + static_cast<int64_t>(bh) * a.t_q;
  const float* delta = a.delta + static_cast<int64_t>(bh) * a.t_q;

  LoadTile<T, kD>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, kBc, a.vec);
  LoadTile<T, kD>(vs, kLd, v, a.sv.t, k0, a.t_k - k0, kBc, a.vec);
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  float dk[kD / 8][4] = {};
  float dv[kD / 8][4] = {};
  int q_begin = 0;
  if (a.causal) q_begin = max(0, k0 - a.causal_offset) / kBr * kBr;

  for (int q0 = q_begin; q0 < a.t_q; q0 += kBr) {
    __syncthreads();
    LoadTile<T, kD>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, kBr, a.vec);
    LoadTile<T, kD>(dos, kLd, dout, a.sdo.t, q0, a.t_q - q0, kBr, a.vec);
    for (int i = threadIdx.x; i < kBr; i += blockDim.x) {
      const bool in = q0 + i < a.t_q;
      lse_s[i] = in ? Lse2(lse[q0 + i]) : kInf;
      delta_s[i] = in ? delta[q0 + i] : 0.0f;
    }
    __syncthreads();

    // P^T (16 keys x kBr queries) = exp2(scale_log2 * K Q^T - lse2).
    float p[kBr / 8][4] = {};
    WarpGemmABt<T, kD, kBr>(p, ks + warp * 16 * kLd, qs, kLd, g, t);
#pragma unroll
    for (int j = 0; j < kBr / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = j * 8 + 2 * t + (e & 1);
        p[j][e] =
            Visible(a, q0 + qi, key[e / 2]) ? exp2f(p[j][e] * a.scale_log2 - lse_s[qi]) : 0.0f;
      }
    }
    if constexpr (!kDrop) WarpGemmPB<T, kBr, kD>(dv, p, dos, kLd, g, t);  // dV += P^T dO
    // dS^T = P^T * (M * (V dO^T) - delta) with M the dropout factors; with
    // dropout, then P^T *= M and dV += (M P)^T dO.
    float ds[kBr / 8][4] = {};
    WarpGemmABt<T, kD, kBr>(ds, vs + warp * 16 * kLd, dos, kLd, g, t);
#pragma unroll
    for (int j = 0; j < kBr / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = j * 8 + 2 * t + (e & 1);
        const float f = DropFactor<kDrop>(a, bh, q0 + qi, key[e / 2]);
        ds[j][e] = p[j][e] * (ds[j][e] * f - delta_s[qi]);
        if constexpr (kDrop) p[j][e] *= f;
      }
    }
    if constexpr (kDrop) WarpGemmPB<T, kBr, kD>(dv, p, dos, kLd, g, t);
    WarpGemmPB<T, kBr, kD>(dk, ds, qs, kLd, g, t);  // dK += dS^T Q (times scale below)
  }

  T* dkp = static_cast<T*>(a.dk) + static_cast<int64_t>(bh) * a.t_k * kD;
  T* dvp = static_cast<T*>(a.dv) + static_cast<int64_t>(bh) * a.t_k * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= a.t_k) continue;
    const int64_t off = static_cast<int64_t>(key[r]) * kD + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dkp + off + j * 8) =
          PackF<T>(dk[j][2 * r] * a.scale, dk[j][2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dvp + off + j * 8) = PackF<T>(dv[j][2 * r], dv[j][2 * r + 1]);
    }
  }
}

// Backward dq: CTA = 64 queries (4 warps x 16 rows); loops over key tiles.
template <typename T, int kD, bool kDrop>
__global__ void __launch_bounds__(128) BackwardDqMmaKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = MmaTiles<T, kD>(FlashAttentionPass::kBackwardDq);
  constexpr int kBr = kTiles.rows, kBc = kTiles.step, kLd = kD + 8;
  static_assert(kBr == 64 && kBc % 16 == 0, "4 warps of 16 rows");
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [kBr][kLd]
  T* dos = qs + kBr * kLd;             // [kBr][kLd]
  T* ks = dos + kBr * kLd;             // [kBc][kLd]
  T* vs = ks + kBc * kLd;              // [kBc][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h;

  LoadTile<T, kD>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, kBr, a.vec);
  LoadTile<T, kD>(dos, kLd, dout, a.sdo.t, q0, a.t_q - q0, kBr, a.vec);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in = row[r] < a.t_q;
    const int64_t i = static_cast<int64_t>(bh) * a.t_q + row[r];
    lse2[r] = in ? Lse2(a.lse[i]) : kInf;
    delta[r] = in ? a.delta[i] : 0.0f;
  }
  float dq[kD / 8][4] = {};
  int k_end = a.t_k;
  if (a.causal) k_end = min(k_end, min(q0 + kBr, a.t_q) + a.causal_offset);

  for (int k0 = 0; k0 < k_end; k0 += kBc) {
    __syncthreads();
    LoadTile<T, kD>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, kBc, a.vec);
    LoadTile<T, kD>(vs, kLd, v, a.sv.t, k0, a.t_k - k0, kBc, a.vec);
    __syncthreads();

    float p[kBc / 8][4] = {};
    WarpGemmABt<T, kD, kBc>(p, qs + warp * 16 * kLd, ks, kLd, g, t);
    float ds[kBc / 8][4] = {};
    WarpGemmABt<T, kD, kBc>(ds, dos + warp * 16 * kLd, vs, kLd, g, t);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < kBc / 8; ++j) {
      float f[2][2];
      DropFactorPair<kDrop>(a, bh, row[0], k0 + j * 8 + 2 * t, f[0]);
      DropFactorPair<kDrop>(a, bh, row[1], k0 + j * 8 + 2 * t, f[1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, kj = k0 + j * 8 + 2 * t + (e & 1);
        const float pr = Visible(a, row[r], kj) ? exp2f(p[j][e] * a.scale_log2 - lse2[r]) : 0.0f;
        ds[j][e] = pr * (ds[j][e] * f[r][e & 1] - delta[r]);
      }
    }
    WarpGemmPB<T, kBc, kD>(dq, ds, ks, kLd, g, t);  // dQ += dS K (times scale below)
  }

  T* dqp = static_cast<T*>(a.dq) + static_cast<int64_t>(bh) * a.t_q * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= a.t_q) continue;
    T* dr = dqp + static_cast<int64_t>(row[r]) * kD + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dr + j * 8) =
          PackF<T>(dq[j][2 * r] * a.scale, dq[j][2 * r + 1] * a.scale);
    }
  }
}

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
template <typename T, int kD, bool kDrop>
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
    const float x = Visible(a, row, k0 + lane) ? s * a.scale_log2 : -kInf;
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
  T* y = static_cast<T*>(a.y) + (static_cast<int64_t>(bh) * a.t_q + row) * kD;
#pragma unroll
  for (int c = 0; c < kPer; ++c) y[lane + 32 * c] = FromF<T>(o[c] * inv);
  if (lane == 0) {
    a.lse[static_cast<int64_t>(bh) * a.t_q + row] = l > 0.0f ? (m + log2f(l)) * kLn2 : -kInf;
  }
}

// Backward dq: CTA = 8 query rows; lane j takes key k0 + j.
template <typename T, int kD, bool kDrop>
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
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
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
    const float p = Visible(a, row, k0 + lane) ? exp2f(s * a.scale_log2 - lse2) : 0.0f;
    const float ds = p * (dp * DropFactor<kDrop>(a, bh, row, k0 + lane) - delta);
    for (int jj = 0; jj < kTile; ++jj) {
      const float dsj = __shfl_sync(kFullMask, ds, jj);
#pragma unroll
      for (int c = 0; c < kPer; ++c) dq[c] = fmaf(dsj, ks[jj * kLd + lane + 32 * c], dq[c]);
    }
  }
  if (row >= a.t_q) return;
  T* out = static_cast<T*>(a.dq) + ri * kD;
#pragma unroll
  for (int c = 0; c < kPer; ++c) out[lane + 32 * c] = FromF<T>(dq[c] * a.scale);
}

// Backward dk, dv: CTA = 8 key rows (a warp each); lane i takes query q0 + i.
template <typename T, int kD, bool kDrop>
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
    const float p = Visible(a, q0 + lane, key) ? exp2f(s * a.scale_log2 - lse_s[lane]) : 0.0f;
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
  const int64_t off = (static_cast<int64_t>(bh) * a.t_k + key) * kD;
  T* dkp = static_cast<T*>(a.dk) + off;
  T* dvp = static_cast<T*>(a.dv) + off;
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    dkp[lane + 32 * c] = FromF<T>(dk[c] * a.scale);
    dvp[lane + 32 * c] = FromF<T>(dv[c]);
  }
}

// delta[row] = sum_d grad_out[row, d] * out[row, d]: a warp per row.
template <typename T>
__global__ void DeltaKernel(const Args a, int d, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += warps) {
    const int64_t bh = row / a.t_q, i = row % a.t_q, b = bh / a.heads, h = bh % a.heads;
    const T* o = static_cast<const T*>(a.out) + row * d;
    const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h + i * a.sdo.t;
    float s = 0.0f;
    for (int c = lane; c < d; c += 32) s = fmaf(ToF(o[c]), ToF(dout[c]), s);
    s = WarpAllSum(s);
    if (lane == 0) a.delta[row] = s;
  }
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------

void CheckOnDevice(const Tensor& ref, const Tensor& t, const char* name) {
  OP_CHECK(t.defined() && t.device() == ref.device(), kOp, name, " must be on ",
           ref.device().ToString(), " with q");
}

void CheckOutput(const Tensor& ref, const Tensor& t, const char* name, const Shape& shape,
                 Dtype dtype) {
  CheckOnDevice(ref, t, name);
  OP_CHECK(t.shape() == shape && t.dtype() == dtype && t.is_contiguous(), kOp, name, " must be a ",
           "contiguous ", shape.ToString(), " ", DtypeName(dtype), " tensor; got ",
           t.shape().ToString(), " ", DtypeName(t.dtype()),
           t.is_contiguous() ? "" : " (not contiguous)");
}

bool Aligned16(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.strides()[i] % 8 != 0) return false;
  }
  return true;
}

FlashAttentionKernel Resolve(FlashAttentionKernel kernel, Dtype dtype) {
  if (kernel == FlashAttentionKernel::kAuto) {
    return dtype == Dtype::kF32 ? FlashAttentionKernel::kFloat : FlashAttentionKernel::kTensorCore;
  }
  OP_CHECK(kernel != FlashAttentionKernel::kTensorCore || dtype != Dtype::kF32, kOp,
           "the tensor-core kernel takes bf16 or f16, not f32");
  return kernel;
}

Args MakeArgs(const Tensor& q, const Tensor& k, const Tensor& v, float scale, bool causal,
              const FlashDropout& dropout) {
  OP_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, kOp, "dropout p must be in [0, 1); got ",
           dropout.p);
  Args a{};
  a.q = q.raw_data();
  a.k = k.raw_data();
  a.v = v.raw_data();
  a.sq = StridesOf(q);
  a.sk = StridesOf(k);
  a.sv = StridesOf(v);
  a.heads = static_cast<int>(q.dim(1));
  a.t_q = static_cast<int>(q.dim(2));
  a.t_k = static_cast<int>(k.dim(2));
  a.causal_offset = a.t_k - a.t_q;
  a.causal = causal;
  a.vec = Aligned16(q) && Aligned16(k) && Aligned16(v);
  a.scale = scale;
  a.scale_log2 = scale * kLog2e;
  // As tensor/ops/dropout.cc: the threshold and the float scale.
  a.dropout = dropout.p > 0.0f;
  a.drop_threshold =
      static_cast<uint32_t>(std::ceil(static_cast<double>(dropout.p) * 16777216.0));
  a.drop_scale = static_cast<float>(1.0 / (1.0 - dropout.p));
  a.drop_seed = dropout.seed;
  a.drop_offset = dropout.offset;
  return a;
}

template <typename Kernel>
void Launch(Kernel kernel, unsigned bh, int64_t blocks_y, const FlashAttentionTiles& tiles,
            const Args& a) {
  if (bh == 0 || blocks_y == 0) return;
  OP_CHECK(blocks_y <= 65535, kOp, "sequence too long for the launch grid (", blocks_y,
           " row blocks)");
  if (tiles.smem_bytes > 48 * 1024) {
    CheckCuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(tiles.smem_bytes)),
              kOp, "cudaFuncSetAttribute(max dynamic shared memory)");
  }
  kernel<<<dim3(bh, static_cast<unsigned>(blocks_y)), tiles.threads, tiles.smem_bytes,
           ComputeStream()>>>(a);
  CheckLaunch(kOp);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls fn(std::integral_constant<int, D>{}) for a supported head size.
template <typename Fn>
void DispatchHeadDim(int64_t d, Fn&& fn) {
  switch (d) {
    case 32:
      fn(std::integral_constant<int, 32>{});
      return;
    case 64:
      fn(std::integral_constant<int, 64>{});
      return;
    case 128:
      fn(std::integral_constant<int, 128>{});
      return;
    default:
      ThrowOpError(kOp, "head size ", d, " is not supported (32, 64 or 128)");
  }
}

// Calls fn(std::bool_constant<dropout>{}): the kernels with or without the
// dropout code.
template <typename Fn>
void DispatchDrop(bool dropout, Fn&& fn) {
  if (dropout) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

}  // namespace

void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                           bool causal, const Tensor& out, const Tensor& lse,
                           FlashAttentionKernel kernel, const FlashDropout& dropout) {
  CheckFlashAttentionInputs(q, k, v);
  OP_CHECK(q.device().is_cuda(), kOp, "q is on ", q.device().ToString(), ", not a CUDA device");
  CheckOnDevice(q, k, "k");
  CheckOnDevice(q, v, "v");
  const int64_t b = q.dim(0), h = q.dim(1), t_q = q.dim(2), d = q.dim(3);
  CheckOutput(q, out, "out", Shape({b, h, t_q, d}), q.dtype());
  CheckOutput(q, lse, "lse", Shape({b, h, t_q}), Dtype::kF32);
  kernel = Resolve(kernel, q.dtype());
  SetDevice(q, kOp);
  Args a = MakeArgs(q, k, v, scale, causal, dropout);
  a.y = out.raw_data();
  a.lse = lse.data<float>();
  const unsigned bh = static_cast<unsigned>(b * h);
  DispatchFloat(q.dtype(), kOp, [&](auto zero) {
    using T = decltype(zero);
    DispatchHeadDim(d, [&](auto dim) {
      constexpr int kD = decltype(dim)::value;
      const FlashAttentionTiles tiles =
          FlashAttentionTilesFor(kernel, FlashAttentionPass::kForward, kD, sizeof(T));
      if constexpr (!std::is_same_v<T, float>) {
        if (kernel == FlashAttentionKernel::kTensorCore) {
          DispatchDrop(a.dropout, [&](auto drop) {
            Launch(ForwardMmaKernel<T, kD, decltype(drop)::value>, bh, CeilDiv(t_q, tiles.rows), tiles, a);
          });
          return;
        }
      }
      DispatchDrop(a.dropout, [&](auto drop) {
        Launch(ForwardFloatKernel<T, kD, decltype(drop)::value>, bh, CeilDiv(t_q, tiles.rows), tiles, a);
      });
    });
  });
}

void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, float scale, bool causal,
                            const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            FlashAttentionKernel kernel, const FlashDropout& dropout) {
  CheckFlashAttentionInputs(q, k, v);
  OP_CHECK(q.device().is_cuda(), kOp, "q is on ", q.device().ToString(), ", not a CUDA device");
  CheckOnDevice(q, k, "k");
  CheckOnDevice(q, v, "v");
  const int64_t b = q.dim(0), h = q.dim(1), t_q = q.dim(2), t_k = k.dim(2), d = q.dim(3);
  CheckOutput(q, out, "out", Shape({b, h, t_q, d}), q.dtype());
  CheckOutput(q, lse, "lse", Shape({b, h, t_q}), Dtype::kF32);
  CheckOnDevice(q, grad_out, "grad_out");
  OP_CHECK(grad_out.shape() == out.shape() && grad_out.dtype() == q.dtype() &&
               grad_out.strides()[3] == 1,
           kOp, "grad_out must be ", out.shape().ToString(), " ", DtypeName(q.dtype()),
           " with unit stride in D; got ", grad_out.shape().ToString(), " ",
           DtypeName(grad_out.dtype()));
  CheckOutput(q, dq, "dq", q.shape(), q.dtype());
  CheckOutput(q, dk, "dk", k.shape(), q.dtype());
  CheckOutput(q, dv, "dv", v.shape(), q.dtype());
  kernel = Resolve(kernel, q.dtype());
  SetDevice(q, kOp);
  Tensor delta = Tensor::Empty({b, h, t_q}, Dtype::kF32, q.device());
  Args a = MakeArgs(q, k, v, scale, causal, dropout);
  a.out = out.raw_data();
  a.grad_out = grad_out.raw_data();
  a.sdo = StridesOf(grad_out);
  a.vec = a.vec && Aligned16(grad_out);
  a.lse = lse.data<float>();
  a.delta = delta.data<float>();
  a.dq = dq.raw_data();
  a.dk = dk.raw_data();
  a.dv = dv.raw_data();
  const unsigned bh = static_cast<unsigned>(b * h);
  DispatchFloat(q.dtype(), kOp, [&](auto zero) {
    using T = decltype(zero);
    const int64_t rows = b * h * t_q;
    if (rows > 0) {
      DeltaKernel<T>
          <<<Blocks(rows * 32), kThreads, 0, ComputeStream()>>>(a, static_cast<int>(d), rows);
      CheckLaunch(kOp);
    }
    DispatchHeadDim(d, [&](auto dim) {
      constexpr int kD = decltype(dim)::value;
      const FlashAttentionTiles kv =
          FlashAttentionTilesFor(kernel, FlashAttentionPass::kBackwardDkDv, kD, sizeof(T));
      const FlashAttentionTiles qt =
          FlashAttentionTilesFor(kernel, FlashAttentionPass::kBackwardDq, kD, sizeof(T));
      if constexpr (!std::is_same_v<T, float>) {
        if (kernel == FlashAttentionKernel::kTensorCore) {
          DispatchDrop(a.dropout, [&](auto drop) {
            Launch(BackwardDkDvMmaKernel<T, kD, decltype(drop)::value>, bh, CeilDiv(t_k, kv.rows), kv, a);
            Launch(BackwardDqMmaKernel<T, kD, decltype(drop)::value>, bh, CeilDiv(t_q, qt.rows), qt, a);
          });
          return;
        }
      }
      DispatchDrop(a.dropout, [&](auto drop) {
        Launch(BackwardDkDvFloatKernel<T, kD, decltype(drop)::value>, bh, CeilDiv(t_k, kv.rows), kv, a);
        Launch(BackwardDqFloatKernel<T, kD, decltype(drop)::value>, bh, CeilDiv(t_q, qt.rows), qt, a);
      });
    });
  });
}

}  // namespace cuda
}  // namespace tensor
