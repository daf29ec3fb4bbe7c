// Dropout layer forward and backward.
#include "nn/dropout.h"

#include <cmath>

#include "tensor/error.h"

namespace nn {

Dropout::Dropout(float p, uint64_t seed) : Module("Dropout"), p_(p), gen_(seed, 0) {
  OP_CHECK(std::isfinite(p) && p >= 0.0f && p <= 1.0f, "dropout", "p must be in [0, 1]; got ", p);
}

Tensors Dropout::Forward(const Tensors& inputs, Context& ctx) {
  const Tensor& x = inputs.at(0);
  OP_CHECK(x.defined() && tensor::IsFloatingPoint(x.dtype()), "dropout",
           "input must be a defined floating tensor; got ",
           x.defined() ? x.shape().ToString() : "undefined", " ",
           x.defined() ? tensor::DtypeName(x.dtype()) : "");
  OP_CHECK(inputs.size() <= 2, "dropout", "expects x and optionally a residual; got ",
           inputs.size(), " inputs");
  const bool has_residual = inputs.size() == 2;
  tensor::DropoutResult r = has_residual ? tensor::DropoutAdd(inputs[1], x, p_, gen_, is_training())
                                         : tensor::Dropout(x, p_, gen_, is_training());
  ctx.Save(Saved{r.state, x.dtype(), has_residual});
  return {r.y};
}

Tensors Dropout::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  const Tensor& g = grad_outputs.at(0);
  Tensors grads = {tensor::DropoutBackward(g, s.state).To(s.input_dtype)};
  if (s.has_residual) grads.push_back(g);
  return grads;
}

}  // namespace nn
