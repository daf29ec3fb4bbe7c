// minGPT (Karpathy's) in C++: token + position embeddings, a stack of
// transformer Blocks (pre-LayerNorm causal self-attention and a GELU MLP, each
// with a residual connection), a final LayerNorm and an untied lm_head.
// Parameter names are Hugging Face GPT-2's ("transformer.h.0.attn.c_attn.weight").
// Initialization is minGPT's: N(0, 0.02) for Linear and Embedding weights,
// N(0, 0.02/sqrt(2 n_layer)) for the residual projections, zero biases, unit
// LayerNorm weights.
#ifndef MODELS_MINGPT_MODEL_H_
#define MODELS_MINGPT_MODEL_H_

#include <cstdint>

#include "models/mingpt/config.h"
#include "nn/attention.h"
#include "nn/containers.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/feed_forward.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace mingpt {

using nn::Context;
using nn::Tensor;
using nn::Tensors;

// One transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
// The class FSDP's transformer auto-wrap policy wraps ("Block").
class Block : public nn::Module {
 public:
  explicit Block(const GptConfig& config);

 protected:
  // {x (B, T, C)} -> {y (B, T, C)}
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  nn::LayerNorm* ln_1_;
  nn::CausalSelfAttention* attn_;
  nn::LayerNorm* ln_2_;
  nn::FeedForward* mlp_;
};

// wte, wpe, drop, h (the blocks), ln_f: everything but the head.
class Transformer : public nn::Module {
 public:
  explicit Transformer(const GptConfig& config);
  nn::ModuleList* blocks() { return h_; }

 protected:
  // {idx (B, T) i64} -> {x (B, T, C)} after ln_f
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    int64_t T;
  };
  const GptConfig config_;
  nn::Embedding* wte_;  // (V, C)
  nn::Embedding* wpe_;  // (block_size, C)
  nn::Dropout* drop_;
  nn::ModuleList* h_;
  nn::LayerNorm* ln_f_;
};

class GPT : public nn::Module {
 public:
  // The configuration must be valid (GptConfig::Validate); parameters are
  // created unmaterialized: call Materialize(seed) (or let FSDP shard them).
  explicit GPT(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  Transformer* transformer() { return transformer_; }

  // Forward, loss and backward of one batch: parameter gradients accumulate
  // into their fp32 buffers. idx and targets (B, T) i64; returns the mean
  // cross-entropy. The logits' memory is reused for their gradient (llm.c style).
  // `loss_scale`: backward starts from loss_scale * dL/dlogits (dynamic loss
  // scaling for fp16: the gradients come out scaled; the returned loss not).
  double ForwardBackward(const Tensor& idx, const Tensor& targets, double loss_scale = 1.0);
  // Mean cross-entropy without backward (evaluation).
  double Loss(const Tensor& idx, const Tensor& targets);
  // The logits of each row's last position (what generation samples from):
  // idx (B, T) i64 with T <= block_size -> (B, V) in the compute dtype, on the
  // model's device. Forward only; the head runs on the B last positions alone.
  Tensor LastLogits(const Tensor& idx);

 protected:
  // {idx (B, T)} -> {logits (B, T, V)}
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  const GptConfig config_;
  Transformer* transformer_;
  nn::Linear* lm_head_;  // (V, C), no bias
};

}  // namespace mingpt

#endif  // MODELS_MINGPT_MODEL_H_
