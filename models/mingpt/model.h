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
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
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

  // Incremental decoding (nn::CausalSelfAttention::Decode): x (B, T_new, C)
  // continues the positions `cache` holds -> (B, T_new, C). Forward only; runs
  // the module's hooks as Run does (an FSDP unit gathers its parameters).
  // key_mask: undefined, or (B, cache.length + T_new), 0 where the attention
  // ignores a position.
  Tensor Decode(const Tensor& x, nn::KvCache& cache, int64_t capacity,
                const Tensor& key_mask = Tensor());

 protected:
  // {x (B, T, C)} -> {y (B, T, C)}
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  nn::LayerNorm* ln_1_;
  nn::CausalSelfAttention* attn_;
  nn::LayerNorm* ln_2_;
  nn::FeedForward* mlp_;

  // x1 = x + attention(ln_1(x)), then x1 + mlp(ln_2(x1)): Forward's and
  // Decode's order of work, with the attention call theirs: attention(h, x)
  // returns x + the attention of h.
  Tensor Residuals(const Tensor& x, Context& ctx,
                   absl::FunctionRef<Tensor(const Tensor&, const Tensor&)> attention);
};

// wte, wpe, drop, h (the blocks), ln_f: everything but the head.
class Transformer : public nn::Module {
 public:
  explicit Transformer(const GptConfig& config);
  nn::ModuleList* blocks() { return h_; }

  // Incremental decoding: idx (B, T_new) i64 are the positions after those
  // the caches (one per block) hold -> x (B, T_new, C) after ln_f, as the
  // last T_new positions of Forward over the whole sequence in eval mode.
  // The whole sequence must fit in block_size. Forward only.
  // left_pad: empty, or per row the number of leading positions of the
  // sequence (counted from the caches' first) that are padding (prompts of
  // unequal lengths, left-aligned to end together): no query attends them,
  // and row r's position p is embedded as position p - left_pad[r], so each
  // row computes what its unpadded sequence would (up to rounding).
  Tensor Decode(const Tensor& idx, std::vector<nn::KvCache>& caches,
                absl::Span<const int64_t> left_pad = {});

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
  std::vector<Block*> blocks_;  // h_'s children
  nn::LayerNorm* ln_f_;

  // wte(idx) + wpe(positions start .. start + T - 1), then drop: (B, T, C).
  Tensor Embed(const Tensor& idx, int64_t start, Context& ctx);
  // wte(idx) + wpe(pos), then drop: idx (B, T), pos (1 or B, T) i64 in
  // [0, block_size) on idx's device -> (B, T, C).
  Tensor EmbedAt(const Tensor& idx, const Tensor& pos, Context& ctx);
  // Frozen parameters (fine-tuning): whether an embedding trains, and the
  // lowest block a backward must reach (0 when an embedding trains, given
  // EmbeddingsTrain(); L when no block does). Nothing below it trains, so the
  // forward keeps none of its activations (as under torch.no_grad) and the
  // backward stops above it.
  bool EmbeddingsTrain();
  size_t FirstBlockWithBackward(bool embeddings_train);
  // Decode's work, inside its frame (the module's hooks around it).
  Tensor DecodeInFrame(const Tensor& idx, std::vector<nn::KvCache>& caches,
                       absl::Span<const int64_t> left_pad);
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
  // The same with a key/value cache per block (generation): idx (B, T_new)
  // continues the sequence whose positions `caches` hold (empty caches: a
  // new sequence, resized to n_layer), and the caches take its keys and
  // values. Returns LastLogits of the whole sequence, (B, V), at the cost of
  // T_new positions. The whole sequence must fit in block_size. Eval mode
  // (Train(false)). Like LastLogits and Forward it runs the modules' hooks:
  // under FSDP each unit gathers its parameters for the step (or none, while
  // FullyShardedModel::Unshard holds them all). left_pad: as
  // Transformer::Decode's (row r's first left_pad[r] positions are padding).
  Tensor DecodeLogits(const Tensor& idx, std::vector<nn::KvCache>& caches,
                      absl::Span<const int64_t> left_pad = {});

 protected:
  // {idx (B, T)} -> {logits (B, T, V)}
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  const GptConfig config_;
  Transformer* transformer_;
  nn::Linear* lm_head_;  // (V, C), no bias

  // lm_head on the last position of x (B, T, C) -> (B, V).
  Tensor HeadOfLast(const Tensor& x, Context& ctx);
};

}  // namespace mingpt

#endif  // MODELS_MINGPT_MODEL_H_
