// CUDA kernels: the tensor-core family of the fused attention (bf16, f16;
// warp-level mma.sync.m16n8k16 with f32 accumulation). The design is in
// attention.h, the shared argument block and score terms in
// attention_internal.cuh, the launches in attention.cu.
#include <type_traits>

#include "tensor/cuda/attention_internal.cuh"
#include "third_party/cuda/ptx.cuh"

namespace tensor {
namespace cuda {
namespace flash {
namespace {

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

// Stores an element pair (4-byte aligned: the outputs' rows start at even
// elements, checked on the host).
template <typename T>
__device__ __forceinline__ void St32(T* p, uint32_t pair) {
  CheckAligned<4>(p);
  *reinterpret_cast<uint32_t*>(p) = pair;
}

// The PTX wrappers (third_party/cuda/ptx.cuh): Mma, LdMatrixX4, CpAsync16,
// CpAsyncCommit, CpAsyncWait.
using ptx::CpAsync16;
using ptx::CpAsyncCommit;
using ptx::LdMatrixX4;
using ptx::Mma;

// The operands below live in shared memory, row major with leading dimension
// ld (a multiple of 8 elements, so every 8-element row segment is 16-byte
// aligned for ldmatrix). Lane l gives the address of row l % 8 of matrix
// l / 8, so with mi = l / 8, ri = l % 8:

// acc (16 x kN) += A (16 x kK) * B^T, A: 16 rows at `a`, B: kN rows at `b`:
// e.g. S = Q K^T. A's matrices are its quarters in fragment order (rows 0-7 /
// 8-15 for mi even / odd, columns 0-7 / 8-15 for mi < 2 / >= 2); B's are
// b0, b1 of the column tile j (rows 8j .. 8j + 7, columns 0-7 then 8-15) and
// b0, b1 of tile j + 1.
template <typename T, int kK, int kN>
__device__ __forceinline__ void WarpGemmABt(float (&acc)[kN / 8][4], const T* a, const T* b, int ld,
                                            int lane) {
  static_assert(kN % 16 == 0, "column tiles go in pairs");
  const int mi = lane / 8, ri = lane % 8;
  const T* a_row = a + ((mi % 2) * 8 + ri) * ld + (mi / 2) * 8;
  const T* b_row = b + ((mi / 2) * 8 + ri) * ld + (mi % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[4];
    LdMatrixX4<false>(af, a_row + kk * 16);
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      uint32_t bf[4];
      LdMatrixX4<false>(bf, b_row + j * 8 * ld + kk * 16);
      Mma<T>(acc[j], af, bf[0], bf[1]);
      Mma<T>(acc[j + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x kN) += P (16 x kK, registers in C layout) * B, B: kK rows x kN
// columns at `b`: e.g. O += P V. P is rounded to T for the product. B's
// fragment holds column elements, so its matrices load transposed: b0, b1 of
// the column tile j (rows 16kk .. +7, then +8 .. +15, columns 8j .. 8j + 7)
// and b0, b1 of tile j + 1.
template <typename T, int kK, int kN>
__device__ __forceinline__ void WarpGemmPB(float (&acc)[kN / 8][4], const float (&p)[kK / 8][4],
                                           const T* b, int ld, int lane) {
  static_assert(kN % 16 == 0, "column tiles go in pairs");
  const int mi = lane / 8, ri = lane % 8;
  const T* b_row = b + ((mi % 2) * 8 + ri) * ld + (mi / 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const uint32_t af[4] = {FromF2<T>(p[2 * kk][0], p[2 * kk][1]),
                            FromF2<T>(p[2 * kk][2], p[2 * kk][3]),
                            FromF2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            FromF2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      uint32_t bf[4];
      LdMatrixX4<true>(bf, b_row + kk * 16 * ld + j * 8);
      Mma<T>(acc[j], af, bf[0], bf[1]);
      Mma<T>(acc[j + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x kN) += A * B, A: 16 rows x kK columns at `a` (leading dimension
// lda), B: kK rows x kN columns at `b` (ldb), both in shared memory: e.g.
// dQ += dS K. A's fragments load as in WarpGemmABt, B's as in WarpGemmPB.
template <typename T, int kK, int kN>
__device__ __forceinline__ void WarpGemmAB(float (&acc)[kN / 8][4], const T* a, int lda, const T* b,
                                           int ldb, int lane) {
  static_assert(kN % 16 == 0, "column tiles go in pairs");
  const int mi = lane / 8, ri = lane % 8;
  const T* a_row = a + ((mi % 2) * 8 + ri) * lda + (mi / 2) * 8;
  const T* b_row = b + ((mi % 2) * 8 + ri) * ldb + (mi / 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[4];
    LdMatrixX4<false>(af, a_row + kk * 16);
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      uint32_t bf[4];
      LdMatrixX4<true>(bf, b_row + kk * 16 * ldb + j * 8);
      Mma<T>(acc[j], af, bf[0], bf[1]);
      Mma<T>(acc[j + 1], af, bf[2], bf[3]);
    }
  }
}

// Waits for every committed group of this thread's copies.
__device__ __forceinline__ void CpAsyncWaitAll() { ptx::CpAsyncWait<0>(); }

// Commits and waits for the copies a block queued but will not use (its
// range of keys or queries is empty), so that none is in flight at its exit.
__device__ __forceinline__ void DrainUnusedCopies() {
  CpAsyncCommit();
  CpAsyncWaitAll();
}

// Copies rows [row0, row0 + kRows) of a (T, kD) slice (row stride `stride`)
// into shared memory (leading dimension ld); rows at or past `valid` (relative
// to row0) become zeros, so padded keys and values never inject NaN. With
// `vec` (16-byte aligned rows) the copies are cp.async: they land at the
// caller's CpAsyncCommit + CpAsyncWaitAll; otherwise they are stores, done
// on return. The CTA's kThreads threads share the copies; with the sizes
// known at compile time the loop unrolls and each thread's source offsets
// are a base plus constant steps (under ncu on the H200 the integer ALU was
// the forward's busiest pipe; a runtime loop's address arithmetic is part of
// that work).
template <typename T, int kD, int kRows, int kThreads = 128>
__device__ __forceinline__ void LoadTile(T* s, int ld, const T* src, int64_t stride, int row0,
                                         int valid, bool vec) {
  if (vec) {
    constexpr int kChunks = kD / 8;  // 16-byte chunks per row
    static_assert(kThreads % kChunks == 0, "a thread's chunk column stays fixed");
    constexpr int kRowStep = kThreads / kChunks;  // rows between a thread's copies
    const int r0 = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 8;
    const T* from = src + (row0 + r0) * stride + c;
    T* to = s + r0 * ld + c;
#pragma unroll
    for (int r = r0, u = 0; u < (kRows * kChunks + kThreads - 1) / kThreads; ++u, r += kRowStep) {
      if (r >= kRows) break;
      const bool in = r < valid;
      CpAsync16(to + u * kRowStep * ld, in ? from + u * kRowStep * stride : src, in ? 16 : 0);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
      const int r = i / kD, c = i % kD;
      s[r * ld + c] = r < valid ? src[(row0 + r) * stride + c] : FromF<T>(0.0f);
    }
  }
}

// The keys the query rows [q0, q0 + rows) attend to are [0, end): all of
// them, or with a causal mask those up to the last row's diagonal (the
// forward and dq kernels loop over key tiles up to it).
__device__ __forceinline__ int KeyEnd(const Args& a, int q0, int rows) {
  return a.causal ? min(a.t_k, min(q0 + rows, a.t_q) + a.causal_offset) : a.t_k;
}

// Whether a tile of queries [q0, q0 + rows) x keys [k0, k0 + cols) has a
// pair that is not visible (out of range, causally hidden), or (kTerms) may
// have (padded keys can be anywhere): false lets a kernel skip the per-pair
// checks.
template <bool kTerms>
__device__ __forceinline__ bool TileMasked(const Args& a, int q0, int rows, int k0, int cols) {
  return kTerms || q0 + rows > a.t_q || k0 + cols > a.t_k ||
         (a.causal && k0 + cols - 1 > q0 + a.causal_offset);
}

// Queues (cp.async, one committed group) the K and V tiles of keys [k0, k0 +
// kRows) into stage `stage` of kvs: 2 stages of a K tile then a V tile,
// [kRows][kD + 8] each. The forward and dq kernels load the next key block's
// tiles into the other stage while this one's are used.
template <typename T, int kD, int kRows>
__device__ __forceinline__ void LoadKeyValueStage(T* kvs, int stage, const T* k, const T* v,
                                                  const Args& a, int k0) {
  constexpr int kLd = kD + 8;
  T* ks = kvs + stage * 2 * kRows * kLd;
  LoadTile<T, kD, kRows>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, a.vec);
  LoadTile<T, kD, kRows>(ks + kRows * kLd, kLd, v, a.sv.t, k0, a.t_k - k0, a.vec);
  CpAsyncCommit();
}

template <typename T, int kD>
constexpr FlashAttentionTiles MmaTiles(FlashAttentionPass pass) {
  return FlashAttentionTilesFor(FlashAttentionKernel::kTensorCore, pass, kD, sizeof(T));
}

// Forward: CTA = 64 queries (4 warps x 16 rows) of one (batch, head); loops
// over key tiles of 64 up to the causal limit with the online softmax.
template <typename T, int kD, bool kDrop, bool kTerms>
__global__ void __launch_bounds__(128) ForwardMmaKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = MmaTiles<T, kD>(FlashAttentionPass::kForward);
  constexpr int kBr = kTiles.rows, kBc = kTiles.step, kLd = kD + 8;
  static_assert(kBr == 64 && kBc % 16 == 0, "4 warps of 16 rows");
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [kBr][kLd]
  T* kvs = qs + kBr * kLd;             // 2 stages of a K tile then a V tile, [kBc][kLd] each

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;  // causal: the longest rows start first
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;

  LoadTile<T, kD, kBr>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, a.vec);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float o[kD / 8][4] = {};
  float m[2] = {-kInf, -kInf};  // running max of the base-2 scores
  float l[2] = {0.0f, 0.0f};    // this thread's part of the running sum
  const int k_end = KeyEnd(a, q0, kBr);
  if (k_end > 0) {
    LoadKeyValueStage<T, kD, kBc>(kvs, 0, k, v, a, 0);
  } else {
    DrainUnusedCopies();  // Q's (no key is visible to these rows)
  }

  for (int k0 = 0, stage = 0; k0 < k_end; k0 += kBc, stage ^= 1) {
    CpAsyncWaitAll();  // this thread's copies of Q and of this block's tiles
    __syncthreads();   // everyone's; and every warp is done with the other stage
    if (k0 + kBc < k_end) LoadKeyValueStage<T, kD, kBc>(kvs, stage ^ 1, k, v, a, k0 + kBc);
    const T* ks = kvs + stage * 2 * kBc * kLd;  // [kBc][kLd]
    const T* vs = ks + kBc * kLd;               // [kBc][kLd]

    float s[kBc / 8][4] = {};
    WarpGemmABt<T, kD, kBc>(s, qs + warp * 16 * kLd, ks, kLd, lane);
    // With score terms every tile is checked (padded keys can be anywhere).
    const bool masked =
        kTerms || k0 + kBc > a.t_k || (a.causal && k0 + kBc - 1 > q0 + a.causal_offset);
    // A tile with every pair visible keeps its raw scores: with a positive
    // scale, max(s) * scale_log2 is the max of the scaled scores (rounding is
    // monotonic), and exp2(s * scale_log2 - m) is one fused multiply-add, where
    // scaling first took a multiply per score more. The other tiles are scaled
    // (and masked, biased) here, their factor 1.
    const bool raw = !masked && a.scale_log2 > 0.0f;
    const float sc = raw ? a.scale_log2 : 1.0f;
    if (!raw) {
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + j * 8 + 2 * t + (e & 1);
          if (!masked) {
            s[j][e] *= a.scale_log2;
          } else if (Visible<kTerms>(a, b, row[e / 2], key)) {
            s[j][e] = s[j][e] * a.scale_log2 + Bias2<kTerms>(a, b, h, row[e / 2], key);
          } else {
            s[j][e] = -kInf;
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -kInf;
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));  // the 4 threads of a row
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      const float m_new = fmaxf(m[r], mx * sc);
      const float m_use = m_new == -kInf ? 0.0f : m_new;  // no row key yet: avoid inf - inf
      const float alpha = exp2f(m[r] - m_use);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
        s[j][2 * r] = exp2f(fmaf(s[j][2 * r], sc, -m_use));
        s[j][2 * r + 1] = exp2f(fmaf(s[j][2 * r + 1], sc, -m_use));
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
    WarpGemmPB<T, kBc, kD>(o, s, vs, kLd, lane);
  }

  T* y = static_cast<T*>(a.y) + b * a.sy.b + h * a.sy.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r];
    lt += __shfl_xor_sync(kFullMask, lt, 1);
    lt += __shfl_xor_sync(kFullMask, lt, 2);
    if (row[r] >= a.t_q) continue;
    const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
    T* yr = y + row[r] * a.sy.t + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      St32(yr + j * 8, FromF2<T>(o[j][2 * r] * inv, o[j][2 * r + 1] * inv));
    }
    if (t == 0) {
      a.lse[static_cast<int64_t>(bh) * a.t_q + row[r]] =
          lt > 0.0f ? (m[r] + log2f(lt)) * kLn2 : -kInf;
    }
  }
}

// Backward dk, dv: CTA = 64 keys (4 warps x 16 rows) of one (batch, head);
// loops over query tiles from the first query that sees the block.
// kDq (the atomic-dq backward, FlashAttentionPass::kBackwardDkDvDq): each
// query block's dS also goes to shared memory, and the CTA adds dQ += dS K
// for its keys into a.dq_accum with float atomics (warps split the block's
// query rows, and for D = 128 the columns too).
// kNarrow (FlashAttentionPass::kBackwardDkDvNarrow, built for D = 64 without
// dropout or score terms): 32 queries a step, compiled for 4 CTAs an SM (128
// registers; sm_90 ptxas: no spills), 3 at 64 queries (168).
template <typename T, int kD, bool kDrop, bool kTerms, bool kDq, bool kNarrow = false>
__global__ void __launch_bounds__(128, kNarrow ? 4 : 0) BackwardDkDvMmaKernel(const Args a) {
  static_assert(!kNarrow || !kDq, "the narrow pass is the deterministic backward's");
  constexpr FlashAttentionTiles kTiles =
      MmaTiles<T, kD>(kDq       ? FlashAttentionPass::kBackwardDkDvDq
                      : kNarrow ? FlashAttentionPass::kBackwardDkDvNarrow
                                : FlashAttentionPass::kBackwardDkDv);
  constexpr int kBc = kTiles.rows, kBr = kTiles.step, kLd = kD + 8;
  static_assert(kBc == 64 && kBr % 16 == 0, "4 warps of 16 keys");
  // dQ's split over the 4 warps: kRowGroups groups of 16 query rows, each
  // group's kD columns in kColSplit parts.
  constexpr int kRowGroups = kBr / 16, kColSplit = 4 / kRowGroups, kDqCols = kD / kColSplit;
  static_assert(kRowGroups * kColSplit == 4 && kDqCols % 16 == 0, "dQ tiles of 4 warps");
  constexpr int kLdS = kBc + 8;  // dS rows: kBc keys, padded as the other tiles
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // [kBc][kLd]
  T* vs = ks + kBc * kLd;              // [kBc][kLd]
  T* qdos = vs + kBc * kLd;            // 2 stages of a Q tile then a dO tile, [kBr][kLd] each
  // 2 stages of lse (base 2) then delta, [kBr] each.
  float* lse_deltas = reinterpret_cast<float*>(qdos + 2 * 2 * kBr * kLd);
  T* dss = reinterpret_cast<T*>(lse_deltas + 2 * 2 * kBr);  // kDq: dS, [kBr][kLdS]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int k0 = blockIdx.y * kBc;  // causal: the first key blocks see the most queries
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h;
  const float* lse = a.lse + static_cast<int64_t>(bh) * a.t_q;
  const float* delta = a.delta + static_cast<int64_t>(bh) * a.t_q;

  LoadTile<T, kD, kBc>(ks, kLd, k, a.sk.t, k0, a.t_k - k0, a.vec);
  LoadTile<T, kD, kBc>(vs, kLd, v, a.sv.t, k0, a.t_k - k0, a.vec);
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  float dk[kD / 8][4] = {};
  float dv[kD / 8][4] = {};
  int q_begin = 0;
  if (a.causal) q_begin = max(0, k0 - a.causal_offset) / kBr * kBr;
  // The next query block's tiles load into the other stage while this one's
  // are used.
  auto load_q = [&](int stage, int q0) {
    T* qs = qdos + stage * 2 * kBr * kLd;
    LoadTile<T, kD, kBr>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, a.vec);
    LoadTile<T, kD, kBr>(qs + kBr * kLd, kLd, dout, a.sdo.t, q0, a.t_q - q0, a.vec);
    CpAsyncCommit();
    float* lse_s = lse_deltas + stage * 2 * kBr;
    for (int i = threadIdx.x; i < kBr; i += blockDim.x) {
      const bool in = q0 + i < a.t_q;
      lse_s[i] = in ? Lse2(lse[q0 + i]) : kInf;
      lse_s[kBr + i] = in ? delta[q0 + i] : 0.0f;
    }
  };
  if (q_begin < a.t_q) {
    load_q(0, q_begin);
  } else {
    DrainUnusedCopies();  // K's and V's (no query sees these keys)
  }

  for (int q0 = q_begin, stage = 0; q0 < a.t_q; q0 += kBr, stage ^= 1) {
    CpAsyncWaitAll();  // this thread's copies of K, V and of this block's tiles
    __syncthreads();   // everyone's; and every warp is done with the other stage
    if (q0 + kBr < a.t_q) load_q(stage ^ 1, q0 + kBr);
    const T* qs = qdos + stage * 2 * kBr * kLd;         // [kBr][kLd]
    const T* dos = qs + kBr * kLd;                      // [kBr][kLd]
    const float* lse_s = lse_deltas + stage * 2 * kBr;  // [kBr]
    const float* delta_s = lse_s + kBr;                 // [kBr]

    // P^T (16 keys x kBr queries) = exp2(scale_log2 * K Q^T - lse2).
    float p[kBr / 8][4] = {};
    WarpGemmABt<T, kD, kBr>(p, ks + warp * 16 * kLd, qs, kLd, lane);
    if (!TileMasked<kTerms>(a, q0, kBr, k0, kBc)) {  // every pair visible: no checks
#pragma unroll
      for (int j = 0; j < kBr / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[j][e] = exp2f(p[j][e] * a.scale_log2 - lse_s[j * 8 + 2 * t + (e & 1)]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kBr / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = j * 8 + 2 * t + (e & 1);
          p[j][e] = Visible<kTerms>(a, b, q0 + qi, key[e / 2])
                        ? exp2f(p[j][e] * a.scale_log2 +
                                Bias2<kTerms>(a, b, h, q0 + qi, key[e / 2]) - lse_s[qi])
                        : 0.0f;
        }
      }
    }
    if constexpr (!kDrop) WarpGemmPB<T, kBr, kD>(dv, p, dos, kLd, lane);  // dV += P^T dO
    // dS^T = P^T * (M * (V dO^T) - delta) with M the dropout factors; with
    // dropout, then P^T *= M and dV += (M P)^T dO.
    float ds[kBr / 8][4] = {};
    WarpGemmABt<T, kD, kBr>(ds, vs + warp * 16 * kLd, dos, kLd, lane);
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
    if constexpr (kDrop) WarpGemmPB<T, kBr, kD>(dv, p, dos, kLd, lane);
    WarpGemmPB<T, kBr, kD>(dk, ds, qs, kLd, lane);  // dK += dS^T Q (times scale below)
    if constexpr (kDq) {
      // dS (kBr queries x kBc keys), rounded to T as for dK, then dQ += dS K.
#pragma unroll
      for (int j = 0; j < kBr / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = j * 8 + 2 * t + (e & 1), kj = warp * 16 + g + (e / 2) * 8;
          dss[qi * kLdS + kj] = FromF<T>(ds[j][e]);
        }
      }
      __syncthreads();  // every warp's keys; the next write is after the loop's sync
      const int rows0 = (warp % kRowGroups) * 16, cols0 = (warp / kRowGroups) * kDqCols;
      float dq[kDqCols / 8][4] = {};
      WarpGemmAB<T, kBc, kDqCols>(dq, dss + rows0 * kLdS, kLdS, ks + cols0, kLd, lane);
      float* dq_rows =
          a.dq_accum + (static_cast<int64_t>(bh) * a.t_q + q0 + rows0) * kD + cols0 + 2 * t;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (q0 + rows0 + g + 8 * r >= a.t_q) continue;
        float* dq_row = dq_rows + (g + 8 * r) * kD;
#pragma unroll
        for (int j = 0; j < kDqCols / 8; ++j) {
          atomicAdd(dq_row + j * 8, dq[j][2 * r]);
          atomicAdd(dq_row + j * 8 + 1, dq[j][2 * r + 1]);
        }
      }
    }
  }

  T* dkp = static_cast<T*>(a.dk) + b * a.sdk.b + h * a.sdk.h;
  T* dvp = static_cast<T*>(a.dv) + b * a.sdv.b + h * a.sdv.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= a.t_k) continue;
    T* dkr = dkp + key[r] * a.sdk.t + 2 * t;
    T* dvr = dvp + key[r] * a.sdv.t + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      St32(dkr + j * 8, FromF2<T>(dk[j][2 * r] * a.scale, dk[j][2 * r + 1] * a.scale));
      St32(dvr + j * 8, FromF2<T>(dv[j][2 * r], dv[j][2 * r + 1]));
    }
  }
}

// Backward dq: CTA = 64 queries (4 warps x 16 rows); loops over key tiles
// (kNarrow, FlashAttentionPass::kBackwardDqNarrow: of 32 keys).
template <typename T, int kD, bool kDrop, bool kTerms, bool kNarrow = false>
__global__ void __launch_bounds__(128) BackwardDqMmaKernel(const Args a) {
  constexpr FlashAttentionTiles kTiles = MmaTiles<T, kD>(
      kNarrow ? FlashAttentionPass::kBackwardDqNarrow : FlashAttentionPass::kBackwardDq);
  constexpr int kBr = kTiles.rows, kBc = kTiles.step, kLd = kD + 8;
  static_assert(kBr == 64 && kBc % 16 == 0, "4 warps of 16 rows");
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [kBr][kLd]
  T* dos = qs + kBr * kLd;             // [kBr][kLd]
  T* kvs = dos + kBr * kLd;            // 2 stages of a K tile then a V tile, [kBc][kLd] each

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int b, h;
  if (!DqExample(a, &b, &h)) return;
  const int bh = b * a.heads + h;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const T* q = static_cast<const T*>(a.q) + b * a.sq.b + h * a.sq.h;
  const T* k = static_cast<const T*>(a.k) + b * a.sk.b + h * a.sk.h;
  const T* v = static_cast<const T*>(a.v) + b * a.sv.b + h * a.sv.h;
  const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h;

  LoadTile<T, kD, kBr>(qs, kLd, q, a.sq.t, q0, a.t_q - q0, a.vec);
  LoadTile<T, kD, kBr>(dos, kLd, dout, a.sdo.t, q0, a.t_q - q0, a.vec);
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
  const int k_end = KeyEnd(a, q0, kBr);

  if (k_end > 0) {
    LoadKeyValueStage<T, kD, kBc>(kvs, 0, k, v, a, 0);
  } else {
    DrainUnusedCopies();  // Q's and dO's (no key is visible to these rows)
  }

  for (int k0 = 0, stage = 0; k0 < k_end; k0 += kBc, stage ^= 1) {
    CpAsyncWaitAll();  // this thread's copies of Q, dO and of this block's tiles
    __syncthreads();   // everyone's; and every warp is done with the other stage
    if (k0 + kBc < k_end) LoadKeyValueStage<T, kD, kBc>(kvs, stage ^ 1, k, v, a, k0 + kBc);
    const T* ks = kvs + stage * 2 * kBc * kLd;  // [kBc][kLd]
    const T* vs = ks + kBc * kLd;               // [kBc][kLd]

    float p[kBc / 8][4] = {};
    WarpGemmABt<T, kD, kBc>(p, qs + warp * 16 * kLd, ks, kLd, lane);
    float ds[kBc / 8][4] = {};
    WarpGemmABt<T, kD, kBc>(ds, dos + warp * 16 * kLd, vs, kLd, lane);  // dP = dO V^T
    if (!kDrop && !TileMasked<kTerms>(a, q0, kBr, k0, kBc)) {  // every pair visible: no checks
#pragma unroll
      for (int j = 0; j < kBc / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2;
          ds[j][e] = exp2f(p[j][e] * a.scale_log2 - lse2[r]) * (ds[j][e] - delta[r]);
        }
      }
      WarpGemmPB<T, kBc, kD>(dq, ds, ks, kLd, lane);  // dQ += dS K (times scale below)
      continue;
    }
#pragma unroll
    for (int j = 0; j < kBc / 8; ++j) {
      float f[2][2];
      DropFactorPair<kDrop>(a, bh, row[0], k0 + j * 8 + 2 * t, f[0]);
      DropFactorPair<kDrop>(a, bh, row[1], k0 + j * 8 + 2 * t, f[1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, kj = k0 + j * 8 + 2 * t + (e & 1);
        const float pr =
            Visible<kTerms>(a, b, row[r], kj)
                ? exp2f(p[j][e] * a.scale_log2 + Bias2<kTerms>(a, b, h, row[r], kj) - lse2[r])
                : 0.0f;
        ds[j][e] = pr * (ds[j][e] * f[r][e & 1] - delta[r]);
        AddDScore<kTerms>(a, row[r], kj, ds[j][e]);
      }
    }
    WarpGemmPB<T, kBc, kD>(dq, ds, ks, kLd, lane);  // dQ += dS K (times scale below)
  }

  T* dqp = static_cast<T*>(a.dq) + b * a.sdq.b + h * a.sdq.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= a.t_q) continue;
    T* dr = dqp + row[r] * a.sdq.t + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      St32(dr + j * 8, FromF2<T>(dq[j][2 * r] * a.scale, dq[j][2 * r + 1] * a.scale));
    }
  }
}

}  // namespace

Kernels MmaKernels(Dtype dtype, int64_t d, bool dropout, bool terms) {
  OP_CHECK(dtype == Dtype::kBF16 || dtype == Dtype::kF16, "flash_attention",
           "the tensor-core kernels take bf16 or f16, not ", DtypeName(dtype));
  return SelectKernels(dtype, d, dropout, terms, [](auto zero, auto dim, auto drop, auto extra) {
    using T = decltype(zero);
    constexpr int kD = decltype(dim)::value;
    constexpr bool kDrop = decltype(drop)::value, kTerms = decltype(extra)::value;
    if constexpr (std::is_same_v<T, float>) {
      return Kernels{};  // refused above: no f32 tensor-core kernels
    } else {
      KernelFn dkdv_narrow = nullptr, dq_narrow = nullptr;  // gpt2's case, see attention.h
      if constexpr (kD == 64 && !kDrop && !kTerms) {
        dkdv_narrow = BackwardDkDvMmaKernel<T, kD, kDrop, kTerms, false, true>;
        dq_narrow = BackwardDqMmaKernel<T, kD, kDrop, kTerms, true>;
      }
      return Kernels{ForwardMmaKernel<T, kD, kDrop, kTerms>,
                     BackwardDkDvMmaKernel<T, kD, kDrop, kTerms, false>,
                     BackwardDqMmaKernel<T, kD, kDrop, kTerms>,
                     BackwardDkDvMmaKernel<T, kD, kDrop, kTerms, true>,
                     dkdv_narrow,
                     dq_narrow};
    }
  });
}

}  // namespace flash
}  // namespace cuda
}  // namespace tensor
