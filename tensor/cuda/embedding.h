// CUDA kernels: embedding lookup and its backward (see common.cuh for the
// conventions). Called by tensor/ops/embedding.cc for tensors on a CUDA
// device; ids are i32 or i64, every tensor contiguous.
//
// The backward is deterministic and gives the CPU's result bit for bit: the
// positions are sorted by id (a stable radix sort, so each id's positions stay
// in ascending order), and each gradient row is summed in f32 by one thread
// per column in that order, starting from the existing value when
// accumulating, exactly as tensor/cpu/embedding.cc adds them. No atomics.
#ifndef TENSOR_CUDA_EMBEDDING_H_
#define TENSOR_CUDA_EMBEDDING_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// The first position p (row-major in ids) whose id is outside [0, vocab), or
// -1 when all are in range; `*bad_id` receives that id. Synchronizes the
// stream (the answer is read back from a device flag).
int64_t FindBadId(const char* op, const Tensor& ids, int64_t vocab, int64_t* bad_id);

// out (N, C) = weight (V, C) rows ids (N); out has weight's dtype (any dtype:
// rows are copied). Ids must be in range (FindBadId).
void EmbeddingForward(const Tensor& weight, const Tensor& ids, const Tensor& out);

// grad_weight (V, C) (=, or += with accumulate) the sum of grad_out (N, C) rows
// over the positions n with ids[n] == v, in ascending n, in f32. grad_out and
// grad_weight floating, dtypes may differ. Ids outside [0, V) add nothing
// (checking them is the caller's: FindBadId).
void EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight,
                       bool accumulate);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_EMBEDDING_H_
