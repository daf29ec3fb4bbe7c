// Model FLOPs utilization (mfu.h).
#include "models/common/mfu.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tensor/cuda_backend.h"

namespace train {

double GpuPeakTflops(absl::string_view device_name, tensor::Dtype compute_dtype) {
  if (compute_dtype != tensor::Dtype::kBF16 && compute_dtype != tensor::Dtype::kF16) return 0;
  static constexpr std::pair<const char*, double> kPeaks[] = {
      {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"GH200", 989.5},
      {"H200", 989.5},      {"H100", 989.5},     {"A100", 312.0}};
  for (const auto& [name, tflops] : kPeaks) {
    if (absl::StrContains(device_name, name)) return tflops;
  }
  return 0;
}

absl::StatusOr<double> PeakFlops(double flag_tflops, tensor::Device device,
                                 tensor::Dtype compute_dtype, int devices) {
  if (!(flag_tflops >= 0) || !std::isfinite(flag_tflops)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peak_tflops=", flag_tflops, " must be finite and >= 0 (0: the GPU's known peak)"));
  }
  double per_device = flag_tflops;
  if (per_device == 0 && device.is_cuda()) {
    per_device = GpuPeakTflops(tensor::cuda::DeviceName(device.index), compute_dtype);
  }
  return per_device * 1e12 * devices;
}

}  // namespace train
