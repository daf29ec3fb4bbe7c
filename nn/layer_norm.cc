// LayerNorm layer forward and backward.
#include "nn/layer_norm.h"

#include "nn/norm_grad_add.h"
#include "tensor/error.h"
#include "tensor/ops/norm.h"

namespace nn {

using tensor::Dtype;

LayerNorm::LayerNorm(int64_t dim, LayerNormOptions options)
    : Module("LayerNorm"), dim_(dim), eps_(options.eps) {
  OP_CHECK(dim > 0, "layer_norm", "dim must be > 0; got ", dim);
  weight_ = options.elementwise_affine
                ? RegisterParameter("weight", {dim_}, InitSpec::Ones(), /*weight_decay=*/false)
                : nullptr;
  bias_ = options.elementwise_affine && options.bias
              ? RegisterParameter("bias", {dim_}, InitSpec::Zeros(), /*weight_decay=*/false)
              : nullptr;
}

Tensors LayerNorm::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x_in = inputs.at(0);
  OP_CHECK(x_in.defined() && x_in.rank() >= 1 && x_in.dim(-1) == dim_, "layer_norm", "input ",
           x_in.defined() ? x_in.shape().ToString() : "undefined", " does not end in dim ", dim_);
  Tensor w, b;
  if (weight_ != nullptr) {
    w = weight_->value;
    OP_CHECK(w.defined(), "layer_norm", "weight is not materialized");
  }
  if (bias_ != nullptr) {
    b = bias_->value;
    OP_CHECK(b.defined(), "layer_norm", "bias is not materialized");
    if (w.defined()) b = b.To(w.dtype());
  }
  // x keeps its dtype unless the weight is a low-precision copy (see the header).
  const Dtype compute = (w.defined() && w.dtype() != Dtype::kF32) ? w.dtype() : x_in.dtype();
  Tensor x = x_in.To(compute).Contiguous();  // no copy when already so
  tensor::LayerNormResult r = tensor::LayerNorm(x, w, b, eps_);
  ctx.Save(Saved{x, r.mean, r.rstd, x_in.dtype()});
  return {r.y};
}

Tensor LayerNorm::GradX(const Tensor& grad_y, const Tensor& add, const Saved& s) {
  // Checked before any GradToWrite: a refused gradient leaves the parameters'
  // gradients as they were.
  OP_CHECK(grad_y.defined() && grad_y.shape() == s.x.shape(), "layer_norm", "the output gradient ",
           grad_y.defined() ? grad_y.shape().ToString() : "undefined", " is not shaped as x ",
           s.x.shape().ToString());
  const Tensor g = grad_y.To(s.x.dtype());
  // The parameter gradients go straight into the f32 gradient buffers (no
  // temporaries, no add per parameter); frozen parameters get none.
  tensor::NormGradsInto into;
  if (weight_ != nullptr && weight_->requires_grad) {
    const Parameter::GradSink dw = weight_->GradToWrite();
    into.weight = dw.grad;
    into.add_weight = dw.accumulate;
  }
  if (bias_ != nullptr && bias_->requires_grad) {
    const Parameter::GradSink db = bias_->GradToWrite();
    into.bias = db.grad;
    into.add_bias = db.accumulate;
  }
  const Tensor w = weight_ != nullptr ? weight_->value : Tensor();
  return tensor::LayerNormBackward(g, s.x, w, s.mean, s.rstd, add, into).grad_x;
}

Tensors LayerNorm::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  return {GradX(grad_outputs.at(0), Tensor(), s).To(s.input_dtype)};
}

Tensor LayerNorm::RunBackwardAdding(const Tensor& grad_y, const Tensor& add, Context& ctx) {
  return RunBackwardFrame(ctx,
                          [&] {
                            const Saved& s = ctx.Saved<Saved>();
                            return Tensors{internal::NormGradAdd(
                                "layer_norm", s.x, s.input_dtype, add,
                                [&](const Tensor& a) { return GradX(grad_y, a, s); })};
                          })
      .at(0);
}

}  // namespace nn
