// Embedding lookup: rows of a (V, C) table gathered by integer ids, and its
// backward, a deterministic scatter-add of gradient rows into a (V, C) table.
#ifndef TENSOR_OPS_EMBEDDING_H_
#define TENSOR_OPS_EMBEDDING_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {

// weight (V, C) any dtype, ids (...) i32 or i64 -> (..., C) in weight's dtype.
// An id outside [0, V) throws OpError naming the id, its position and V. On a
// GPU the check costs no host wait: a kernel checks, and the error is thrown
// at the host's next wait for the GPU (reading a loss, a gradient norm or a
// tensor back; an optimizer step waits for pending checks before it changes
// any parameter), as PyTorch's device-side asserts are; the rows of bad ids
// are zeros.
// ids_checked: the caller made the ids itself and guarantees [0, V) (e.g. T5's
// relative position buckets), so a GPU skips the check's kernels. On the CPU
// the check always runs.
Tensor Embedding(const Tensor& weight, const Tensor& ids, bool ids_checked = false);

// grad_weight (V, C) with V = num_embeddings: row v is the sum of the rows of
// grad_out (..., C) at the positions where ids == v (repeated ids add up, rows
// never looked up are 0). Summed in f32 in position order (deterministic);
// grad_out's dtype (floating).
Tensor EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, int64_t num_embeddings);

// The same sums added into an existing contiguous floating grad_weight (V, C)
// (e.g. an f32 gradient buffer for bf16 activations, or tied embeddings that
// also receive the LM head's gradient).
//
// ids_checked: the caller has already checked these ids against V (the
// forward's Embedding did, on the same ids), so a GPU skips the check's
// kernels; ids out of range then add nothing. On the CPU the check always
// runs.
void EmbeddingBackwardAccumulate(const Tensor& grad_out, const Tensor& ids,
                                 const Tensor& grad_weight, bool ids_checked = false);

}  // namespace tensor

#endif  // TENSOR_OPS_EMBEDDING_H_
