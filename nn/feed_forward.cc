// FeedForward forward and backward (GELU with fused bias, ReLU, gated GELU).
#include "nn/feed_forward.h"

#include <cmath>
#include <memory>

#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace nn {
namespace {

// Children's context slots (fixed, whatever the form).
constexpr int kIn0 = 0, kIn1 = 1, kOut = 2, kDropout = 3;

}  // namespace

FeedForwardOptions FeedForwardOptions::Gpt2(int n_layer, float dropout) {
  FeedForwardOptions o;
  o.activation = FfnActivation::kGelu;
  o.bias = true;
  o.in_init = InitSpec::Normal(0.0f, 0.02f);
  o.out_init = InitSpec::Normal(0.0f, 0.02f / std::sqrt(2.0f * n_layer));
  o.dropout = dropout;
  o.dropout_on_hidden = false;
  return o;
}

FeedForwardOptions FeedForwardOptions::T5(int64_t d_model, int64_t d_ff, bool gated, float dropout,
                                          float factor) {
  FeedForwardOptions o;
  o.activation = gated ? FfnActivation::kGatedGelu : FfnActivation::kRelu;
  o.bias = false;
  o.in_init = InitSpec::Normal(0.0f, factor / std::sqrt(static_cast<float>(d_model)));
  o.out_init = InitSpec::Normal(0.0f, factor / std::sqrt(static_cast<float>(d_ff)));
  o.dropout = dropout;
  o.dropout_on_hidden = true;
  return o;
}

FeedForward::FeedForward(int64_t dim, int64_t hidden_dim, FeedForwardOptions options)
    : Module("FeedForward"),
      dim_(dim),
      hidden_(hidden_dim),
      activation_(options.activation),
      dropout_on_hidden_(options.dropout_on_hidden) {
  OP_CHECK(dim > 0 && hidden_dim > 0, "feed_forward", "dim and hidden_dim must be > 0; got (", dim,
           ",", hidden_dim, ")");
  LinearOptions in_opts{options.bias, options.in_init, InitSpec::Zeros()};
  LinearOptions out_opts{options.bias, options.out_init, InitSpec::Zeros()};
  switch (activation_) {
    case FfnActivation::kGelu:
      in_[0] = RegisterModule("c_fc", std::make_unique<Linear>(dim_, hidden_, in_opts));
      out_ = RegisterModule("c_proj", std::make_unique<Linear>(hidden_, dim_, out_opts));
      break;
    case FfnActivation::kRelu:
      in_[0] = RegisterModule("wi", std::make_unique<Linear>(dim_, hidden_, in_opts));
      out_ = RegisterModule("wo", std::make_unique<Linear>(hidden_, dim_, out_opts));
      break;
    case FfnActivation::kGatedGelu:
      in_[0] = RegisterModule("wi_0", std::make_unique<Linear>(dim_, hidden_, in_opts));
      in_[1] = RegisterModule("wi_1", std::make_unique<Linear>(dim_, hidden_, in_opts));
      out_ = RegisterModule("wo", std::make_unique<Linear>(hidden_, dim_, out_opts));
      break;
  }
  if (options.dropout > 0.0f) {
    dropout_ =
        RegisterModule("dropout", std::make_unique<Dropout>(options.dropout, options.dropout_seed));
  }
}

Tensors FeedForward::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x_in = inputs.at(0);
  OP_CHECK(x_in.defined() && x_in.rank() >= 1 && x_in.dim(-1) == dim_, "feed_forward", "input ",
           x_in.defined() ? x_in.shape().ToString() : "undefined", " does not end in dim ", dim_);
  OP_CHECK(inputs.size() == 1 ||
               (inputs.size() == 2 && inputs[1].defined() && inputs[1].shape() == x_in.shape()),
           "feed_forward", "expects x and optionally a residual shaped as x ",
           x_in.shape().ToString(), "; got ", inputs.size(), " inputs");
  Saved s;
  s.input_dtype = x_in.dtype();
  s.input_shape = x_in.shape();
  const Tensor x2 = x_in.Reshape({-1, dim_});  // (N, dim)
  Tensor a;                                    // (N, hidden): the output projection's input
  switch (activation_) {
    case FfnActivation::kGelu: {
      // The bias and GELU in c_fc's GEMM epilogue on a GPU; h0 = x W^T + b.
      const Tensors r = in_[0]->RunGelu(x2, ctx.Child(kIn0));
      a = r.at(0);
      s.h0 = r.at(1);
      break;
    }
    case FfnActivation::kRelu:
      // relu(h) > 0 exactly where h > 0, so the output serves the backward
      // (and h is freed now).
      s.act = tensor::Relu(in_[0]->Run(x2, ctx.Child(kIn0)));
      a = s.act;
      break;
    case FfnActivation::kGatedGelu:
      s.h0 = in_[0]->Run(x2, ctx.Child(kIn0));
      s.h1 = in_[1]->Run(x2, ctx.Child(kIn1));
      s.act = tensor::Gelu(s.h0);
      a = tensor::Mul(s.act, s.h1);
      break;
  }
  if (dropout_ != nullptr && dropout_on_hidden_) a = dropout_->Run(a, ctx.Child(kDropout));
  const bool output_dropout = dropout_ != nullptr && !dropout_on_hidden_;
  const Tensor residual = inputs.size() > 1 ? inputs[1].Reshape({-1, dim_}) : Tensor();  // (N, dim)
  s.has_residual = residual.defined();
  Tensor y;  // (N, dim)
  if (residual.defined() && !(output_dropout && dropout_->active())) {
    y = out_->RunResidual(a, residual, ctx.Child(kOut));  // residual + a W^T (+ b) in one GEMM
    s.residual_in_projection = true;
  } else {
    y = out_->Run(a, ctx.Child(kOut));
    if (output_dropout) {  // dropout(y), or residual + dropout(y) in one pass
      Tensors in = {y};
      if (residual.defined()) in.push_back(residual);
      y = dropout_->Run(in, ctx.Child(kDropout)).at(0);
    } else if (residual.defined()) {
      y = tensor::Add(residual, y.To(residual.dtype()));
    }
  }
  tensor::Shape out_shape = s.input_shape;
  ctx.Save(std::move(s));
  return {y.Reshape(out_shape)};
}

Tensors FeedForward::Backward(const Tensors& grad_outputs, Context& ctx) {
  const bool has_residual = ctx.Saved<Saved>().has_residual;
  Tensors grads = BackwardOfX(grad_outputs.at(0), ctx);
  if (has_residual) grads.push_back(grad_outputs.at(0));  // d residual = grad
  return grads;
}

Tensors FeedForward::BackwardOfX(const Tensor& grad, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  OP_CHECK(grad.defined() && grad.shape() == s.input_shape, "feed_forward", "the output gradient ",
           grad.defined() ? grad.shape().ToString() : "undefined", " is not shaped as the output ",
           s.input_shape.ToString());
  Tensor g = grad.Reshape({-1, dim_});  // (N, dim)
  if (dropout_ != nullptr && !dropout_on_hidden_ && !s.residual_in_projection) {
    g = dropout_->RunBackward(g, ctx.Child(kDropout));
  }
  const bool hidden_dropout = dropout_ != nullptr && dropout_on_hidden_;
  Tensor gx;  // (N, dim)
  if (activation_ == FfnActivation::kGelu) {
    Tensor gh;  // (N, hidden): the gradient of h0, the GELU's input
    // c_fc's bias gradient (hidden), f32, when c_proj's GEMM summed gh too
    // (on a GPU with cuda::MatmulDGeluBiasGrad); else c_fc sums gh itself.
    Tensor db_in;
    const Parameter* b_in = in_[0]->bias();
    if (!hidden_dropout) {
      gh = out_->RunBackwardThroughGelu(g, ctx.Child(kOut), s.h0,
                                        b_in != nullptr && b_in->requires_grad ? &db_in : nullptr);
    } else {
      const Tensor ga = dropout_->RunBackward(out_->RunBackward(g, ctx.Child(kOut)),
                                              ctx.Child(kDropout));  // (N, hidden)
      gh = tensor::GeluBackward(ga.To(s.h0.dtype()), s.h0);
    }
    gx = in_[0]->RunBackwardWithBiasGrad(gh, ctx.Child(kIn0), db_in);
    return {gx.To(s.input_dtype).Reshape(s.input_shape)};
  }
  Tensor ga = out_->RunBackward(g, ctx.Child(kOut));  // (N, hidden), a's dtype
  if (hidden_dropout) ga = dropout_->RunBackward(ga, ctx.Child(kDropout));
  switch (activation_) {
    case FfnActivation::kRelu:
      gx = in_[0]->RunBackward(tensor::ReluBackward(ga, s.act), ctx.Child(kIn0));
      break;
    case FfnActivation::kGatedGelu: {
      tensor::BinaryGrads mg = tensor::MulBackward(ga, s.act, s.h1);
      Tensor gx1 = in_[1]->RunBackward(mg.grad_b, ctx.Child(kIn1));
      gx = in_[0]->RunBackward(tensor::GeluBackward(mg.grad_a, s.h0), ctx.Child(kIn0));
      // Both are fresh tensors from Linear's backward, in x's dtype.
      tensor::AddInPlace(gx, gx1);
      break;
    }
    case FfnActivation::kGelu:
      break;  // above
  }
  return {gx.To(s.input_dtype).Reshape(s.input_shape)};
}

}  // namespace nn
