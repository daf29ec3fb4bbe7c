// CUDA backend: allocation charged to the ledger, round trips host <-> device.
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"

namespace tensor {
namespace {

TEST(CudaBackendTest, RoundTripAndLedger) {
  ASSERT_TRUE(cuda::Built());
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  Tensor host = Tensor::FromVector(values, {2, 3});
  Tensor dev = host.To(Device::Cuda(0));
  EXPECT_EQ(dev.device(), Device::Cuda(0));
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).current, 24);
  EXPECT_EQ(dev.To(Device::Cpu()).ToVector<float>(), values);
  dev = Tensor();
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).current, 0);
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).peak, 24);
}

TEST(CudaBackendTest, MissingDeviceIsAClearError) {
  const int n = cuda::DeviceCount();
  EXPECT_THROW(Tensor::Empty({4}, Dtype::kF32, Device::Cuda(n)), std::exception);
}

}  // namespace
}  // namespace tensor
