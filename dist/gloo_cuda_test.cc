// The gloo engine refuses GPU tensors with a clear error (it reads and writes
// host memory and orders nothing on a GPU stream: the nccl engine takes GPU
// tensors, the threads engine ranks sharing a GPU). A group of one in this
// process; skips where no GPU is visible (the emulation has one).
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "dist/gloo_group.h"
#include "gtest/gtest.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"

namespace dist {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::Tensor;

TEST(GlooCudaTest, GpuTensorsAreRefusedNamingTheDevice) {
  if (tensor::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  const char* tmp = std::getenv("TEST_TMPDIR");
  GlooGroupOptions options;
  options.store = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/gloo_cuda_store");
  options.timeout = absl::Seconds(30);
  auto pg = CreateGlooProcessGroup(0, 1, options);
  ASSERT_TRUE(pg.ok()) << pg.status();
  Tensor x = Tensor::Full({4}, 1.0, Dtype::kF32, Device::Cuda(0));
  const absl::Status s = (*pg)->AllReduceSync(x, ReduceOp::kSum);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(std::string(s.message()).find("the gloo engine takes CPU tensors; the input is on "
                                          "cuda:0"),
            std::string::npos)
      << s;
  // The group stays usable for CPU tensors.
  Tensor y = Tensor::Full({4}, 2.0);
  EXPECT_TRUE((*pg)->AllReduceSync(y, ReduceOp::kSum).ok());
  EXPECT_EQ(y.ToVector<float>()[0], 2.0f);
}

}  // namespace
}  // namespace dist
