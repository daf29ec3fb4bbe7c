// Dropout on the GPU against the CPU: for the same generator state the mask
// (Philox4x32-10 per element on the device) and the scaled outputs are the
// same bit for bit, forward and backward, every dtype, sizes that are not a
// multiple of 4 and offsets past 2^32; DropoutAdd for every pair of dtypes.
#include "tensor/ops/dropout.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using testing::RandomTensor;

constexpr Tolerance kExact{0.0, 0.0};

TEST(CudaDropoutTest, MaskIsTheCpuMaskBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{1}, Shape{3, 37}, Shape{1001}, Shape{64, 1024}}) {
    for (float p : {0.1f, 0.5f, 0.9f}) {
      for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 3}) {
        // x = 1: y is the mask times 1 / (1 - p).
        const Tensor x = Tensor::Full(shape, 1.0);
        Generator gen_cpu(1234, offset), gen_gpu(1234, offset);
        const DropoutResult cpu = Dropout(x, p, gen_cpu);
        const DropoutResult gpu = Dropout(ToGpu(x), p, gen_gpu);
        EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, kExact)) << shape.ToString() << " p " << p;
        EXPECT_EQ(gen_gpu.offset(), gen_cpu.offset());
        EXPECT_EQ(gpu.state.seed, cpu.state.seed);
        EXPECT_EQ(gpu.state.offset, cpu.state.offset);
        // The mask as DropoutMask documents it.
        const std::vector<float> y = ToCpu(gpu.y).ToVector<float>();
        const std::vector<uint8_t> mask = DropoutMask(shape, gpu.state).ToVector<uint8_t>();
        for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i] != 0.0f, mask[i] != 0) << i;
      }
    }
  }
}

TEST(CudaDropoutTest, ForwardAndBackwardEveryDtype) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({5, 999}, 1, -3.0f, 3.0f, d);
    const Tensor g = RandomTensor({5, 999}, 2, -1.0f, 1.0f, d);
    Generator gen_cpu(77, 9), gen_gpu(77, 9);
    const DropoutResult cpu = Dropout(x, 0.3f, gen_cpu);
    const DropoutResult gpu = Dropout(ToGpu(x), 0.3f, gen_gpu);
    EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, kExact)) << DtypeName(d);
    EXPECT_TRUE(
        MatchesCpu(DropoutBackward(ToGpu(g), gpu.state), DropoutBackward(g, cpu.state), kExact))
        << DtypeName(d);
    // A strided input is dropped as its contiguous copy.
    Generator gen_a(5), gen_b(5);
    EXPECT_TRUE(MatchesCpu(Dropout(ToGpu(x).Transpose(0, 1), 0.5f, gen_a).y,
                           Dropout(x.Transpose(0, 1), 0.5f, gen_b).y, kExact));
  }
}

// residual + dropout(x) in one kernel: the CPU's bits for every pair of
// dtypes (the sum in float, rounded once to the residual's), a strided x.
TEST(CudaDropoutTest, DropoutAddEveryDtypePair) {
  SKIP_WITHOUT_GPU();
  for (Dtype dr : FloatDtypes()) {
    for (Dtype dx : FloatDtypes()) {
      const Tensor residual = RandomTensor({5, 999}, 3, -3.0f, 3.0f, dr);
      const Tensor x = RandomTensor({999, 5}, 4, -3.0f, 3.0f, dx).Transpose(0, 1);  // strided
      Generator gen_cpu(78, 9), gen_gpu(78, 9);
      const DropoutResult cpu = DropoutAdd(residual, x, 0.3f, gen_cpu);
      const DropoutResult gpu = DropoutAdd(ToGpu(residual), ToGpu(x), 0.3f, gen_gpu);
      EXPECT_EQ(gpu.y.dtype(), dr);
      EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, kExact)) << DtypeName(dr) << " + " << DtypeName(dx);
      EXPECT_EQ(gen_gpu.offset(), gen_cpu.offset());
    }
  }
}

TEST(CudaDropoutTest, IdentityAndAllDropped) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({4, 9}, 3));
  Generator gen(1);
  const DropoutResult eval = Dropout(x, 0.5f, gen, /*training=*/false);
  EXPECT_TRUE(eval.y.SharesStorageWith(x));
  EXPECT_TRUE(DropoutBackward(x, eval.state).SharesStorageWith(x));
  const DropoutResult all = Dropout(x, 1.0f, gen);
  EXPECT_TRUE(MatchesCpu(all.y, Tensor::Zeros({4, 9}), kExact));
  EXPECT_TRUE(MatchesCpu(DropoutBackward(x, all.state), Tensor::Zeros({4, 9}), kExact));
  EXPECT_THROW(DropoutBackward(ToGpu(Tensor::Zeros({3})), all.state), OpError);  // numel
}

}  // namespace
}  // namespace tensor
