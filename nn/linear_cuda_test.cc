// Linear with align_output_rows on a GPU against the same layer on the CPU:
// output rows 64-aligned, and from Linear::kPaddedProductMinRows rows on the
// padded product (W copied into 64-aligned rows of zeros, pad columns of the
// output zero), with the gradient given three ways: in place in the output's
// buffer (as the cross-entropy leaves it), as a fresh tensor, and as a view
// of another padded buffer whose pad columns hold NaN (which must not be
// taken for the output's: 0 x NaN is NaN), added to a weight gradient already
// there. Also a frozen weight. Tagged gpu; skips without a device.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/linear.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::Tensor;
using tensor::cuda::testing::DefaultTolerance;
using tensor::cuda::testing::MatchesCpu;
using tensor::cuda::testing::ToGpu;
using tensor::testing::RandomTensor;

constexpr int64_t kIn = 16, kOut = 67, kLd = 128;  // 67 -> rows 128 apart

LinearOptions Head() {
  LinearOptions o;
  o.bias = false;
  o.align_output_rows = true;
  return o;
}

enum class GradFrom { kOutputBuffer, kFreshTensor, kOtherPaddedBuffer };

std::string Name(GradFrom from) {
  switch (from) {
    case GradFrom::kOutputBuffer:
      return "gradient in the output's buffer";
    case GradFrom::kFreshTensor:
      return "fresh gradient";
    case GradFrom::kOtherPaddedBuffer:
      return "gradient in another padded buffer";
  }
  return "";
}

TEST(LinearCudaTest, AlignedOutputRowsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t rows : {int64_t{12}, Linear::kPaddedProductMinRows + 44}) {
    for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
      for (GradFrom from :
           {GradFrom::kOutputBuffer, GradFrom::kFreshTensor, GradFrom::kOtherPaddedBuffer}) {
        SCOPED_TRACE(::testing::Message()
                     << rows << " rows, " << tensor::DtypeName(dtype) << ", " << Name(from));
        const auto tol = DefaultTolerance(dtype, 4.0);
        Linear cpu(kIn, kOut, Head()), gpu(kIn, kOut, Head());
        const Tensor w = RandomTensor({kOut, kIn}, 1).To(dtype);
        cpu.weight()->value = w;
        gpu.weight()->value = ToGpu(w);
        // A gradient already there (accumulation): the backward adds to it.
        const Tensor old_grad = RandomTensor({kOut, kIn}, 4);
        cpu.weight()->grad = old_grad.Clone();
        gpu.weight()->grad = ToGpu(old_grad);
        const Tensor x = RandomTensor({rows, kIn}, 2).To(dtype);
        const Tensor g = RandomTensor({rows, kOut}, 3).To(dtype);
        Context c_cpu, c_gpu;
        const Tensor y_cpu = cpu.Run(x, c_cpu);
        Tensor y_gpu = gpu.Run(ToGpu(x), c_gpu);
        EXPECT_EQ(y_gpu.RowStride(), kLd);
        EXPECT_TRUE(MatchesCpu(y_gpu, y_cpu, tol));
        if (rows >= Linear::kPaddedProductMinRows) {  // the padded product's pad columns
          const Tensor whole(y_gpu.storage(), {rows, kLd}, {kLd, 1}, 0, dtype);
          EXPECT_TRUE(MatchesCpu(whole.Narrow(1, kOut, kLd - kOut),
                                 Tensor::Zeros({rows, kLd - kOut}, dtype), {0, 0}));
        }
        Tensor grad;
        switch (from) {
          case GradFrom::kOutputBuffer:
            y_gpu.CopyFrom(ToGpu(g));
            grad = y_gpu;
            break;
          case GradFrom::kFreshTensor:
            grad = ToGpu(g);
            break;
          case GradFrom::kOtherPaddedBuffer:
            // NaN in the pad columns: multiplied by w_p's zero rows they would make NaN.
            grad = ToGpu(Tensor::FromVector(std::vector<float>(rows * kLd, std::nanf("")),
                                            {rows, kLd}, dtype))
                       .Narrow(1, 0, kOut);
            grad.CopyFrom(ToGpu(g));
            break;
        }
        y_gpu = Tensor();
        const Tensor dx_cpu = cpu.RunBackward(g, c_cpu);
        const Tensor dx_gpu = gpu.RunBackward(grad, c_gpu);
        EXPECT_TRUE(MatchesCpu(dx_gpu, dx_cpu, tol));
        EXPECT_TRUE(MatchesCpu(gpu.weight()->grad, cpu.weight()->grad, DefaultTolerance(dtype, 4)));
      }
    }
  }
}

TEST(LinearCudaTest, PaddedProductWithAFrozenWeightGivesTheInputGradientOnly) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = Linear::kPaddedProductMinRows;
  Linear cpu(kIn, kOut, Head()), gpu(kIn, kOut, Head());
  const Tensor w = RandomTensor({kOut, kIn}, 1);
  cpu.weight()->value = w;
  gpu.weight()->value = ToGpu(w);
  cpu.weight()->requires_grad = false;
  gpu.weight()->requires_grad = false;
  const Tensor x = RandomTensor({rows, kIn}, 2), g = RandomTensor({rows, kOut}, 3);
  Context c_cpu, c_gpu;
  cpu.Run(x, c_cpu);
  Tensor y_gpu = gpu.Run(ToGpu(x), c_gpu);
  y_gpu.CopyFrom(ToGpu(g));
  EXPECT_TRUE(MatchesCpu(gpu.RunBackward(y_gpu, c_gpu), cpu.RunBackward(g, c_cpu)));
  EXPECT_FALSE(gpu.weight()->grad.defined());
}

}  // namespace
}  // namespace nn
