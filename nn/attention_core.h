// The attention computation shared by the attention layers (minGPT's
// CausalSelfAttention, T5Attention): softmax(scale * q k^T + bias, masked) @ v
// over a batch of heads, with dropout on the probabilities, and its backward.
// The layers own the projections and the head layout; this part owns the
// (B, nh, T_q, T_k) scores.
//
// Work is batched over (B, nh): two batched GEMMs that read q, k and v as
// strided views (e.g. heads sliced out of a fused qkv projection, no transposed
// copies), one row softmax in place on the scores (with the causal mask of the
// softmax op when no other mask applies). No per-head loops.
//
// Precision: q, k, v share the compute dtype (f32 or bf16). Scores and the
// softmax are f32 (bf16 inputs give f32 GEMM outputs); the probabilities are
// kept and saved in the compute dtype; gradients of q, k, v come back in it,
// the bias gradient in the bias's dtype.
//
// On a CUDA device attention with head sizes 32, 64 or 128 (hs_v == hs) goes
// to the fused FlashAttention-2 style kernels (tensor/cuda/attention.h),
// with any mix of causal masking, scale, a bias, a key padding mask and
// attention dropout below 1: the forward allocates nothing (T_q, T_k), the
// state keeps the output and a (B, nh, T_q) logsumexp, and the dropout mask
// is regenerated in the kernels from the generator state the unfused path's
// dropout would draw (the same mask). With a bias, the backward holds the
// scores' gradient (B, nh, T_q, T_k) f32 while it runs (then sums it into the
// bias's shape). Another head size runs the path above on the GPU's kernels
// (it keeps the probabilities; dropout masks equal the CPU's for the same
// generator). f32, bf16 or f16.
#ifndef NN_ATTENTION_CORE_H_
#define NN_ATTENTION_CORE_H_

#include <cstdint>
#include <vector>

#include "nn/module.h"
#include "tensor/ops/dropout.h"
#include "tensor/random.h"

namespace nn {

struct AttentionOptions {
  // Layer name for error messages ("[t5_attention] ...").
  const char* op = "attention";
  // Multiplies q k^T (before the bias is added).
  float scale = 1.0f;
  // Query i (of T_q) attends keys j <= i + (T_k - T_q) only.
  bool causal = false;
  // Dropout on the probabilities (inverted; off when !training or 0).
  float dropout = 0.0f;
  bool training = true;
};

// The keys and values of one attention layer for the positions decoded so
// far (generation; forward only), filled by the layers' Decode
// (CausalSelfAttention, T5Attention; a cross-attention's hold the encoder
// output's, computed once).
struct KvCache {
  Tensor k;            // (B, nh, capacity, hs), compute dtype, on the layer's device
  Tensor v;            // (B, nh, capacity, hs_v)
  int64_t length = 0;  // positions [0, length) hold keys and values
};

// What the backward needs. Holds views of q, k, v (no copies) and the
// probabilities: (B, nh, T_q, T_k) in the compute dtype.
struct AttentionState {
  Tensor q;      // (B, nh, T_q, hs)
  Tensor k;      // (B, nh, T_k, hs)
  Tensor v;      // (B, nh, T_k, hs_v)
  Tensor probs;  // (B, nh, T_q, T_k), before dropout; 0 where masked
  tensor::DropoutState dropout;
  float scale = 1.0f;
  // Whether the softmax op applied the causal mask (else masks were written
  // into the scores as -inf).
  bool softmax_causal = false;
  bool has_bias = false;
  tensor::Shape bias_shape;
  tensor::Dtype bias_dtype = tensor::Dtype::kF32;
  // The CUDA path (fused flash attention, tensor/cuda/attention.h) keeps no
  // (T_q, T_k) tensor: probs stays undefined and the backward recomputes the
  // probabilities from q, k and the per-row logsumexp.
  bool flash = false;
  bool causal = false;
  Tensor out;         // (B, nh, T_q, hs), the forward's y (shared, not a copy)
  Tensor lse;         // (B, nh, T_q) f32: logsumexp of the scaled scores; -inf for rows with no key
  Tensor flash_bias;  // (B or 1, nh, T_q, T_k) on the device, contiguous; or undefined
  Tensor flash_key_mask;  // (B, T_k) u8 on the device, contiguous; or undefined
};

// dq, dk, dv in the compute dtype: on the fused CUDA path laid out (B, T, nh,
// hs) (MergeHeads of them is a view), contiguous otherwise.
struct AttentionGrads {
  Tensor dq;     // (B, nh, T_q, hs)
  Tensor dk;     // (B, nh, T_k, hs)
  Tensor dv;     // (B, nh, T_k, hs_v)
  Tensor dbias;  // the bias's shape and dtype; undefined without a bias
};

// y (B, nh, T_q, hs_v), compute dtype, laid out (B, T_q, nh, hs_v) (so
// MergeHeads(y) is a view); where
//   p = softmax(scale * q k^T + bias) with masked keys at -inf,
//   y = dropout(p) @ v.
// q (B, nh, T_q, hs), k (B, nh, T_k, hs), v (B, nh, T_k, hs_v): any strides
// with a unit stride in the last dim or the one before (views of projections).
// bias: undefined, or additive (B or 1, nh, T_q, T_k), any floating dtype.
// key_mask: undefined, or (B, T_k) of 0/1 (any dtype; nonzero keeps the key).
// A query row left with no key (all masked) gets probabilities 0, so output 0
// and no gradient, instead of NaN. Throws OpError("[options.op] ...") on shapes
// that do not fit together. Dropout draws from `gen`.
Tensor AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                        const Tensor& key_mask, const AttentionOptions& options,
                        tensor::Generator& gen, AttentionState* state);

// Gradients from grad_y (B, nh, T_q, hs_v) (any strides, any floating dtype:
// converted to the compute dtype) and the forward's state. `into`: optional
// dq, dk, dv (shaped like q, k, v, compute dtype, unit stride in hs, not
// overlapping) to write instead, e.g. views into one fused qkv gradient:
// the kernels and GEMMs write them in place, and the returned dq, dk, dv are
// those views. Without `into` they are laid out (B, T, nh, hs) as y.
AttentionGrads AttentionBackward(const Tensor& grad_y, const AttentionState& state,
                                 const AttentionGrads* into = nullptr);

// Throws OpError("[op] ...") unless `cache` was made for keys like `k`
// (B, nh, T, hs): the same batch, dtype and device.
void CheckKvCache(const KvCache& cache, const Tensor& k, const char* op);
// Appends k and v (B, nh, T, hs) at positions cache.length .. + T - 1 of
// `cache` (allocated on first use for `capacity` positions) and advances its
// length. Throws OpError("[op] ...") for a cache of another batch, dtype or
// device (CheckKvCache), or positions past its capacity.
void AppendToKvCache(KvCache& cache, const Tensor& k, const Tensor& v, int64_t capacity,
                     const char* op);
// Beam search's reordering: row i of the cache becomes what row rows[i] held
// (positions [0, length); rows has one entry per row of the cache). Nothing
// to do for a cache not allocated yet. Throws OpError("[op] ...") for a count
// or a row out of range.
void SelectKvCacheRows(KvCache& cache, const std::vector<int64_t>& rows, const char* op);

// (B, T, nh * hs) -> (B, nh, T, hs): a view, no copy (x may itself be a view,
// e.g. a Narrow of a fused qkv projection).
Tensor SplitHeads(const Tensor& x, int64_t n_heads);
// (B, nh, T, hs) -> (B, T, nh * hs): a view when x is laid out (B, T, nh,
// hs) (the fused attention's outputs), else contiguous (one copy).
Tensor MergeHeads(const Tensor& x);

}  // namespace nn

#endif  // NN_ATTENTION_CORE_H_
