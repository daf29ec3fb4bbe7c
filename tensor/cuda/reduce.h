// CUDA kernels: reductions (see common.cuh for the conventions). The
// counterparts of tensor/cpu/reduce.h with the same signatures, called by
// tensor/ops/reduce.cc for tensors on a CUDA device. Every kernel sees its
// contiguous input as an (outer, reduce, inner) block and reduces the middle
// dimension; outputs are contiguous (outer, inner).
//
// Precision and determinism: sums accumulate in double (as the CPU's do; sm_90
// runs double adds at full memory bandwidth) over chunks whose size depends
// only on the shape, and the chunk partials are added in a fixed tree order.
// No atomics: a result is the same bit for bit from run to run, and differs
// from the CPU's only by the order of double additions (the float results
// agree except in rare rounding ties). SumSquares returns the double.
#ifndef TENSOR_CUDA_REDUCE_H_
#define TENSOR_CUDA_REDUCE_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

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
// of MaxDim). An index outside [0, reduce) throws OpError naming it (a device
// flag read back after the kernel: this synchronizes the stream).
void ScatterDim(const Tensor& grad_out, const Tensor& indices, int64_t outer, int64_t reduce,
                int64_t inner, const Tensor& grad_in);

// Sum of x^2 over all elements of a contiguous x, accumulated in double;
// synchronizes the stream to return it.
double SumSquares(const Tensor& x);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_REDUCE_H_
