// What the fused attention's files share (attention.h has the design):
// the kernels' argument block, the score terms every kernel applies
// (masking, bias, dropout), and the kernel tables each family exports.
//   attention.cu        host entry points, argument checks, delta and key mask
//   attention_mma.cu    the tensor-core kernels (bf16, f16)
//   attention_float.cu  the float kernels (f32, bf16, f16)
// Kernel launches stay in the .cu files (the CUDA emulation rewrites launches
// in .cu sources only); the families hand attention.cu kernel pointers.
#ifndef TENSOR_CUDA_ATTENTION_INTERNAL_CUH_
#define TENSOR_CUDA_ATTENTION_INTERNAL_CUH_

#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/philox.cuh"

namespace tensor {
namespace cuda {
namespace flash {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

// Element strides of a (B, H, T, D) tensor with unit stride in D.
struct Strides {
  int64_t b, h, t;
};

// The dtype of the bias as the kernels read it.
enum class BiasType : uint8_t { kF32, kBF16, kF16 };

// Everything a kernel needs; passed by value.
struct Args {
  const void* q;
  const void* k;
  const void* v;
  const void* out;       // backward: the forward's output (strides sy)
  const void* grad_out;  // backward
  void* y;               // forward: out; backward: unused
  void* dq;
  void* dk;
  void* dv;
  float* lse;    // (B, H, T_q)
  float* delta;  // backward workspace (B, H, T_q)
  Strides sq, sk, sv, sdo;
  Strides sy;             // forward: y; backward: out (read)
  Strides sdq, sdk, sdv;  // backward outputs
  int batch, heads;
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
  // Score terms (FlashScoreTerms), read by the kernels compiled with kTerms:
  const void* bias;  // (B or 1, H, T_q, T_k) contiguous, or null
  BiasType bias_type;
  int64_t bias_sb, bias_sh;  // element strides of its batch (0: broadcast) and head
  const uint8_t* key_keep;   // (B, T_k): 0 masks the key; or null
  // Backward, the bias's gradient (FlashBiasGradGroups): the dq launch is pass
  // dq_pass of dq_passes; its CTA (slot * heads + h, query block) takes example
  // slot * dq_passes + dq_pass and adds dS into slot `slot` of dbias_slots,
  // (slots, H, T_q, T_k) f32 zeroed before the first pass; or null. Without
  // it: one pass, slot = example.
  float* dbias_slots;
  int dq_pass, dq_passes;
  // Backward with atomic dq (kernels.dkdv_dq): (B, H, T_q, D) f32, zeroed,
  // contiguous; each key block's dS K added in, unscaled.
  float* dq_accum;
};

// The example and head of a dq kernel's CTA; false for the CTAs of a short
// last group that have no example in this pass.
__device__ __forceinline__ bool DqExample(const Args& a, int* b, int* h) {
  const int slot = static_cast<int>(blockIdx.x) / a.heads;
  *h = static_cast<int>(blockIdx.x) % a.heads;
  *b = slot * a.dq_passes + a.dq_pass;
  return *b < a.batch;
}

// A kernel of either family: every kernel takes the argument block.
using KernelFn = void (*)(Args);

// The kernels of one configuration (dtype, head size, dropout, score terms).
// dkdv_dq: dk, dv and the atomic adds of dq in one pass (tensor-core family
// only; null for the float kernels).
// dkdv_narrow, dq_narrow: the kernels of FlashAttentionPass::
// kBackwardDkDvNarrow and kBackwardDqNarrow, null where they are not built
// (all but the tensor cores' head size 64 without dropout or score terms).
struct Kernels {
  KernelFn forward, dkdv, dq, dkdv_dq, dkdv_narrow, dq_narrow;
};

// The tensor-core kernels (dtype bf16 or f16) and the float kernels (f32,
// bf16, f16) for head size d in {32, 64, 128}; throw OpError otherwise.
Kernels MmaKernels(Dtype dtype, int64_t d, bool dropout, bool terms);
Kernels FloatKernels(Dtype dtype, int64_t d, bool dropout, bool terms);

// ---- The score terms, shared by every kernel ----

// Whether `query` attends `key` of example b: both in range, causal order,
// and (kTerms) the key not padded.
template <bool kTerms>
__device__ __forceinline__ bool Visible(const Args& a, int b, int query, int key) {
  if (query >= a.t_q || key >= a.t_k || (a.causal && key > query + a.causal_offset)) return false;
  if constexpr (kTerms) {
    if (a.key_keep != nullptr && a.key_keep[static_cast<int64_t>(b) * a.t_k + key] == 0) {
      return false;
    }
  }
  return true;
}

// The bias of (b, h, query, key) times log2(e), to add to the base-2 scores;
// 0 without a bias. Only for visible (in range) pairs.
template <bool kTerms>
__device__ __forceinline__ float Bias2(const Args& a, int b, int h, int query, int key) {
  if constexpr (!kTerms) {
    return 0.0f;
  } else {
    if (a.bias == nullptr) return 0.0f;
    const int64_t i = b * a.bias_sb + h * a.bias_sh + static_cast<int64_t>(query) * a.t_k + key;
    float x;
    switch (a.bias_type) {
      case BiasType::kF32:
        x = static_cast<const float*>(a.bias)[i];
        break;
      case BiasType::kBF16:
        x = ToF(static_cast<const __nv_bfloat16*>(a.bias)[i]);
        break;
      default:
        x = ToF(static_cast<const __half*>(a.bias)[i]);
        break;
    }
    return x * kLog2e;
  }
}

// Backward dq kernels (kTerms): adds dS of an in-range pair (the gradient of
// the scores, i.e. of an additive bias) into the CTA's slot of dbias_slots
// (slot * heads + h = blockIdx.x) when the caller asked for it. Each element
// of a slot is only ever touched by the same thread of the same CTA position,
// one pass after another: no atomics, a fixed order.
template <bool kTerms>
__device__ __forceinline__ void AddDScore(const Args& a, int query, int key, float ds) {
  if constexpr (kTerms) {
    if (a.dbias_slots != nullptr && query < a.t_q && key < a.t_k) {
      a.dbias_slots[(static_cast<int64_t>(blockIdx.x) * a.t_q + query) * a.t_k + key] += ds;
    }
  }
}

// The element index of probability (bh, query, key) in (B, H, T_q, T_k).
__device__ __forceinline__ uint64_t ProbIndex(const Args& a, int bh, int query, int key) {
  return (static_cast<uint64_t>(bh) * a.t_q + query) * a.t_k + key;
}

// The dropout factor of probability (bh, query, key): 0 or drop_scale; 1
// in the kernels compiled without dropout (kDrop false: the kernels of plain
// attention keep their registers). Outside the (T_q, T_k) range the
// probability is 0 anyway.
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

// The stored natural-log lse as the base-2 offset of the backward's exp2;
// rows with no visible key (-inf) get +inf so that every probability is 0.
__device__ __forceinline__ float Lse2(float lse) { return lse == -kInf ? kInf : lse * kLog2e; }

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
      ThrowOpError("flash_attention", "head size ", d, " is not supported (32, 64 or 128)");
  }
}

// Calls fn(std::bool_constant<on>{}): the kernels with or without a feature's code.
template <typename Fn>
void DispatchBool(bool on, Fn&& fn) {
  if (on) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// The kernels of one configuration, from make(T{}, dim, drop, terms): T the
// CUDA type of a floating dtype, dim an integral constant (the head size),
// drop and terms bool constants (the compile-time flags). Each family passes
// a lambda naming its three kernel templates.
template <typename Make>
Kernels SelectKernels(Dtype dtype, int64_t d, bool dropout, bool terms, Make&& make) {
  Kernels out{};
  DispatchFloat(dtype, "flash_attention", [&](auto zero) {
    DispatchHeadDim(d, [&](auto dim) {
      DispatchBool(dropout, [&](auto drop) {
        DispatchBool(terms, [&](auto extra) { out = make(zero, dim, drop, extra); });
      });
    });
  });
  return out;
}

}  // namespace flash
}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ATTENTION_INTERNAL_CUH_
