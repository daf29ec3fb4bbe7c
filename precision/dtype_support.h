// Which low-precision dtypes a device can compute in, and the error a user
// gets when asking for one it lacks (instead of a crash or a silent fallback).
#ifndef PRECISION_DTYPE_SUPPORT_H_
#define PRECISION_DTYPE_SUPPORT_H_

#include "absl/status/status.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace precision {

// CPU: bf16 needs AVX512-BF16 or AMX-BF16 units (oneDNN's fast bf16 GEMM), unless
// FSDP_ALLOW_SLOW_BF16=1. CUDA: compute capability 8.0 or newer.
bool Bf16Supported(tensor::Device device);
// CPU: never (oneDNN 2.6 has no f16 GEMM on the CPU; use bf16).
// CUDA: compute capability 7.0 or newer.
bool Fp16Supported(tensor::Device device);
// OK for f32 everywhere; for bf16/f16 an InvalidArgument error naming the
// device and what it lacks; integer dtypes are not compute dtypes.
absl::Status CheckComputeDtype(tensor::Dtype dtype, tensor::Device device);

}  // namespace precision

#endif  // PRECISION_DTYPE_SUPPORT_H_
