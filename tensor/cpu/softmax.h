// CPU kernels of the softmax family: row softmax over the last dimension with
// an optional scale and causal mask, and its backward. The op layer
// (tensor/ops/softmax.h) checks arguments; these take contiguous CPU tensors.
#ifndef TENSOR_CPU_SOFTMAX_H_
#define TENSOR_CPU_SOFTMAX_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cpu {

// Layout shared by the softmax kernels: `rows` contiguous rows of `cols`
// elements. With causal_t_q > 0 the rows are attention scores (..., T_q, T_k)
// with T_q = causal_t_q and T_k = cols: row r is query i = r % T_q and keeps
// keys j <= i + (T_k - T_q); the others are masked.
struct SoftmaxShape {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t causal_t_q = 0;  // 0: no mask
};

// y = softmax(scale * x) per row; masked entries get exactly 0. x and y are
// contiguous with the same floating dtype; y may be x (in place).
void SoftmaxForward(const Tensor& x, const Tensor& y, const SoftmaxShape& shape, float scale);

// grad_x = scale * y * (grad_y - sum(grad_y * y)) per row; masked entries get 0.
// All three contiguous with the same floating dtype; grad_x may be grad_y.
void SoftmaxBackward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                     const SoftmaxShape& shape, float scale);

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_SOFTMAX_H_
