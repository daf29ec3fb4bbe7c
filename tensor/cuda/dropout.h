// CUDA kernels: dropout (see common.cuh for the conventions). Called by
// tensor/ops/dropout.cc for tensors on a CUDA device.
//
// The mask is the function documented in tensor/ops/dropout.h, evaluated on
// the device: element i uses Philox4x32-10 word i % 4 of counter
// offset + i / 4 under key seed, and is kept iff (word >> 8) >= ceil(p 2^24).
// Kept elements are multiplied by float(1 / (1 - p)) in float and rounded once
// to the dtype, dropped ones are 0 (a select: dropped inf / NaN give 0). So a
// CUDA dropout equals the CPU's bit for bit for the same generator state.
#ifndef TENSOR_CUDA_DROPOUT_H_
#define TENSOR_CUDA_DROPOUT_H_

#include <cstdint>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// out = in * mask / (1 - p); in and out contiguous floating of one dtype and
// numel (out may be in); 0 <= p < 1. `op` names the op in errors.
void DropoutApply(const char* op, const Tensor& in, const Tensor& out, float p, uint64_t seed,
                  uint64_t offset);

// out = res + in * mask / (1 - p), the sum in float (__fadd_rn of the
// __fmul_rn product: no FMA, as the CPU) rounded once to res's dtype; res,
// in and out contiguous floating with one numel (in's dtype may differ; out
// has res's and may be res); 0 <= p < 1.
void DropoutAddApply(const char* op, const Tensor& res, const Tensor& in, const Tensor& out,
                     float p, uint64_t seed, uint64_t offset);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_DROPOUT_H_
