// BatchNorm1d with CUDA tensors against the same layer on the CPU: outputs,
// running statistics and the counter, input and parameter gradients, in
// training and eval, for (N, C) and (N, C, L) inputs; buffers left on the CPU
// are a clear error. Tagged gpu; skips without a device.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Device;
using tensor::cuda::testing::MatchesCpu;
using tensor::cuda::testing::ToGpu;
using tensor::cuda::testing::Tolerance;
using tensor::testing::RandomTensor;

const Tolerance kTol{1e-4, 1e-4};

// Random parameters and running statistics, on `device`.
void RandomState(BatchNorm1d& bn, Device device) {
  const int64_t c = bn.num_features();
  bn.weight()->value = RandomTensor({c}, 1, 0.5f, 1.5f).To(device);
  bn.bias()->value = RandomTensor({c}, 2).To(device);
  *bn.running_mean() = RandomTensor({c}, 3).To(device);
  *bn.running_var() = RandomTensor({c}, 4, 0.5f, 2.0f).To(device);
  *bn.num_batches_tracked() = bn.num_batches_tracked()->To(device);
}

TEST(BatchNorm1dCudaTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (bool training : {true, false}) {
    for (const tensor::Shape& shape : {tensor::Shape{40, 6}, tensor::Shape{8, 6, 50}}) {
      SCOPED_TRACE(shape.ToString() + (training ? " train" : " eval"));
      BatchNorm1d cpu(6), gpu(6);
      RandomState(cpu, Device::Cpu());
      RandomState(gpu, Device::Cuda(0));
      cpu.Train(training);
      gpu.Train(training);
      const Tensor x = RandomTensor(shape, 5, -1.0f, 3.0f);
      const Tensor g = RandomTensor(shape, 6);
      Context c_cpu, c_gpu;
      const Tensor y_cpu = cpu.Run(x, c_cpu);
      const Tensor y_gpu = gpu.Run(ToGpu(x), c_gpu);
      EXPECT_TRUE(MatchesCpu(y_gpu, y_cpu, kTol));
      EXPECT_TRUE(MatchesCpu(*gpu.running_mean(), *cpu.running_mean(), kTol));
      EXPECT_TRUE(MatchesCpu(*gpu.running_var(), *cpu.running_var(), kTol));
      EXPECT_EQ(gpu.num_batches_tracked()->Item(), training ? 1.0 : 0.0);
      EXPECT_TRUE(MatchesCpu(gpu.RunBackward(ToGpu(g), c_gpu), cpu.RunBackward(g, c_cpu), kTol));
      EXPECT_TRUE(MatchesCpu(gpu.weight()->grad, cpu.weight()->grad, kTol));
      EXPECT_TRUE(MatchesCpu(gpu.bias()->grad, cpu.bias()->grad, kTol));
    }
  }
}

TEST(BatchNorm1dCudaTest, BuffersOnAnotherDeviceAreAnError) {
  SKIP_WITHOUT_GPU();
  BatchNorm1d bn(3);
  bn.Materialize(1, Device::Cuda(0));  // parameters and buffers on cuda:0
  // A buffer left behind (set by hand, as a half-done load would).
  for (auto& [name, buffer] : bn.NamedBuffers()) {
    if (name == "running_mean") *buffer = tensor::Tensor::Zeros({3});
  }
  Context ctx;
  try {
    bn.Run(ToGpu(RandomTensor({4, 3}, 7)), ctx);
    FAIL() << "no error";
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[batch_norm1d] running_mean (3) is on cpu but the input (4,3) is on cuda:0; move "
              "the module's buffers to the input's device");
  }
}

}  // namespace
}  // namespace nn
