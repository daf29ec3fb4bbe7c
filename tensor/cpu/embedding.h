// CPU kernels of the embedding family: row gather (forward) and a
// deterministic, race-free scatter-add of gradient rows (backward). The op
// layer (tensor/ops/embedding.h) checks shapes and that every id is in range.
#ifndef TENSOR_CPU_EMBEDDING_H_
#define TENSOR_CPU_EMBEDDING_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cpu {

// out (N, C) = weight (V, C) rows ids (N); all contiguous; out has weight's
// dtype (any dtype: rows are copied).
void EmbeddingForward(const Tensor& weight, const Tensor& ids, const Tensor& out);

// grad_weight (V, C) (=, or += with accumulate) the sum of grad_out (N, C) rows
// over the positions n with ids[n] == v. Positions are grouped by id (a counting
// sort) and each vocabulary row is summed in f32 by one thread in ascending
// position order: deterministic and independent of the thread count. grad_out
// and grad_weight: contiguous floating, dtypes may differ.
void EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight,
                       bool accumulate);

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_EMBEDDING_H_
