// T5 sub-layers and T5Block forward and backward, as straight lists of layer calls.
#include "models/t5/block.h"

#include <memory>
#include <utility>

#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace t5 {
namespace {

constexpr char kOp[] = "t5_block";

// inputs[i], or an undefined tensor past the end.
Tensor InputOrUndefined(const Tensors& inputs, size_t i) {
  return i < inputs.size() ? inputs[i] : Tensor();
}

const char* LayerClassName(T5LayerAttention::Kind kind) {
  return kind == T5LayerAttention::Kind::kCross ? "T5LayerCrossAttention" : "T5LayerSelfAttention";
}

}  // namespace

// ---- T5LayerAttention ----

T5LayerAttention::T5LayerAttention(const T5Config& c, Kind kind, bool has_relative_bias)
    : Module(LayerClassName(kind)) {
  nn::T5AttentionOptions options;
  options.has_relative_bias = has_relative_bias;
  options.causal = kind == Kind::kDecoderSelf;
  options.cross_attention = kind == Kind::kCross;
  options.dropout = c.dropout_rate;
  options.relative_attention_num_buckets = c.relative_attention_num_buckets;
  options.relative_attention_max_distance = c.relative_attention_max_distance;
  options.initializer_factor = c.initializer_factor;
  attention_ =
      RegisterModule(kind == Kind::kCross ? "EncDecAttention" : "SelfAttention",
                     std::make_unique<nn::T5Attention>(c.d_model, c.num_heads, c.d_kv, options));
  layer_norm_ =
      RegisterModule("layer_norm", std::make_unique<nn::RMSNorm>(c.d_model, c.layer_norm_epsilon));
  dropout_ = RegisterModule("dropout", std::make_unique<nn::Dropout>(c.dropout_rate));
}

Tensors T5LayerAttention::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x = inputs.at(0);                           // (B, T, d_model)
  const Tensor normed = layer_norm_->Run(x, ctx.Child(0));  // (B, T, d_model)
  Tensors attention_inputs = {normed, InputOrUndefined(inputs, 1), InputOrUndefined(inputs, 2),
                              InputOrUndefined(inputs, 3)};
  // Without the dropout running (p 0 or eval mode) x joins in the output
  // projection's GEMM: x + attention(normed).
  const bool residual_in_projection = !dropout_->active();
  if (residual_in_projection) attention_inputs.push_back(x);
  Tensors a = attention_->Run(attention_inputs, ctx.Child(1));  // {(B, T, d_model), bias?}
  if (!residual_in_projection) {
    a[0] = dropout_->Run({a[0], x}, ctx.Child(2)).at(0);  // x + dropout(a) (B, T, d_model)
  }
  ctx.Save(Saved{x.dtype(), inputs.size(), residual_in_projection});
  return a;
}

Tensors T5LayerAttention::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved s = ctx.Saved<Saved>();
  const tensor::Dtype x_dtype = s.x_dtype;
  const Tensor gy = grad_outputs.at(0).To(x_dtype);  // dL/dy (B, T, d_model), also dL/dx directly
  Tensors g_attn_out = {s.residual_in_projection ? gy : dropout_->RunBackward(gy, ctx.Child(2))};
  // The gradient of the returned bias from the blocks that reused it.
  if (grad_outputs.size() > 1) g_attn_out.push_back(grad_outputs[1]);
  // {grad normed, grad kv, grad position_bias, undefined (mask)}
  Tensors grads = attention_->RunBackward(g_attn_out, ctx.Child(1));
  grads[0] =
      layer_norm_->RunBackwardAdding(grads.at(0), gy, ctx.Child(0));  // gy + d norm (B, T, d_model)
  grads.resize(s.num_inputs);                      // one per input the caller gave
  return grads;
}

Tensors T5LayerAttention::Decode(const Tensors& inputs, nn::KvCache& cache, int64_t capacity) {
  return RunFrame([&] {              // the hooks Forward runs in (an FSDP unit's gather)
    const Tensor& x = inputs.at(0);  // (B, T_new, d_model)
    Context ctx;                     // forward only
    const Tensor normed = layer_norm_->Run(x, ctx.Child(0));  // (B, T_new, d_model)
    // No dropout: x joins in the output projection's GEMM, as Forward in eval mode.
    return attention_->Decode(Tensors{normed, InputOrUndefined(inputs, 1),
                                      InputOrUndefined(inputs, 2), InputOrUndefined(inputs, 3), x},
                              cache, capacity);  // {(B, T_new, d_model), bias?}
  });
}

// ---- T5LayerFF ----

T5LayerFF::T5LayerFF(const T5Config& c) : Module("T5LayerFF") {
  dense_relu_dense_ = RegisterModule(
      "DenseReluDense", std::make_unique<nn::FeedForward>(
                            c.d_model, c.d_ff,
                            nn::FeedForwardOptions::T5(c.d_model, c.d_ff, c.gated(), c.dropout_rate,
                                                       c.initializer_factor)));
  layer_norm_ =
      RegisterModule("layer_norm", std::make_unique<nn::RMSNorm>(c.d_model, c.layer_norm_epsilon));
  dropout_ = RegisterModule("dropout", std::make_unique<nn::Dropout>(c.dropout_rate));
}

Tensors T5LayerFF::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x = inputs.at(0);                           // (B, T, d_model)
  const Tensor normed = layer_norm_->Run(x, ctx.Child(0));  // (B, T, d_model)
  Saved s{x.dtype()};
  Tensor y;  // (B, T, d_model)
  if (!dropout_->active()) {
    y = dense_relu_dense_->Run({normed, x}, ctx.Child(1)).at(0);  // x + FF(normed) in wo's GEMM
    s.residual_in_projection = true;
  } else {
    // x + dropout(ff) (B, T, d_model) in one pass.
    y = dropout_->Run({dense_relu_dense_->Run(normed, ctx.Child(1)), x}, ctx.Child(2)).at(0);
  }
  ctx.Save(s);
  return {y};
}

Tensors T5LayerFF::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved s = ctx.Saved<Saved>();
  const tensor::Dtype x_dtype = s.x_dtype;
  const Tensor gy = grad_outputs.at(0).To(x_dtype);  // (B, T, d_model)
  const Tensor g_h = s.residual_in_projection ? gy : dropout_->RunBackward(gy, ctx.Child(2));
  // gy + the norm's input gradient (B, T, d_model), the sum written by its kernel.
  return {layer_norm_->RunBackwardAdding(dense_relu_dense_->RunBackward(g_h, ctx.Child(1)), gy,
                                         ctx.Child(0))};
}

// ---- T5Block ----

T5Block::T5Block(const T5Config& c, bool is_decoder, bool has_relative_bias)
    : Module("T5Block"), is_decoder_(is_decoder), has_relative_bias_(has_relative_bias) {
  layer_ = RegisterModule("layer", std::make_unique<nn::ModuleList>());
  layer_->Append(std::make_unique<T5LayerAttention>(
      c, is_decoder ? T5LayerAttention::Kind::kDecoderSelf : T5LayerAttention::Kind::kEncoderSelf,
      has_relative_bias));
  if (is_decoder) {
    layer_->Append(std::make_unique<T5LayerAttention>(c, T5LayerAttention::Kind::kCross,
                                                      /*has_relative_bias=*/false));
  }
  layer_->Append(std::make_unique<T5LayerFF>(c));
}

T5LayerAttention* T5Block::self_attention() {
  return static_cast<T5LayerAttention*>(layer_->at(0));
}

T5LayerAttention* T5Block::cross_attention() {
  return is_decoder_ ? static_cast<T5LayerAttention*>(layer_->at(1)) : nullptr;
}

T5LayerFF* T5Block::feed_forward() {
  return static_cast<T5LayerFF*>(layer_->at(layer_->size() - 1));
}

Tensors T5Block::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK(!inputs.empty() && inputs.size() <= kNumInputs && inputs[kX].defined(), kOp,
           "expects inputs {x, position_bias, mask, encoder_hidden, encoder_mask} with x "
           "defined; got ",
           inputs.size(), " inputs");
  const Tensor encoder_hidden = InputOrUndefined(inputs, kEncoderHidden);
  OP_CHECK(encoder_hidden.defined() == is_decoder_, kOp,
           is_decoder_ ? "a decoder block needs encoder_hidden (B, S, d_model)"
                       : "an encoder block takes no encoder_hidden");
  const size_t ff = layer_->size() - 1;
  // Self-attention: {y (B, T, d_model)}, plus {bias (1, nh, T, T)} when it owns the bias.
  Tensors self =
      layer_->RunAt(0,
                    Tensors{inputs[kX], Tensor(), InputOrUndefined(inputs, kPositionBias),
                            InputOrUndefined(inputs, kMask)},
                    ctx.Child(0));
  Tensor h = self.at(0);  // (B, T, d_model)
  if (is_decoder_) {
    h = layer_
            ->RunAt(1, Tensors{h, encoder_hidden, Tensor(), InputOrUndefined(inputs, kEncoderMask)},
                    ctx.Child(1))
            .at(0);  // (B, T, d_model)
  }
  h = layer_->RunAt(ff, h, ctx.Child(ff));  // (B, T, d_model)
  ctx.Save(Saved{inputs.size()});
  if (has_relative_bias_) return {h, self.at(1)};
  return {h};
}

Tensors T5Block::Decode(const Tensors& inputs, T5BlockCache& cache, int64_t capacity) {
  OP_CHECK(is_decoder_, kOp, "only a decoder block decodes");
  OP_CHECK(!inputs.empty() && inputs.size() <= kNumInputs && inputs[kX].defined(), kOp,
           "expects inputs {x, position_bias, mask, encoder_hidden, encoder_mask} with x "
           "defined; got ",
           inputs.size(), " inputs");
  return RunFrame([&]() -> Tensors {  // the hooks Forward runs in (an FSDP unit's gather)
    Context ctx;                      // forward only
    // Self-attention over the positions so far: {y (B, T_new, d_model)}, plus
    // {bias (1, nh, T_new, positions)} when it owns the bias.
    Tensors self = self_attention()->Decode(
        Tensors{inputs[kX], Tensor(), InputOrUndefined(inputs, kPositionBias),
                InputOrUndefined(inputs, kMask)},
        cache.self, capacity);
    Tensor h = cross_attention()
                   ->Decode(Tensors{self.at(0), InputOrUndefined(inputs, kEncoderHidden), Tensor(),
                                    InputOrUndefined(inputs, kEncoderMask)},
                            cache.cross, /*capacity=*/0)
                   .at(0);                     // (B, T_new, d_model)
    h = feed_forward()->Run(h, ctx.Child(2));  // (B, T_new, d_model)
    if (has_relative_bias_) return {h, self.at(1)};
    return {h};
  });
}

Tensors T5Block::Backward(const Tensors& grad_outputs, Context& ctx) {
  const size_t num_inputs = ctx.Saved<Saved>().num_inputs;
  const size_t ff = layer_->size() - 1;
  Tensors grads(num_inputs);
  Tensor g = layer_->RunBackwardAt(ff, grad_outputs.at(0), ctx.Child(ff));  // (B, T, d_model)
  if (is_decoder_) {
    // {grad h, grad encoder_hidden (B, S, d_model), undefined, undefined}
    const Tensors gc = layer_->RunBackwardAt(1, Tensors{g}, ctx.Child(1));
    g = gc.at(0);
    grads.at(kEncoderHidden) = gc.at(1);
  }
  Tensors g_self = {g};
  if (has_relative_bias_ && grad_outputs.size() > 1) g_self.push_back(grad_outputs[1]);
  // {grad x, undefined (kv), grad position_bias (when given), undefined (mask)}
  const Tensors gs = layer_->RunBackwardAt(0, g_self, ctx.Child(0));
  grads[kX] = gs.at(0);
  if (num_inputs > kPositionBias) grads[kPositionBias] = gs.at(2);
  return grads;
}

}  // namespace t5
