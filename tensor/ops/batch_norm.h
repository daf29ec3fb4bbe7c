// Batch normalization over the channel dimension of (N, C) or (N, C, L)
// inputs (torch.nn.functional.batch_norm), forward and backward, in fp32:
// what nn::BatchNorm1d runs. CPU kernels here, CUDA kernels in
// tensor/cuda/batch_norm.h; every tensor must be on x's device.
//
// Statistics per channel over the N * L values: mean and biased variance
// (normalization), unbiased variance (running statistics). Sums are taken in
// double in a fixed order, so results do not depend on the thread count.
#ifndef TENSOR_OPS_BATCH_NORM_H_
#define TENSOR_OPS_BATCH_NORM_H_

#include "tensor/tensor.h"

namespace tensor {

// The running statistics a training forward updates in place (all on x's
// device, contiguous).
struct BatchNormRunningStats {
  Tensor mean;                 // (C) f32
  Tensor var;                  // (C) f32: unbiased variance
  Tensor num_batches_tracked;  // () i64, or undefined
};

struct BatchNormResult {
  Tensor y;     // x's shape, f32
  Tensor mean;  // (C) f32: the statistics used to normalize
  Tensor rstd;  // (C) f32: 1 / sqrt(var + eps)
};

struct BatchNormGrads {
  Tensor grad_x;       // x's shape, f32
  Tensor grad_weight;  // (C) f32: sum of grad_y * xhat (computed with or without a weight)
  Tensor grad_bias;    // (C) f32: sum of grad_y
};

// y = (x - mean) * rstd * weight + bias, x (N, C) or (N, C, L) f32, weight
// and bias (C) f32 or undefined (1 and 0).
// training: mean and rstd from the batch (more than one value per channel);
// when `running` has mean and var they are updated in place,
//   running = (1 - momentum) * running + momentum * batch (unbiased variance),
// and num_batches_tracked (when defined) is incremented.
// !training: mean and rstd from running.mean and running.var (required),
// which are left unchanged.
BatchNormResult BatchNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const BatchNormRunningStats& running, bool training,
                          float momentum = 0.1f, float eps = 1e-5f);

// From the forward's x, weight, mean and rstd; `training` as in the forward
// (with batch statistics the gradient also flows through them).
BatchNormGrads BatchNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, bool training);

}  // namespace tensor

#endif  // TENSOR_OPS_BATCH_NORM_H_
