// CUDA kernels: softmax over the last dimension with an optional scale and
// causal mask, and its backward (see common.cuh for the conventions;
// tensor/ops/softmax.h for the ops).
#ifndef TENSOR_CUDA_SOFTMAX_H_
#define TENSOR_CUDA_SOFTMAX_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Rows are the last dimension of x (rows = numel / cols). With causal_t_q > 0
// the rows are attention scores (..., T_q, T_k), T_q = causal_t_q <= T_k = cols:
// row r is query i = r % T_q and keeps keys j <= i + (T_k - T_q); the others
// get exactly 0.

// y = softmax(scale * x) per row. x and y contiguous, same shape and floating
// dtype, one CUDA device; y may be x (in place).
void SoftmaxForward(const Tensor& x, const Tensor& y, int64_t causal_t_q, float scale);

// grad_x = scale * y * (grad_y - sum(grad_y * y)) per row; masked entries get 0.
// All three contiguous with the same shape and floating dtype; grad_x may be grad_y.
void SoftmaxBackward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                     int64_t causal_t_q, float scale);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_SOFTMAX_H_
