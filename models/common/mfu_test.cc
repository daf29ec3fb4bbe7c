// The GPU peak table and --peak_tflops: known names in bf16 / f16, nothing
// for f32, an unknown GPU or the CPU without the flag; the flag times the
// devices; a negative flag names it.
#include "models/common/mfu.h"

#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace train {
namespace {

using tensor::Device;
using tensor::Dtype;

TEST(MfuTest, GpuPeaksByNameAndDtype) {
  EXPECT_EQ(GpuPeakTflops("NVIDIA H100 80GB HBM3", Dtype::kBF16), 989.5);
  EXPECT_EQ(GpuPeakTflops("NVIDIA H100 PCIe", Dtype::kF16), 756.0);  // before "H100"
  EXPECT_EQ(GpuPeakTflops("NVIDIA H200", Dtype::kBF16), 989.5);
  EXPECT_EQ(GpuPeakTflops("NVIDIA A100-SXM4-80GB", Dtype::kBF16), 312.0);
  EXPECT_EQ(GpuPeakTflops("NVIDIA H100 80GB HBM3", Dtype::kF32), 0.0);
  EXPECT_EQ(GpuPeakTflops("NVIDIA GeForce RTX 4090", Dtype::kBF16), 0.0);
}

TEST(MfuTest, PeakFlopsFromTheFlagTimesTheDevices) {
  EXPECT_EQ(*PeakFlops(0, Device::Cpu(), Dtype::kBF16, 1), 0.0);  // the CPU: only by the flag
  EXPECT_EQ(*PeakFlops(2.5, Device::Cpu(), Dtype::kF32, 1), 2.5e12);
  EXPECT_EQ(*PeakFlops(100, Device::Cpu(), Dtype::kBF16, 4), 4e14);
  absl::StatusOr<double> bad = PeakFlops(-1, Device::Cpu(), Dtype::kBF16, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("--peak_tflops=-1 must be finite and >= 0"),
            std::string::npos);
  // An infinite peak would make every MFU 0%.
  bad = PeakFlops(std::numeric_limits<double>::infinity(), Device::Cpu(), Dtype::kBF16, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace train
