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
  tensor::DropoutResult r = tensor::Dropout(x, p_, gen_, is_training());
  ctx.Save(Saved{r.state, x.dtype()});
  return {r.y};
}

Tensors Dropout::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  return {tensor::DropoutBackward(grad_outputs.at(0), s.state).To(s.input_dtype)};
}

}  // namespace nn
