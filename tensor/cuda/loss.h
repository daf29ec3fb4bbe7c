// CUDA kernels: cross-entropy fused with log-softmax over the last dimension
// (rows of logits): forward, backward from the saved per-row log-sum-exp, and
// the fused forward + backward that overwrites the logits with their gradient
// (see common.cuh for the conventions; tensor/ops/loss.h for the ops).
#ifndef TENSOR_CUDA_LOSS_H_
#define TENSOR_CUDA_LOSS_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// What a cross-entropy kernel reports back to the host. Every entry point
// below synchronizes the compute stream to read it (the op needs the count,
// and out-of-range targets must become an error).
struct CrossEntropyStats {
  double total = 0;        // sum over counted rows of lse - logit[target] (forward)
  int64_t count = 0;       // targets in [0, V) and not equal to ignore_index
  int64_t first_bad = -1;  // first row (flat) whose target is neither in [0, V)
                           // nor ignore_index, or -1
  int64_t bad_target = 0;  // that row's target
};

// Shapes: logits (N, V) floating, contiguous or row-padded (rows a uniform
// stride apart, Tensor::RowStride() >= 0; so is grad_logits); targets (N)
// i32/i64 contiguous;
// lse (N) f32; loss () f32; all on one CUDA device. Rows whose target is
// ignore_index get lse 0 and a zero gradient. When some target is out of
// range (first_bad >= 0) the gradient kernels write nothing (the logits of the
// in-place call stay as they were) and the op throws.

// Writes lse[n] = log(sum(exp(logits[n]))) and loss = total / count (0 when
// count is 0); the total is a deterministic sum in double.
CrossEntropyStats CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, const Tensor& lse, const Tensor& loss);

// grad_logits[n] = (exp(logits[n] - lse[n]) - onehot(targets[n])) * grad_loss / count
// (count of this call's targets; 0 for ignored rows). grad_logits (N, V) has
// logits' dtype and may be logits.
CrossEntropyStats CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                       const Tensor& lse, int64_t ignore_index, float grad_loss,
                                       const Tensor& grad_logits);

// Both at once (llm.c style): writes lse and loss, and overwrites logits with
// the gradient above.
CrossEntropyStats CrossEntropyForwardBackwardInPlace(const Tensor& logits, const Tensor& targets,
                                                     int64_t ignore_index, float grad_loss,
                                                     const Tensor& lse, const Tensor& loss);

// Threads of a row's block (the kernels run one block a row): 0, the default,
// takes about 4 16-byte loads a thread, 128 to 1024 (1024 at GPT-2's 50257);
// else that many, a multiple of 32 in [32, 1024] (anything else throws
// OpError). Environment FSDP_CUDA_LOSS_ROW_THREADS=N sets it at the first call
// (an invalid N makes each call throw, naming the variable). The results are
// the same up to the order of a row's sums. For timing block sizes against each
// other (//tensor/cuda:loss_benchmark) and testing them.
void SetCrossEntropyRowThreads(int threads);
int CrossEntropyRowThreads();
// Whether `threads` may be a row's block size: a multiple of a warp (32) in
// [32, 1024] (what the setting above takes besides 0).
inline bool ValidCrossEntropyRowThreads(int64_t threads) {
  return threads >= 32 && threads <= 1024 && threads % 32 == 0;
}
// The threads a row's block gets for rows of v elements loaded `per_load` at a
// time (16 bytes: 8 of bf16 / f16, 4 of f32; 1 for rows not 16-byte aligned):
// the setting above, or its default.
int CrossEntropyBlockThreads(int64_t v, int per_load);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_LOSS_H_
