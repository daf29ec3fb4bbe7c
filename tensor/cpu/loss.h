// CPU kernels of the loss family: cross-entropy fused with log-softmax over the
// last dimension (rows of logits), forward, backward from the saved per-row
// log-sum-exp, and a fused forward + backward that overwrites the logits with
// their gradient. The op layer (tensor/ops/loss.h) checks shapes and targets.
#ifndef TENSOR_CPU_LOSS_H_
#define TENSOR_CPU_LOSS_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cpu {

// Shapes: logits (N, V) contiguous floating; targets (N) i32/i64 contiguous, each
// in [0, V) or equal to ignore_index; lse (N) f32.

// Writes lse[n] = log(sum(exp(logits[n]))) (0 for ignored rows) and returns
// the sum over non-ignored rows of lse[n] - logits[n, targets[n]], added in
// row order in double.
double CrossEntropyForward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           const Tensor& lse);

// grad_logits[n] = (exp(logits[n] - lse[n]) - onehot(targets[n])) * grad_scale,
// 0 for ignored rows. grad_logits may be logits (in place).
void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                          int64_t ignore_index, float grad_scale, const Tensor& grad_logits);

// Both at once, row by row while the row is in cache: writes lse, overwrites
// logits with the gradient above and returns the loss sum as the forward does.
double CrossEntropyForwardBackwardInPlace(const Tensor& logits, const Tensor& targets,
                                          int64_t ignore_index, float grad_scale,
                                          const Tensor& lse);

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_LOSS_H_
