// Softmax over the last dimension (numerically stable), with an optional scale
// and causal mask for attention scores, and its backward.
#ifndef TENSOR_OPS_SOFTMAX_H_
#define TENSOR_OPS_SOFTMAX_H_

#include "tensor/tensor.h"

namespace tensor {

struct SoftmaxOptions {
  // Multiplies x before the softmax: y = softmax(scale * x) (attention: 1/sqrt(head_dim)).
  float scale = 1.0f;
  // x holds attention scores (..., T_q, T_k) with T_q <= T_k: query row i attends
  // keys j <= i + (T_k - T_q) and masked entries get probability exactly 0.
  bool causal = false;
};

// y = softmax(scale * x) over the last dimension; same shape and dtype as x
// (f32, bf16 or f16; computed in f32).
Tensor Softmax(const Tensor& x, const SoftmaxOptions& options = {});

// The same into an existing contiguous tensor y of x's shape and dtype; y may
// be x itself (in place, e.g. attention scores).
void SoftmaxInto(const Tensor& x, const Tensor& y, const SoftmaxOptions& options = {});

// grad_x = scale * y * (grad_y - sum(grad_y * y, last dim)), from the forward
// output y and the same options; masked entries get 0. grad_y and y share
// shape and dtype; grad_x has them too.
Tensor SoftmaxBackward(const Tensor& grad_y, const Tensor& y,
                       const SoftmaxOptions& options = {});

}  // namespace tensor

#endif  // TENSOR_OPS_SOFTMAX_H_
