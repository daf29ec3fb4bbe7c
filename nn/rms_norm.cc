// RMSNorm layer forward and backward.
#include "nn/rms_norm.h"

#include "nn/norm_grad_add.h"
#include "tensor/error.h"
#include "tensor/ops/norm.h"

namespace nn {

using tensor::Dtype;

RMSNorm::RMSNorm(int64_t dim, float eps) : Module("RMSNorm"), dim_(dim), eps_(eps) {
  OP_CHECK(dim > 0, "rms_norm", "dim must be > 0; got ", dim);
  weight_ = RegisterParameter("weight", {dim_}, InitSpec::Ones(), /*weight_decay=*/false);
}

Tensors RMSNorm::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x_in = inputs.at(0);
  OP_CHECK(x_in.defined() && x_in.rank() >= 1 && x_in.dim(-1) == dim_, "rms_norm", "input ",
           x_in.defined() ? x_in.shape().ToString() : "undefined", " does not end in dim ", dim_);
  const Tensor& w = weight_->value;
  OP_CHECK(w.defined(), "rms_norm", "weight is not materialized");
  // x keeps its dtype unless the weight is a low-precision copy (see the header).
  const Dtype compute = w.dtype() != Dtype::kF32 ? w.dtype() : x_in.dtype();
  Tensor x = x_in.To(compute).Contiguous();  // no copy when already so
  tensor::RmsNormResult r = tensor::RmsNorm(x, w, eps_);
  ctx.Save(Saved{x, r.rstd, x_in.dtype()});
  return {r.y};
}

Tensor RMSNorm::GradX(const Tensor& grad_y, const Tensor& add, const Saved& s) {
  // Checked before any GradToWrite: a refused gradient leaves the parameters'
  // gradients as they were.
  OP_CHECK(grad_y.defined() && grad_y.shape() == s.x.shape(), "rms_norm", "the output gradient ",
           grad_y.defined() ? grad_y.shape().ToString() : "undefined", " is not shaped as x ",
           s.x.shape().ToString());
  const Tensor g = grad_y.To(s.x.dtype());
  // The weight gradient goes straight into its f32 buffer (LayerNorm's way).
  tensor::NormGradsInto into;
  if (weight_->requires_grad) {
    const Parameter::GradSink dw = weight_->GradToWrite();
    into.weight = dw.grad;
    into.add_weight = dw.accumulate;
  }
  return tensor::RmsNormBackward(g, s.x, weight_->value, s.rstd, add, into).grad_x;
}

Tensors RMSNorm::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  return {GradX(grad_outputs.at(0), Tensor(), s).To(s.input_dtype)};
}

Tensor RMSNorm::RunBackwardAdding(const Tensor& grad_y, const Tensor& add, Context& ctx) {
  return RunBackwardFrame(ctx,
                          [&] {
                            const Saved& s = ctx.Saved<Saved>();
                            return Tensors{internal::NormGradAdd(
                                "rms_norm", s.x, s.input_dtype, add,
                                [&](const Tensor& a) { return GradX(grad_y, a, s); })};
                          })
      .at(0);
}

}  // namespace nn
