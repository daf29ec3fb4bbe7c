// CUDA kernels: fill (see common.cuh for the conventions). Casts and strided
// copies are the backend's (tensor/cuda_backend.h: CopyStridedOnDevice), which
// Tensor::To(dtype) / Contiguous / CopyFrom run for CUDA tensors.
#ifndef TENSOR_CUDA_CAST_H_
#define TENSOR_CUDA_CAST_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Every element of `t` (contiguous, floating or integral) set to `value`.
void Fill(const Tensor& t, double value);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_CAST_H_
