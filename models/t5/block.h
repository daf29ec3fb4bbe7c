// T5's transformer block and its sub-layers, as in Hugging Face's
// modeling_t5.py, with the same child names so that parameters come out as
// "block.0.layer.0.SelfAttention.q.weight", "block.0.layer.1.DenseReluDense.wi.weight":
//   T5LayerSelfAttention   x + dropout(SelfAttention(layer_norm(x)))
//   T5LayerCrossAttention  x + dropout(EncDecAttention(layer_norm(x), encoder_hidden))
//   T5LayerFF              x + dropout(DenseReluDense(layer_norm(x)))
//   T5Block                layer.0 = self-attention, [layer.1 = cross-attention,]
//                          layer.1/2 = feed-forward
// Every sub-layer is pre-RMSNorm with a residual connection. The first block of
// a stack owns the relative position bias (in its self-attention) and returns
// it so the other blocks can reuse it; their gradients of that bias flow back
// to it through the first block's backward.
#ifndef MODELS_T5_BLOCK_H_
#define MODELS_T5_BLOCK_H_

#include <cstdint>

#include "models/t5/config.h"
#include "nn/attention_t5.h"
#include "nn/containers.h"
#include "nn/dropout.h"
#include "nn/feed_forward.h"
#include "nn/module.h"
#include "nn/rms_norm.h"

namespace t5 {

using nn::Context;
using nn::Tensor;
using nn::Tensors;

// Self-attention (encoder: bidirectional; decoder: causal) or cross-attention
// sub-layer. Class name "T5LayerSelfAttention" or "T5LayerCrossAttention";
// children "SelfAttention" / "EncDecAttention" (nn::T5Attention), "layer_norm",
// "dropout".
class T5LayerAttention : public nn::Module {
 public:
  enum class Kind { kEncoderSelf, kDecoderSelf, kCross };
  T5LayerAttention(const T5Config& config, Kind kind, bool has_relative_bias);

  nn::T5Attention* attention() { return attention_; }

  // Incremental decoding (nn::T5Attention::Decode; eval mode, forward only):
  // inputs and outputs as Forward's, for the new positions of x.
  Tensors Decode(const Tensors& inputs, nn::KvCache& cache, int64_t capacity);

 protected:
  // inputs: {x (B, T, d_model), kv (B, S, d_model) (cross only, else undefined),
  //          position_bias (1, nh, T, S) or undefined, key_mask (B, S) or undefined}
  // outputs: {y (B, T, d_model)} and, with the relative bias, {bias (1, nh, T, S)}.
  // y = x + dropout(attention(norm(x))); without the dropout running (p 0 or
  // eval mode) x joins in the attention's output GEMM (T5Attention's residual).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad_outputs: {grad_y} or {grad_y, grad_bias (may be undefined)}.
  // Returns {grad_x, grad_kv, grad_position_bias, undefined}, undefined where
  // the input was.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    tensor::Dtype x_dtype;
    size_t num_inputs;
    bool residual_in_projection = false;  // x added in the attention's GEMM; no dropout ran
  };
  nn::T5Attention* attention_;
  nn::RMSNorm* layer_norm_;
  nn::Dropout* dropout_;
};

// Feed-forward sub-layer "T5LayerFF": children "DenseReluDense"
// (nn::FeedForward, ReLU or gated GELU, dropout on the hidden activations),
// "layer_norm", "dropout".
class T5LayerFF : public nn::Module {
 public:
  explicit T5LayerFF(const T5Config& config);

 protected:
  // {x (B, T, d_model)} -> {y (B, T, d_model)}: x + dropout(FF(norm(x))).
  // Without the dropout running (p 0 or eval mode) x joins in the output
  // projection's GEMM (the residual input of nn::FeedForward).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    tensor::Dtype x_dtype;
    bool residual_in_projection = false;  // the dropout did not run
  };
  nn::FeedForward* dense_relu_dense_;
  nn::RMSNorm* layer_norm_;
  nn::Dropout* dropout_;
};

// A decoder block's keys and values during generation.
struct T5BlockCache {
  nn::KvCache self;   // (B, nh, capacity, d_kv): the decoder positions so far
  nn::KvCache cross;  // (B, nh, S, d_kv): the encoder output's, computed once
};

// One block of either stack; class name "T5Block" (what FSDP's transformer
// wrap policy and activation checkpointing match on). Child "layer", a
// ModuleList of the sub-layers above.
class T5Block : public nn::Module {
 public:
  // Input slots of Forward (every slot present; unused ones undefined).
  enum Input : size_t {
    kX = 0,              // (B, T, d_model)
    kPositionBias = 1,   // (1, nh, T, T) from the first block; undefined for the first block
    kMask = 2,           // (B, T) 0/1 key mask of self-attention, or undefined
    kEncoderHidden = 3,  // (B, S, d_model): decoder only
    kEncoderMask = 4,    // (B, S) 0/1 key mask of cross-attention, or undefined
    kNumInputs = 5,
  };

  T5Block(const T5Config& config, bool is_decoder, bool has_relative_bias);

  bool is_decoder() const { return is_decoder_; }
  bool has_relative_bias() const { return has_relative_bias_; }
  T5LayerAttention* self_attention();
  T5LayerAttention* cross_attention();  // nullptr in the encoder
  T5LayerFF* feed_forward();

  // Incremental decoding, decoder blocks only (forward only, eval mode):
  // inputs as Forward's with x (B, T_new, d_model) the positions after those
  // cache.self holds; the bias, when given, (1, nh, T_new, positions so
  // far); the self-attention mask (B, positions so far) or undefined.
  // Outputs as Forward's for those positions (block 0: with the bias it
  // computed, (1, nh, T_new, positions so far)). `capacity`: positions
  // cache.self can hold (allocated on first use).
  Tensors Decode(const Tensors& inputs, T5BlockCache& cache, int64_t capacity);

 protected:
  // inputs: the kNumInputs slots above (fewer: the rest undefined).
  // outputs: {y (B, T, d_model)}, and {bias (1, nh, T, T)} with the relative bias.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad_outputs: {grad_y} or {grad_y, grad_bias}: grad_bias (may be undefined)
  // is the sum of the other blocks' gradients of the returned bias. Returns
  // one gradient per input slot: grad_x, grad_position_bias (when given),
  // grad_encoder_hidden (decoder), undefined for the masks.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    size_t num_inputs;
  };
  const bool is_decoder_;
  const bool has_relative_bias_;
  nn::ModuleList* layer_;
};

}  // namespace t5

#endif  // MODELS_T5_BLOCK_H_
