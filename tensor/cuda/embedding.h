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
#include <functional>
#include <string>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Checks that every id is in [0, vocab) without a host wait: a kernel finds
// the first position p (row-major in ids) whose id is not, and the host reads
// p and that id at its next wait for the GPU (a deferred check,
// tensor/cuda_backend.h), where report(p, id) gives the error thrown.
void CheckIdsDeferred(const char* op, const Tensor& ids, int64_t vocab,
                      std::function<std::string(int64_t position, int64_t id)> report);

// out (N, C) = weight (V, C) rows ids (N); out has weight's dtype (any dtype:
// rows are copied). A row for an id outside [0, V) is zeros (its error is
// CheckIdsDeferred's to report).
void EmbeddingForward(const Tensor& weight, const Tensor& ids, const Tensor& out);

// grad_weight (V, C) (=, or += with accumulate) the sum of grad_out (N, C) rows
// over the positions n with ids[n] == v, in ascending n, in f32. grad_out and
// grad_weight floating, dtypes may differ. Ids outside [0, V) add nothing
// (checking them is the caller's: CheckIdsDeferred).
void EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight,
                       bool accumulate);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_EMBEDDING_H_
