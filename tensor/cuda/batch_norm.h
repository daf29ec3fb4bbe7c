// CUDA kernels: batch normalization over the channel dimension of (N, C, L)
// tensors, fp32, forward and backward (see common.cuh for the conventions;
// tensor/ops/batch_norm.h for the op, whose CPU kernels these match).
#ifndef TENSOR_CUDA_BATCH_NORM_H_
#define TENSOR_CUDA_BATCH_NORM_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Shapes in both kernels: x, y, grad_y, grad_x (N, C) or (N, C, L) f32
// contiguous; weight, bias, running_mean, running_var, mean, rstd, grad_weight,
// grad_bias (C) f32 contiguous; num_batches_tracked () i64. weight and bias
// may be undefined (1 and 0). All on one CUDA device.
//
// Per-channel sums are taken in double, deterministically (no atomics): each
// block sums a fixed chunk of a channel's values, then the chunks are added in
// order. The result depends only on the shapes.

// training: mean and rstd from the batch (biased variance); when running_mean
// and running_var are defined they are updated in place with momentum (the
// unbiased variance), and num_batches_tracked (when defined) is incremented.
// Otherwise mean and rstd come from running_mean and running_var.
// y = (x - mean) * (rstd * weight) + bias; mean and rstd are saved.
void BatchNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Tensor& running_mean, const Tensor& running_var,
                      const Tensor& num_batches_tracked, bool training, float momentum, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd);

// grad_x (the gradient through the batch statistics when training),
// grad_weight = sum of grad_y * xhat and grad_bias = sum of grad_y per channel.
void BatchNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, bool training, const Tensor& grad_x,
                       const Tensor& grad_weight, const Tensor& grad_bias);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_BATCH_NORM_H_
