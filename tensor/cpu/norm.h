// CPU kernels of the norm family: LayerNorm and RMSNorm over the last
// dimension, forward and backward. The op layer (tensor/ops/norm.h) checks
// arguments and passes contiguous CPU tensors with f32 parameters.
#ifndef TENSOR_CPU_NORM_H_
#define TENSOR_CPU_NORM_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cpu {

// Shapes in all kernels below: x, y, grad_y, grad_x (rows, C) in one floating
// dtype; weight, bias, grad_weight, grad_bias (C) f32; mean, rstd (rows) f32.
// The param grads are summed over rows deterministically: f32 partial sums over
// fixed blocks of rows, then added in block order in double (the result depends
// only on the shapes, never on the thread count).

// LayerNorm: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
// (biased variance), saving mean and rstd.
void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd);
// grad_x = add (undefined: 0) + the gradient; add is contiguous, x's dtype.
void LayerNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, const Tensor& add,
                       const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias);

// RMSNorm (T5): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), saving rstd.
void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd);
void RmsNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Tensor& rstd, const Tensor& add, const Tensor& grad_x,
                     const Tensor& grad_weight);

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_NORM_H_
