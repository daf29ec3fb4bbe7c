// Cross-entropy loss fused with log-softmax over the last dimension (the
// language-model head's loss), numerically stable for large logits.
//
// The forward saves only the per-row log-sum-exp (4 bytes a row); the backward
// recomputes the softmax from the logits, so no (N, V) probability copy is kept.
// CrossEntropyForwardBackwardInPlace does both in one pass over the logits and
// overwrites them with their gradient (llm.c style) when the logits are not
// needed afterwards.
//
// The loss is the mean over targets that are not ignore_index. When every
// target is ignored the loss is 0 (not NaN) and all gradients are 0.
#ifndef TENSOR_OPS_LOSS_H_
#define TENSOR_OPS_LOSS_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {

inline constexpr int64_t kDefaultIgnoreIndex = -100;

struct CrossEntropyResult {
  Tensor loss;  // () f32: mean of -log softmax(logits)[target] over counted targets
  Tensor lse;   // (...) f32, the targets' shape: log-sum-exp of each row (0 if ignored)
  int64_t count = 0;  // targets not equal to ignore_index
  int64_t ignore_index = kDefaultIgnoreIndex;
};

// logits (..., V) f32/bf16/f16 (e.g. (N, V) or (B, T, V)); targets (...) i32/i64,
// each in [0, V) or equal to ignore_index (any value; it may also be a class id).
CrossEntropyResult CrossEntropy(const Tensor& logits, const Tensor& targets,
                                int64_t ignore_index = kDefaultIgnoreIndex);

// d loss / d logits scaled by grad_loss (the upstream gradient of the mean, e.g.
// a loss scale): (softmax(logits) - onehot(target)) * grad_loss / count per row,
// 0 for ignored rows. logits and targets as given to the forward; logits' dtype.
Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                            const CrossEntropyResult& forward, float grad_loss = 1.0f);

// The forward and backward above in one pass: returns the forward's result and
// overwrites `logits` with the gradient. logits must be contiguous or a
// row-padded view (Tensor::RowStride() >= 0: e.g. an aligned LM head's
// output, nn::LinearOptions::align_output_rows), which the CUDA kernels read
// and write in place.
CrossEntropyResult CrossEntropyForwardBackwardInPlace(const Tensor& logits,
                                                      const Tensor& targets,
                                                      float grad_loss = 1.0f,
                                                      int64_t ignore_index = kDefaultIgnoreIndex);

}  // namespace tensor

#endif  // TENSOR_OPS_LOSS_H_
