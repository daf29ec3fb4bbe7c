// Dtype support checks by device.
#include "precision/dtype_support.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tensor/cuda_backend.h"

namespace precision {
namespace {

bool CpuHasBf16Units() {
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
}

bool AllowSlowBf16() {
  const char* v = std::getenv("FSDP_ALLOW_SLOW_BF16");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace

bool Bf16Supported(tensor::Device device) {
  if (device.is_cpu()) return CpuHasBf16Units() || AllowSlowBf16();
  return device.index < tensor::cuda::DeviceCount() &&
         tensor::cuda::ComputeCapability(device.index) >= 80;
}

bool Fp16Supported(tensor::Device device) {
  if (device.is_cpu()) return false;  // the CPU backend has no f16 GEMM (oneDNN 2.6)
  return device.index < tensor::cuda::DeviceCount() &&
         tensor::cuda::ComputeCapability(device.index) >= 70;
}

absl::Status CheckComputeDtype(tensor::Dtype dtype, tensor::Device device) {
  using tensor::Dtype;
  switch (dtype) {
    case Dtype::kF32:
      return absl::OkStatus();
    case Dtype::kBF16:
      if (Bf16Supported(device)) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          "bf16 is not supported on ", device.ToString(),
          device.is_cpu() ? ": this CPU has neither AVX512-BF16 nor AMX-BF16 units "
                            "(set FSDP_ALLOW_SLOW_BF16=1 to run it emulated, slowly)"
                          : ": it needs compute capability 8.0 or newer, or the device is absent"));
    case Dtype::kF16:
      if (Fp16Supported(device)) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          "f16 is not supported on ", device.ToString(),
          device.is_cpu() ? (Bf16Supported(device) ? ": the CPU backend has no f16 GEMM; use bf16"
                                                   : ": the CPU backend has no f16 GEMM; use "
                                                     "fp32 (or bf16, emulated slowly on this "
                                                     "CPU: FSDP_ALLOW_SLOW_BF16=1)")
                          : ": the device is absent or older than compute capability 7.0"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(tensor::DtypeName(dtype), " is not a floating-point compute dtype"));
  }
}

}  // namespace precision
