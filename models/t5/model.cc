// T5Stack and T5Model forward and backward, written as straight lists of layer calls.
#include "models/t5/model.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "models/common/lm_loss.h"
#include "nn/checkpoint.h"
#include "nn/freeze.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/matmul.h"

namespace t5 {
namespace {

constexpr char kOp[] = "t5";

using tensor::Dtype;

Tensor InputOrUndefined(const Tensors& inputs, size_t i) {
  return i < inputs.size() ? inputs[i] : Tensor();
}

std::string ShapeText(const Tensor& t) { return t.defined() ? t.shape().ToString() : "undefined"; }

bool IsIds(const Tensor& t) {
  return t.defined() && (t.dtype() == Dtype::kI32 || t.dtype() == Dtype::kI64);
}

// acc + g in f32 (either may be undefined).
Tensor Accumulate(const Tensor& acc, const Tensor& g) {
  if (!g.defined()) return acc;
  if (!acc.defined()) return g.To(Dtype::kF32);
  return tensor::SumAs({acc, g}, Dtype::kF32);  // one pass, g cast as it is read
}

}  // namespace

// ---- DecoderCache ----

void DecoderCache::SelectRows(const std::vector<int64_t>& rows) {
  for (T5BlockCache& block : blocks) nn::SelectKvCacheRows(block.self, rows, kOp);
}

// ---- T5Stack ----

T5Stack::T5Stack(const T5Config& c, bool is_decoder, nn::Embedding* embed_tokens,
                 nn::Module* encoder)
    : Module("T5Stack"), is_decoder_(is_decoder), embed_tokens_(embed_tokens), encoder_(encoder) {
  OP_CHECK(embed_tokens != nullptr && embed_tokens->dim() == c.d_model, kOp,
           "a stack needs the shared embedding (V, d_model) with d_model ", c.d_model);
  block_ = RegisterModule("block", std::make_unique<nn::ModuleList>());
  const int64_t n = is_decoder ? c.num_decoder_layers : c.num_layers;
  for (int64_t l = 0; l < n; ++l) {
    block_->Append(std::make_unique<T5Block>(c, is_decoder, /*has_relative_bias=*/l == 0));
  }
  final_layer_norm_ = RegisterModule(
      "final_layer_norm", std::make_unique<nn::RMSNorm>(c.d_model, c.layer_norm_epsilon));
  dropout_ = RegisterModule("dropout", std::make_unique<nn::Dropout>(c.dropout_rate));
}

Tensors T5Stack::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK(!inputs.empty() && inputs.size() <= 4, kOp,
           "a stack expects {input_ids, attention_mask, encoder_hidden, encoder_mask}; got ",
           inputs.size(), " inputs");
  const Tensor& ids = inputs[kInputIds];
  OP_CHECK(IsIds(ids) && ids.rank() == 2, kOp, "input_ids must be (B, T) i32/i64; got ",
           ShapeText(ids));
  const Tensor mask = InputOrUndefined(inputs, kAttentionMask);
  const Tensor encoder_hidden = InputOrUndefined(inputs, kEncoderHidden);
  const Tensor encoder_mask = InputOrUndefined(inputs, kEncoderMask);
  OP_CHECK(encoder_hidden.defined() == is_decoder_, kOp,
           is_decoder_ ? "the decoder needs encoder_hidden (B, S, d_model)"
                       : "the encoder takes no encoder_hidden");
  // No backward will reach a frozen shared embedding nor the blocks below
  // `stop`: their activations are dropped as soon as their forward returns.
  const size_t stop = FirstBlockWithBackward(BelowBlocksTrain());
  Tensor x = embed_tokens_->Run(ids, ctx.Child(0));  // (B, T, d_model)
  x = dropout_->Run(x, ctx.Child(1));                // (B, T, d_model)
  if (!embed_tokens_->weight()->requires_grad) {
    ctx.Child(0).Clear();
    ctx.Child(1).Clear();
  }
  Tensor position_bias;  // (1, nh, T, T) from block 0
  for (size_t l = 0; l < block_->size(); ++l) {
    Tensors out = block_->RunAt(l, Tensors{x, position_bias, mask, encoder_hidden, encoder_mask},
                                ctx.Child(BlockSlot(l)));
    x = out.at(0);  // (B, T, d_model)
    if (l == 0) position_bias = out.at(1);
    if (l < stop) ctx.Child(BlockSlot(l)).Clear();
  }
  x = final_layer_norm_->Run(x, ctx.Child(NormSlot()));  // (B, T, d_model)
  x = dropout_->Run(x, ctx.Child(FinalDropoutSlot()));   // (B, T, d_model)
  ctx.Save(Saved{inputs.size(), encoder_hidden.defined() ? encoder_hidden.dtype() : Dtype::kF32});
  return {x};
}

Tensor T5Stack::Decode(const Tensor& ids, const Tensor& encoder_hidden, const Tensor& encoder_mask,
                       DecoderCache& cache) {
  OP_CHECK(is_decoder_, kOp, "only the decoder decodes");
  OP_CHECK(IsIds(ids) && ids.rank() == 2, kOp, "decoder inputs must be (B, T) i32/i64; got ",
           ShapeText(ids));
  OP_CHECK(!is_training(), kOp, "decoding runs in eval mode: call Train(false) first");
  OP_CHECK(cache.capacity > 0, kOp, "the decoder cache has no capacity: set it to the ",
           "positions the run will reach");
  if (cache.blocks.empty()) cache.blocks.resize(block_->size());
  OP_CHECK(cache.blocks.size() == block_->size(), kOp, "the cache has ", cache.blocks.size(),
           " blocks for ", block_->size(), " decoder blocks");
  return RunFrame([&] {  // the hooks Forward runs in (an FSDP unit's gather)
           Context ctx;  // forward only
           Tensor x =
               embed_tokens_->Run(ids, ctx.Child(0));  // (B, T_new, d_model); no dropout in eval
           Tensor position_bias;                       // (1, nh, T_new, positions) from block 0
           for (size_t l = 0; l < block_->size(); ++l) {
             Tensors out =
                 block(l)->Decode(Tensors{x, position_bias, Tensor(), encoder_hidden, encoder_mask},
                                  cache.blocks[l], cache.capacity);
             x = out.at(0);  // (B, T_new, d_model)
             if (l == 0) position_bias = out.at(1);
           }
           return Tensors{final_layer_norm_->Run(x, ctx.Child(NormSlot()))};  // (B, T_new, d_model)
         })
      .at(0);
}

bool T5Stack::BelowBlocksTrain() {
  // The decoder's blocks also give the encoder output's gradient.
  return embed_tokens_->weight()->requires_grad ||
         (encoder_ != nullptr && nn::HasTrainableParameters(*encoder_));
}

size_t T5Stack::FirstBlockWithBackward(bool below_trains) {
  return below_trains ? 0 : nn::FirstTrainableChild(*block_);
}

Tensors T5Stack::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved s = ctx.Saved<Saved>();
  const size_t L = block_->size();
  Tensors grads(s.num_inputs);
  // Frozen parameters: blocks [stop, L) run their backward (Forward kept no
  // activations of those below).
  const bool embedding_trains = embed_tokens_->weight()->requires_grad;
  const bool below_trains = BelowBlocksTrain();
  const size_t stop = FirstBlockWithBackward(below_trains);
  if (stop == L && !below_trains && !nn::HasTrainableParameters(*final_layer_norm_)) {
    return grads;  // nothing of the stack trains
  }
  Tensor g = dropout_->RunBackward(grad_outputs.at(0), ctx.Child(FinalDropoutSlot()));
  g = final_layer_norm_->RunBackward(g, ctx.Child(NormSlot()));  // (B, T, d_model)
  Tensor g_bias;            // (1, nh, T, T) f32: sum over blocks 1..L-1 (users of block 0's bias)
  Tensor g_encoder_hidden;  // (B, S, d_model) f32: sum over every block's cross-attention
  for (size_t l = L; l-- > stop;) {
    Tensors g_out = {g};
    if (l == 0) g_out.push_back(g_bias);
    // {grad x, grad position_bias, undefined, grad encoder_hidden, undefined}
    const Tensors gi = block_->RunBackwardAt(l, g_out, ctx.Child(BlockSlot(l)));
    g = gi.at(T5Block::kX);
    if (l > 0) g_bias = Accumulate(g_bias, gi.at(T5Block::kPositionBias));
    if (is_decoder_) {
      g_encoder_hidden = Accumulate(g_encoder_hidden, gi.at(T5Block::kEncoderHidden));
    }
  }
  if (!below_trains) return grads;  // the skipped blocks' contexts go with ctx
  if (embedding_trains) {
    g = dropout_->RunBackward(g, ctx.Child(1));
    embed_tokens_->RunBackward(g, ctx.Child(0));  // into shared.weight's gradient
  }
  if (is_decoder_) grads.at(kEncoderHidden) = g_encoder_hidden.To(s.encoder_hidden_dtype);
  return grads;
}

// ---- T5Model ----

namespace {

const T5Config& Validated(const T5Config& c) {
  const absl::Status status = c.Validate();
  OP_CHECK(status.ok(), kOp, status.message());
  return c;
}

}  // namespace

T5Model::T5Model(const T5Config& config) : Module("T5Model"), config_(Validated(config)) {
  const T5Config& c = config_;
  nn::EmbeddingOptions shared_options;
  shared_options.weight_init = nn::InitSpec::Normal(0.0f, c.initializer_factor);
  shared_ = RegisterModule(
      "shared", std::make_unique<nn::Embedding>(c.vocab_size, c.d_model, shared_options));
  encoder_ = RegisterModule("encoder", std::make_unique<T5Stack>(c, /*is_decoder=*/false, shared_));
  decoder_ = RegisterModule("decoder",
                            std::make_unique<T5Stack>(c, /*is_decoder=*/true, shared_, encoder_));
  if (!c.tie_word_embeddings) {
    nn::LinearOptions head;
    head.bias = false;
    head.weight_init = nn::InitSpec::Normal(0.0f, c.initializer_factor);
    lm_head_ =
        RegisterModule("lm_head", std::make_unique<nn::Linear>(c.d_model, c.vocab_size, head));
  }
  nn::SeedRandomSources(*this, 0);  // distinct dropout streams per layer
}

Tensors T5Model::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK(inputs.size() == 3, kOp, "expects {encoder_inputs, encoder_mask, decoder_inputs}; got ",
           inputs.size(), " inputs");
  const Tensor& encoder_inputs = inputs[0];  // (B, S)
  const Tensor& encoder_mask = inputs[1];    // (B, S) or undefined
  const Tensor& decoder_inputs = inputs[2];  // (B, T)
  OP_CHECK(IsIds(encoder_inputs) && encoder_inputs.rank() == 2, kOp,
           "encoder_inputs must be (B, S) i32/i64; got ", ShapeText(encoder_inputs));
  OP_CHECK(IsIds(decoder_inputs) && decoder_inputs.rank() == 2 &&
               decoder_inputs.dim(0) == encoder_inputs.dim(0),
           kOp, "decoder_inputs must be (B, T) i32/i64 with the encoder's batch ",
           encoder_inputs.dim(0), "; got ", ShapeText(decoder_inputs));
  OP_CHECK(!encoder_mask.defined() || encoder_mask.shape() == encoder_inputs.shape(), kOp,
           "encoder_mask ", ShapeText(encoder_mask), " does not match encoder_inputs ",
           encoder_inputs.shape().ToString());
  const Tensor enc =
      encoder_->Run(Tensors{encoder_inputs, encoder_mask}, ctx.Child(0)).at(0);  // (B, S, d)
  const Tensor dec =
      decoder_->Run(Tensors{decoder_inputs, Tensor(), enc, encoder_mask}, ctx.Child(1))
          .at(0);                                                      // (B, T, d)
  return {HeadForward(dec, ctx.Child(2))};                             // (B, T, V)
}

Tensors T5Model::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Tensor& g_logits = grad_outputs.at(0);  // (B, T, V)
  const Tensor g_dec = lm_head_ != nullptr ? lm_head_->RunBackward(g_logits, ctx.Child(2))
                                           : TiedHeadBackward(g_logits, ctx.Child(2));
  // {undefined, undefined, grad encoder output, undefined}
  const Tensors gd = decoder_->RunBackward(Tensors{g_dec}, ctx.Child(1));
  // A frozen encoder (and shared embedding) runs no backward.
  if (shared_->weight()->requires_grad || nn::HasTrainableParameters(*encoder_)) {
    encoder_->RunBackward(Tensors{gd.at(T5Stack::kEncoderHidden)}, ctx.Child(0));
  }
  return Tensors(3);  // token ids and the mask have no gradient
}

Tensor T5Model::TiedHeadForward(const Tensor& x, Context& ctx) {
  const nn::Parameter& shared = *shared_->weight();
  const Tensor& w = shared.value;  // (V, d)
  // Under FSDP the head reads it outside its unit's forward: gathered only
  // in the root unit, which is gathered whenever the model runs.
  OP_CHECK(w.defined() || shared.held_by.empty(), kOp,
           "shared.weight, which the tied head reads, is held by ", shared.held_by,
           ", not gathered when the head runs: a wrap policy must leave it in the root unit "
           "(the transformer policy over T5Block does; train::CheckTiedWeightsInRoot checks one)");
  OP_CHECK(w.defined(), kOp, "shared.weight is not materialized");
  const int64_t d = config_.d_model;
  // Hugging Face: sequence_output * model_dim**-0.5 before the tied projection.
  const Tensor xs =
      tensor::Scale(x.To(w.dtype()).Reshape({-1, d}), 1.0 / std::sqrt(static_cast<double>(d)));
  tensor::MatmulOptions opts;
  opts.trans_b = true;
  const Tensor logits = tensor::Matmul(xs, w, opts);  // (N, V)
  tensor::Shape out_shape = x.shape();
  out_shape[out_shape.rank() - 1] = config_.vocab_size;
  ctx.Save(TiedHeadSaved{xs, x.dtype(), x.shape()});
  return logits.Reshape(out_shape);
}

Tensor T5Model::TiedHeadBackward(const Tensor& grad_logits, Context& ctx) {
  const TiedHeadSaved s = std::move(ctx.Saved<TiedHeadSaved>());
  ctx.Clear();
  nn::Parameter& w = *shared_->weight();
  const int64_t d = config_.d_model;
  const Tensor g = grad_logits.To(w.value.dtype()).Reshape({-1, config_.vocab_size});  // (N, V)
  // d shared.weight (V, d) += g^T @ xs, accumulated in fp32, or written when
  // the gradient is new (the embeddings' backward adds theirs after); frozen: none.
  if (w.requires_grad) {
    tensor::MatmulOptions dw;
    dw.trans_a = true;
    const nn::Parameter::GradSink sink = w.GradToWrite();
    tensor::MatmulInto(g, s.x, sink.grad, dw, /*beta=*/sink.accumulate ? 1.0f : 0.0f);
  }
  const Tensor dxs = tensor::Matmul(g, w.value);  // (N, d)
  return tensor::Scale(dxs, 1.0 / std::sqrt(static_cast<double>(d)))
      .To(s.x_dtype)
      .Reshape(s.x_shape);
}

void T5Model::CheckTargets(const Tensor& decoder_inputs, const Tensor& decoder_targets) const {
  OP_CHECK(IsIds(decoder_targets) && decoder_inputs.defined() &&
               decoder_targets.shape() == decoder_inputs.shape(),
           kOp, "decoder_targets ", ShapeText(decoder_targets),
           " must be i32/i64 and match decoder_inputs ", ShapeText(decoder_inputs));
}

double T5Model::ForwardBackward(const Tensor& encoder_inputs, const Tensor& encoder_mask,
                                const Tensor& decoder_inputs, const Tensor& decoder_targets,
                                double loss_scale) {
  CheckTargets(decoder_inputs, decoder_targets);
  Context ctx;
  Tensor logits = Run(Tensors{encoder_inputs, encoder_mask, decoder_inputs}, ctx).at(0);
  // The fused op overwrites the logits with d(loss * loss_scale)/dlogits.
  const tensor::CrossEntropyResult ce =
      train::ScaledCrossEntropyInPlace(logits, decoder_targets, loss_scale);
  // On a GPU the op has waited for its target check: reading the loss now
  // adds no wait (after the backward it would add one).
  const double loss = ce.loss.Item();
  RunBackward(Tensors{logits}, ctx);
  return loss;
}

double T5Model::Loss(const Tensor& encoder_inputs, const Tensor& encoder_mask,
                     const Tensor& decoder_inputs, const Tensor& decoder_targets) {
  CheckTargets(decoder_inputs, decoder_targets);
  Context ctx;
  const Tensor logits = Run(Tensors{encoder_inputs, encoder_mask, decoder_inputs}, ctx).at(0);
  return tensor::CrossEntropy(logits, decoder_targets).loss.Item();
}

Tensor T5Model::Encode(const Tensor& encoder_inputs, const Tensor& encoder_mask) {
  OP_CHECK(IsIds(encoder_inputs) && encoder_inputs.rank() == 2, kOp,
           "encoder_inputs must be (B, S) i32/i64; got ", ShapeText(encoder_inputs));
  OP_CHECK(!encoder_mask.defined() || encoder_mask.shape() == encoder_inputs.shape(), kOp,
           "encoder_mask ", ShapeText(encoder_mask), " does not match encoder_inputs ",
           encoder_inputs.shape().ToString());
  return RunFrame([&] {  // the model's hooks, as Forward (an FSDP root unit's gather)
           Context ctx;
           return encoder_->Run(Tensors{encoder_inputs, encoder_mask}, ctx);  // {(B, S, d)}
         })
      .at(0);
}

void T5Model::CheckDecoderInputs(const Tensor& encoded, const Tensor& decoder_inputs) const {
  OP_CHECK(encoded.defined() && encoded.rank() == 3 && encoded.dim(2) == config_.d_model, kOp,
           "encoded must be (B, S, ", config_.d_model, "); got ", ShapeText(encoded));
  OP_CHECK(IsIds(decoder_inputs) && decoder_inputs.rank() == 2 &&
               decoder_inputs.dim(0) == encoded.dim(0),
           kOp, "decoder_inputs must be (B, T) i32/i64 with the encoder's batch ", encoded.dim(0),
           "; got ", ShapeText(decoder_inputs));
}

Tensor T5Model::HeadForward(const Tensor& x, Context& ctx) {
  if (lm_head_ != nullptr) return lm_head_->Run(x, ctx);  // (B, T, V)
  return TiedHeadForward(x, ctx);                         // (B, T, V)
}

Tensor T5Model::DecodeLogits(const Tensor& encoded, const Tensor& encoder_mask,
                             const Tensor& decoder_inputs) {
  CheckDecoderInputs(encoded, decoder_inputs);
  return RunFrame([&] {  // the model's hooks, as Forward (an FSDP root unit's gather)
           Context ctx;
           const Tensor dec =
               decoder_->Run(Tensors{decoder_inputs, Tensor(), encoded, encoder_mask}, ctx.Child(1))
                   .at(0);                                  // (B, T, d)
           return Tensors{HeadForward(dec, ctx.Child(2))};  // (B, T, V)
         })
      .at(0);
}

Tensor T5Model::DecodeStep(const Tensor& encoded, const Tensor& encoder_mask,
                           const Tensor& decoder_inputs, DecoderCache& cache) {
  CheckDecoderInputs(encoded, decoder_inputs);
  return RunFrame([&] {  // the model's hooks, as Forward (an FSDP root unit's gather)
           Context ctx;
           const Tensor dec =
               decoder_->Decode(decoder_inputs, encoded, encoder_mask, cache);  // (B, T_new, d)
           return Tensors{HeadForward(dec, ctx.Child(2))};                      // (B, T_new, V)
         })
      .at(0);
}

}  // namespace t5
