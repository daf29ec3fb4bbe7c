// CUDA kernels: fill and dtype casts (see common.cuh for the conventions).
#ifndef TENSOR_CUDA_CAST_H_
#define TENSOR_CUDA_CAST_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Every element of `t` (contiguous, floating or integral) set to `value`.
void Fill(const Tensor& t, double value);
// out = x converted to out's dtype (floating <-> floating, RNE); same numel,
// both contiguous on one device.
void Cast(const Tensor& x, const Tensor& out);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_CAST_H_
