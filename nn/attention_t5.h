// T5Attention: T5's multi-head attention (Hugging Face T5Attention), used as
// encoder self-attention, decoder (causal) self-attention and decoder
// cross-attention.
//
//   q = q(x), k = k(kv), v = v(kv)      // (B, nh, T, d_kv), (B, nh, S, d_kv); kv = x or enc
//   scores = q k^T + position_bias      // no 1/sqrt(d_kv): T5 folds it into q's init
//   p = softmax(scores, masks)          // causal (decoder self-attention), key padding
//   out = o(dropout(p) @ v merged)      // (B, T, d_model)
//
// Children `q`, `k`, `v`, `o` are Linear layers without bias (T5 naming:
// `SelfAttention.q.weight`, `EncDecAttention.k.weight`, ...). With
// has_relative_bias the layer also owns `relative_attention_bias`, a
// RelativePositionBias (parameter `relative_attention_bias.weight`), adds its
// bias and returns it as a second output so that the other layers of the
// stack can take it as their position_bias input, as in Hugging Face.
//
// Masks are separate from the bias (Hugging Face folds them into
// position_bias): masked keys get -inf before the softmax, and a query row with
// no key left (e.g. an all-padding encoder sequence) gets output 0 instead of
// NaN (Hugging Face's finite mask would give a uniform average there).
//
// Precision as CausalSelfAttention: compute dtype = the projections' weights'
// dtype; scores and softmax f32; input gradients in the callers' dtypes;
// parameter gradients fp32.
#ifndef NN_ATTENTION_T5_H_
#define NN_ATTENTION_T5_H_

#include <utility>
#include <cstdint>

#include "nn/attention_core.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/relative_position_bias.h"
#include "tensor/random.h"

namespace nn {

struct T5AttentionOptions {
  // Owns `relative_attention_bias` (the first layer of a T5 stack); not with
  // cross_attention.
  bool has_relative_bias = false;
  // Decoder self-attention: causal mask, and unidirectional bucketing for the
  // relative bias (Hugging Face: is_decoder). Not with cross_attention.
  bool causal = false;
  // Keys and values come from a second input (the encoder output).
  bool cross_attention = false;
  // Dropout on the attention probabilities (T5's dropout_rate).
  float dropout = 0.0f;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  // Hugging Face's initializer_factor: q ~ N(0, f (d_model d_kv)^-1/2), k, v and
  // the relative bias ~ N(0, f d_model^-1/2), o ~ N(0, f (n_heads d_kv)^-1/2).
  float initializer_factor = 1.0f;
  // Seed of the dropout generator.
  uint64_t seed = 0;
};

class T5Attention : public Module, public RandomSource {
 public:
  T5Attention(int64_t d_model, int64_t n_heads, int64_t d_kv, T5AttentionOptions options = {});

  int64_t d_model() const { return d_model_; }
  int64_t n_heads() const { return n_heads_; }
  int64_t d_kv() const { return d_kv_; }
  const T5AttentionOptions& options() const { return options_; }
  Linear* q() { return q_; }
  Linear* k() { return k_; }
  Linear* v() { return v_; }
  Linear* o() { return o_; }
  RelativePositionBias* relative_attention_bias() { return relative_bias_; }  // or nullptr
  tensor::Generator& generator() override { return gen_; }

  // Incremental decoding (generation; forward only, no dropout): Forward's
  // outputs for the new positions, as Forward over the whole sequence in eval
  // mode gives them, from the keys and values `cache` holds. inputs as
  // Forward's, with x (B, T_new, d_model):
  // - causal self-attention: x holds positions cache.length ..
  //   cache.length + T_new - 1; their keys and values join the cache
  //   (allocated on first use for `capacity` positions) and each query
  //   attends the positions up to its own. position_bias, when given, is
  //   (B or 1, nh, T_new, cache.length + T_new); a layer with
  //   has_relative_bias computes that bias itself (queries from position
  //   cache.length on) and returns it as the second output.
  // - cross-attention: kv (B, S, d_model) is projected into the cache on the
  //   first call (capacity ignored; cache.length becomes S); later calls read
  //   the cache and may leave kv undefined.
  // key_mask: (B, keys) over every key attended, or undefined. Throws OpError
  // for an encoder (bidirectional) self-attention, a cache of another batch,
  // dtype or device, or positions past its capacity.
  Tensors Decode(const Tensors& inputs, KvCache& cache, int64_t capacity);

 protected:
  // inputs (trailing ones may be left out or undefined):
  //   [0] x (B, T, d_model)
  //   [1] kv: the encoder output (B, S, d_model) for cross-attention; undefined
  //       for self-attention (then S = T)
  //   [2] position_bias (B or 1, n_heads, T, S), any floating dtype; not with
  //       has_relative_bias
  //   [3] key padding mask (B, S) of 0/1 (any dtype; 0 masks the key)
  //   [4] residual (B, T, d_model): y becomes residual + y in the residual's
  //       dtype, added in the output projection's GEMM (Linear::RunResidual)
  // outputs: {y (B, T, d_model)} in the compute dtype, and with
  // has_relative_bias also {bias (1, n_heads, T, S)} (the weight's dtype).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad_outputs: {grad_y} or, with has_relative_bias, {grad_y, grad_bias}
  // (grad_bias may be undefined: the gradient of the returned bias from the
  // layers that reused it). Returns one gradient per input: grad_x, grad_kv
  // (cross-attention), grad_position_bias (when given), undefined for the mask,
  // grad_y for the residual; each in its input's dtype.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  // Forward's and Decode's inputs by name, checked: x (B, T, d_model), the
  // residual shaped as x, no position_bias for a layer with its own. Throws
  // OpError naming what is wrong.
  struct Inputs {
    Tensor x, kv, bias, mask, residual;
  };
  Inputs CheckedInputs(const Tensors& inputs) const;
  // q's projection of x (B, T, nh * d_kv), in the compute dtype (q's
  // weight's), and x cast to it (B, T, d_model), which q projected. A q that
  // is an FSDP unit of its own (a frozen q under --freeze) holds its weight
  // only inside its Run: then q projects x as it is (Linear casts it) and the
  // cast x is undefined: the projection's dtype says the compute dtype.
  std::pair<Tensor, Tensor> ProjectQ(const Tensor& x, Context& ctx);

  struct Saved {
    AttentionState attn;  // q, k, v views of the projections, probs (B, nh, T, S)
    size_t num_inputs = 1;
    tensor::Shape x_shape;  // (B, T, d_model)
    tensor::Dtype x_dtype = tensor::Dtype::kF32;
    tensor::Dtype kv_dtype = tensor::Dtype::kF32;  // cross-attention
    tensor::Shape own_bias_shape;                  // (1, nh, T, S) with has_relative_bias
  };
  const int64_t d_model_;
  const int64_t n_heads_;
  const int64_t d_kv_;
  const T5AttentionOptions options_;
  tensor::Generator gen_;
  Linear* q_;                                      // (nh * d_kv, d_model)
  Linear* k_;                                      // (nh * d_kv, d_model)
  Linear* v_;                                      // (nh * d_kv, d_model)
  Linear* o_;                                      // (d_model, nh * d_kv)
  RelativePositionBias* relative_bias_ = nullptr;  // weight (n_buckets, nh)
};

}  // namespace nn

#endif  // NN_ATTENTION_T5_H_
