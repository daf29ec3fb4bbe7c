// What LayerNorm::RunBackwardAdding and RMSNorm::RunBackwardAdding share:
// add + the norm's input gradient, summed by the norm's backward kernel when
// the dtypes allow it.
#ifndef NN_NORM_GRAD_ADD_H_
#define NN_NORM_GRAD_ADD_H_

#include "absl/functional/function_ref.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/tensor.h"

namespace nn {
namespace internal {

// x: the norm's saved input (compute dtype); input_dtype: the caller's x
// dtype; grad_x(add): the input gradient in the compute dtype with `add`
// (undefined: nothing) added by the kernel. Returns add + the gradient in
// add's dtype: from the kernel when add, x and the caller's x share a dtype,
// else the gradient in the caller's dtype, then Add.
inline tensor::Tensor NormGradAdd(const char* op, const tensor::Tensor& x,
                                  tensor::Dtype input_dtype, const tensor::Tensor& add,
                                  absl::FunctionRef<tensor::Tensor(const tensor::Tensor&)> grad_x) {
  OP_CHECK(add.defined() && add.shape() == x.shape(), op, "the gradient to add ",
           add.defined() ? add.shape().ToString() : "undefined", " is not shaped as x ",
           x.shape().ToString());
  if (add.dtype() == x.dtype() && input_dtype == x.dtype()) return grad_x(add);
  const tensor::Tensor gx = grad_x(tensor::Tensor()).To(input_dtype);
  return tensor::Add(add, gx.To(add.dtype()));
}

}  // namespace internal
}  // namespace nn

#endif  // NN_NORM_GRAD_ADD_H_
