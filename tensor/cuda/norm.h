// CUDA kernels: LayerNorm and RMSNorm over the last dimension, forward and
// backward (see common.cuh for the conventions; tensor/ops/norm.h for the ops).
#ifndef TENSOR_CUDA_NORM_H_
#define TENSOR_CUDA_NORM_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Shapes in all kernels below: x, y, grad_y, grad_x (rows, C) contiguous in one
// floating dtype; weight, bias (C) contiguous, f32 or x's dtype, both the same
// dtype, or undefined (weight 1, bias 0); mean, rstd (rows) f32. All on one
// CUDA device. Compute is f32.
//
// The parameter gradients are column sums over rows, reduced deterministically
// (no atomics): f32 partial sums over fixed chunks of rows, then the chunks
// added in order in double. The result depends only on the shapes.

// LayerNorm: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
// (biased variance), saving mean and rstd.
void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd);
// grad_weight (C, weight's dtype) is written when defined; grad_bias (C, f32 or
// weight's dtype: the sum of grad_y over rows) always; both one dtype. With
// add_weight / add_bias, that gradient is added to what the tensor holds
// (in f32: ToF(old) + sum, rounded once) instead of overwriting it.
// grad_x = add (undefined: 0) + the gradient; add is contiguous, x's dtype.
void LayerNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, const Tensor& add,
                       const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                       bool add_weight = false, bool add_bias = false);

// RMSNorm (T5): y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), saving rstd.
void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y,
                    const Tensor& rstd);
// grad_weight (C, weight's dtype) is written when defined (added to, with
// add_weight, as LayerNormBackward's).
void RmsNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                     const Tensor& rstd, const Tensor& add, const Tensor& grad_x,
                     const Tensor& grad_weight, bool add_weight = false);

// Warp rows of bf16 / f16 in 16-byte packs (C <= 1024, C a multiple of 8,
// every pointer 16-byte aligned): each lane holds its packs of the row (x in
// the forward; grad_y, x and the residual's gradient in the backward) in
// registers, every load issued at the row's start, so a row costs one memory
// round trip and the later passes read registers (default on; environment
// FSDP_CUDA_NORM_HOLD_ROWS=0 at startup turns it off). Off, each pass loads
// its packs one or two at a time (the later passes from L1 / L2). The same
// arithmetic in the same order: the same bits either way. For timing the two
// (//tensor/cuda:norm_benchmark) and testing them against each other.
void SetNormHoldRows(bool hold);
bool NormHoldRows();

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_NORM_H_
