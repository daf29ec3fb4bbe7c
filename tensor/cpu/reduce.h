// CPU kernels of the reductions (tensor/ops/reduce.h). Every kernel sees its
// input as a contiguous (outer, reduce, inner) block, reducing the middle
// dimension: a sum over dim d of shape (d0..dn) has outer = d0*..*d(d-1),
// reduce = dd and inner = d(d+1)*..*dn. Outputs are contiguous (outer, inner).
//
// Sums accumulate in double over blocks whose size depends only on the shape,
// combined in a fixed order: the result never depends on the thread count.
#ifndef TENSOR_CPU_REDUCE_H_
#define TENSOR_CPU_REDUCE_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cpu {

// out[o, i] = scale * sum_r x[o, r, i] (+ out[o, i] when accumulate). x and out
// may have different floating dtypes (e.g. a bf16 gradient summed into f32).
void SumDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, double scale,
            bool accumulate, const Tensor& out);

// values[o, i] = max_r x[o, r, i] and indices[o, i] (i64) its first index r.
// NaN counts as the largest value. reduce must be > 0.
void MaxDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, const Tensor& values,
            const Tensor& indices);

// grad_in[o, r, i] = scale * grad_out[o, i] (the backward of SumDim).
void BroadcastDim(const Tensor& grad_out, int64_t outer, int64_t reduce, int64_t inner,
                  double scale, const Tensor& grad_in);

// grad_in = 0 except grad_in[o, indices[o, i], i] = grad_out[o, i] (the backward
// of MaxDim). Throws OpError on an index outside [0, reduce).
void ScatterDim(const Tensor& grad_out, const Tensor& indices, int64_t outer, int64_t reduce,
                int64_t inner, const Tensor& grad_in);

// Sum of x^2 over all elements of a contiguous x, in double.
double SumSquares(const Tensor& x);

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_REDUCE_H_
