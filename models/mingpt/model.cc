// minGPT forward and backward, written as a straight list of layer calls.
#include "models/mingpt/model.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/common/lm_loss.h"
#include "nn/freeze.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/reduce.h"

namespace mingpt {

using tensor::Dtype;

Block::Block(const GptConfig& c) : Module("Block") {
  nn::CausalSelfAttentionOptions attn_options;
  attn_options.c_proj_init = nn::MinGptProjInit(c.n_layer);
  ln_1_ = RegisterModule("ln_1", std::make_unique<nn::LayerNorm>(c.n_embd));
  attn_ = RegisterModule("attn", std::make_unique<nn::CausalSelfAttention>(
                                     c.n_embd, c.n_head, c.dropout, c.dropout, attn_options));
  ln_2_ = RegisterModule("ln_2", std::make_unique<nn::LayerNorm>(c.n_embd));
  mlp_ = RegisterModule("mlp", std::make_unique<nn::FeedForward>(
                                   c.n_embd, 4 * c.n_embd,
                                   nn::FeedForwardOptions::Gpt2(c.n_layer, c.dropout)));
}

Tensor Block::Residuals(const Tensor& x, Context& ctx,
                        absl::FunctionRef<Tensor(const Tensor&, const Tensor&)> attention) {
  const Tensor x1 = attention(ln_1_->Run(x, ctx.Child(0)), x);  // x + attn(ln_1(x)) (B, T, C)
  // x1 + mlp(ln_2(x1)) (B, T, C): the residual added in c_proj's GEMM.
  return mlp_->Run({ln_2_->Run(x1, ctx.Child(2)), x1}, ctx.Child(3)).at(0);
}

Tensors Block::Forward(const Tensors& inputs, Context& ctx) {
  return {Residuals(inputs.at(0), ctx, [&](const Tensor& h, const Tensor& x) {
    return attn_->Run({h, x}, ctx.Child(1)).at(0);  // the residual added in c_proj's GEMM
  })};
}

Tensor Block::Decode(const Tensor& x, nn::KvCache& cache, int64_t capacity,
                     const Tensor& key_mask) {
  return RunFrame([&] {  // the hooks Forward runs in (an FSDP unit's gather)
           Context ctx;  // forward only
           return Tensors{Residuals(x, ctx, [&](const Tensor& h, const Tensor& x) {
             return tensor::Add(x, attn_->Decode(h, cache, capacity, key_mask).To(x.dtype()));
           })};
         })
      .at(0);
}

Tensors Block::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Tensor& g = grad_outputs.at(0);  // dL/dy (B, T, C), also dL/dx1 through the residual
  // dL/dx1 = g + ln_2's input gradient (B, T, C), the sum written by its kernel.
  const Tensor g_x1 = ln_2_->RunBackwardAdding(mlp_->RunBackward(g, ctx.Child(3)), g, ctx.Child(2));
  // dL/dx = dL/dx1 + ln_1's input gradient (B, T, C).
  return {ln_1_->RunBackwardAdding(attn_->RunBackward(g_x1, ctx.Child(1)), g_x1, ctx.Child(0))};
}

Transformer::Transformer(const GptConfig& c) : Module("Transformer"), config_(c) {
  wte_ = RegisterModule("wte", std::make_unique<nn::Embedding>(c.vocab_size, c.n_embd));
  nn::EmbeddingOptions positions;
  positions.owner_checks_ids = true;  // 0..T-1, T checked against block_size in Forward
  wpe_ = RegisterModule("wpe",
                        std::make_unique<nn::Embedding>(c.block_size, c.n_embd, positions));
  drop_ = RegisterModule("drop", std::make_unique<nn::Dropout>(c.dropout));
  h_ = RegisterModule("h", std::make_unique<nn::ModuleList>());
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto block = std::make_unique<Block>(c);
    blocks_.push_back(block.get());
    h_->Append(std::move(block));
  }
  ln_f_ = RegisterModule("ln_f", std::make_unique<nn::LayerNorm>(c.n_embd));
}

Tensors Transformer::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& idx = inputs.at(0);  // (B, T)
  OP_CHECK(idx.rank() == 2, "gpt", "idx must be (B, T), got ", idx.shape().ToString());
  const int64_t T = idx.dim(1);
  // No backward will reach the embeddings (both frozen) nor the blocks below
  // `stop`: their activations are dropped as soon as their forward returns.
  const bool embeddings_train = EmbeddingsTrain();
  const size_t stop = FirstBlockWithBackward(embeddings_train);
  Tensor x = Embed(idx, 0, ctx);  // (B, T, C)
  if (!embeddings_train) {
    for (size_t i = 0; i < 3; ++i) ctx.Child(i).Clear();  // wte, wpe, drop
  }
  for (size_t l = 0; l < h_->size(); ++l) {
    x = h_->RunAt(l, x, ctx.Child(3 + l));  // (B, T, C)
    if (l < stop) ctx.Child(3 + l).Clear();
  }
  x = ln_f_->Run(x, ctx.Child(3 + h_->size()));  // (B, T, C)
  ctx.Save(Saved{T});
  return {x};
}

Tensor Transformer::Embed(const Tensor& idx, int64_t start, Context& ctx) {
  const int64_t T = idx.dim(1);
  OP_CHECK(start + T <= config_.block_size, "gpt", "sequence length ", start + T,
           " exceeds block_size ", config_.block_size);
  Tensor pos = tensor::Arange(start + T, tensor::Dtype::kI64, idx.device());
  return EmbedAt(idx, pos.Narrow(0, start, T).View({1, T}), ctx);  // (1, T): start ..
}

Tensor Transformer::EmbedAt(const Tensor& idx, const Tensor& pos, Context& ctx) {
  Tensor tok_emb = wte_->Run(idx, ctx.Child(0));                   // (B, T, C)
  Tensor pos_emb = wpe_->Run(pos, ctx.Child(1));                   // (1 or B, T, C)
  return drop_->Run(tensor::Add(tok_emb, pos_emb), ctx.Child(2));  // (B, T, C)
}

Tensor Transformer::Decode(const Tensor& idx, std::vector<nn::KvCache>& caches,
                           absl::Span<const int64_t> left_pad) {
  OP_CHECK(idx.rank() == 2, "gpt", "idx must be (B, T), got ", idx.shape().ToString());
  OP_CHECK(caches.size() == blocks_.size(), "gpt", caches.size(), " caches for ", blocks_.size(),
           " blocks");
  return RunFrame([&] { return Tensors{DecodeInFrame(idx, caches, left_pad)}; }).at(0);
}

Tensor Transformer::DecodeInFrame(const Tensor& idx, std::vector<nn::KvCache>& caches,
                                  absl::Span<const int64_t> left_pad) {
  const int64_t B = idx.dim(0), T = idx.dim(1), start = caches[0].length, length = start + T;
  const bool padded = std::any_of(left_pad.begin(), left_pad.end(), [](int64_t p) { return p; });
  Context ctx;  // forward only
  Tensor x, key_mask;
  if (!padded) {
    x = Embed(idx, start, ctx);  // (B, T_new, C)
  } else {
    OP_CHECK(static_cast<int64_t>(left_pad.size()) == B, "gpt", left_pad.size(),
             " paddings for a batch of ", B);
    OP_CHECK(length <= config_.block_size, "gpt", "sequence length ", length,
             " exceeds block_size ", config_.block_size);
    // Row r: positions before left_pad[r] are masked out as keys; position
    // p >= left_pad[r] is the row's token p - left_pad[r] (padding: 0).
    std::vector<int64_t> pos(B * T);
    std::vector<uint8_t> keep(B * length);
    for (int64_t r = 0; r < B; ++r) {
      OP_CHECK(left_pad[r] >= 0 && left_pad[r] < length, "gpt", "row ", r, " padding ", left_pad[r],
               " leaves none of its ", length, " positions");
      for (int64_t t = 0; t < T; ++t)
        pos[r * T + t] = std::max<int64_t>(0, start + t - left_pad[r]);
      for (int64_t j = 0; j < length; ++j) keep[r * length + j] = j >= left_pad[r];
    }
    x = EmbedAt(idx, Tensor::FromData<int64_t>(pos, {B, T}).To(idx.device()), ctx);  // (B, T, C)
    key_mask = Tensor::FromData<uint8_t>(keep, {B, length}).To(idx.device());        // (B, length)
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    x = blocks_[l]->Decode(x, caches[l], config_.block_size, key_mask);
  }
  return ln_f_->Run(x, ctx.Child(3 + h_->size()));  // (B, T_new, C)
}

bool Transformer::EmbeddingsTrain() {
  return nn::HasTrainableParameters(*wte_) || nn::HasTrainableParameters(*wpe_);
}

size_t Transformer::FirstBlockWithBackward(bool embeddings_train) {
  return embeddings_train ? 0 : nn::FirstTrainableChild(*h_);
}

Tensors Transformer::Backward(const Tensors& grad_outputs, Context& ctx) {
  const int64_t T = ctx.Saved<Saved>().T;
  const size_t L = h_->size();
  // Backward goes down only as far as the lowest trainable parameter (frozen
  // parameters, fine-tuning): with both embeddings frozen, blocks [0, stop)
  // run no backward (Forward kept none of their activations; FSDP gathers
  // none of them again), nor ln_f when nothing below it trains either.
  const bool embeddings_train = EmbeddingsTrain();
  const size_t stop = FirstBlockWithBackward(embeddings_train);
  Tensor g = grad_outputs.at(0);  // (B, T, C)
  if (stop < L || embeddings_train || nn::HasTrainableParameters(*ln_f_)) {
    g = ln_f_->RunBackward(g, ctx.Child(3 + L));
  }
  for (size_t l = L; l-- > stop;) g = h_->RunBackwardAt(l, g, ctx.Child(3 + l));
  if (!embeddings_train) return {Tensor()};
  g = drop_->RunBackward(g, ctx.Child(2));  // (B, T, C)
  // A frozen embedding's backward has nothing to compute (nor, under FSDP, to gather).
  if (nn::HasTrainableParameters(*wte_)) wte_->RunBackward(g, ctx.Child(0));
  if (nn::HasTrainableParameters(*wpe_)) {
    wpe_->RunBackward(tensor::Sum(g, 0, /*keepdim=*/true).Reshape({1, T, -1}), ctx.Child(1));
  }
  return {Tensor()};  // token ids have no gradient
}

GPT::GPT(const GptConfig& config) : Module("GPT"), config_(config) {
  transformer_ = RegisterModule("transformer", std::make_unique<Transformer>(config));
  nn::LinearOptions head;
  head.bias = false;
  head.align_output_rows = true;  // on a GPU: 64-aligned logits rows (50257 -> 50304 apart)
  lm_head_ = RegisterModule("lm_head",
                            std::make_unique<nn::Linear>(config.n_embd, config.vocab_size, head));
}

Tensors GPT::Forward(const Tensors& inputs, Context& ctx) {
  Tensor x = transformer_->Run(inputs.at(0), ctx.Child(0));  // (B, T, C)
  return {lm_head_->Run(x, ctx.Child(1))};                  // (B, T, V)
}

Tensors GPT::Backward(const Tensors& grad_outputs, Context& ctx) {
  Tensor g = lm_head_->RunBackward(grad_outputs.at(0), ctx.Child(1));
  return {transformer_->RunBackward(g, ctx.Child(0))};
}

double GPT::ForwardBackward(const Tensor& idx, const Tensor& targets, double loss_scale) {
  Context ctx;
  Tensor logits = Run(idx, ctx);  // (B, T, V)
  // The fused op overwrites the logits with d(loss * loss_scale)/dlogits.
  const tensor::CrossEntropyResult ce =
      train::ScaledCrossEntropyInPlace(logits, targets, loss_scale);
  // On a GPU the op has waited for its target check: reading the loss now
  // adds no wait (after the backward it would add one).
  const double loss = ce.loss.Item();
  RunBackward(logits, ctx);
  return loss;
}

double GPT::Loss(const Tensor& idx, const Tensor& targets) {
  Context ctx;
  Tensor logits = Run(idx, ctx);
  return tensor::CrossEntropy(logits, targets).loss.Item();
}

Tensor GPT::LastLogits(const Tensor& idx) {
  return RunFrame([&] {
           Context ctx;
           return Tensors{HeadOfLast(transformer_->Run(idx, ctx.Child(0)), ctx.Child(1))};
         })
      .at(0);
}

Tensor GPT::DecodeLogits(const Tensor& idx, std::vector<nn::KvCache>& caches,
                         absl::Span<const int64_t> left_pad) {
  if (caches.empty()) caches.resize(config_.n_layer);
  return RunFrame([&] {
           Context ctx;
           return Tensors{HeadOfLast(transformer_->Decode(idx, caches, left_pad), ctx.Child(1))};
         })
      .at(0);
}

Tensor GPT::HeadOfLast(const Tensor& x, Context& ctx) {
  const int64_t B = x.dim(0), T = x.dim(1);
  Tensor last = x.Narrow(1, T - 1, 1).Contiguous();  // (B, 1, C)
  Tensor logits = lm_head_->Run(last, ctx);          // (B, 1, V)
  return logits.Reshape({B, config_.vocab_size});    // (B, V)
}

}  // namespace mingpt
