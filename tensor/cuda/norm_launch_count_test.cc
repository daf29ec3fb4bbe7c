// The kernels a norm backward launches, counted on the CUDA emulation
// (third_party/cuda/emu/counters.h; --config=cuda_emu only): without a
// parameter to sum for (RMSNorm without weight) only grad_x's kernel runs;
// with a weight, rows of a warp make the partial sums in that kernel and
// one column-sum kernel adds them, and longer rows (a block each) add a
// partial-sum kernel of their own.
#include <cstdint>

#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/ops/norm.h"
#include "tensor/testing.h"
#include "third_party/cuda/emu/counters.h"

namespace tensor {
namespace {

using cuda::testing::ToGpu;
using testing::RandomTensor;

// Kernel launches of one steady-state RMSNorm backward over (rows, c), with
// or without a weight.
int64_t BackwardLaunches(int64_t rows, int64_t c, bool weight) {
  const Tensor x = ToGpu(RandomTensor({rows, c}, 1, -2.0f, 2.0f));
  const Tensor gy = ToGpu(RandomTensor({rows, c}, 2, -1.0f, 1.0f));
  const Tensor w = weight ? ToGpu(RandomTensor({c}, 3, 0.5f, 1.5f)) : Tensor();
  const RmsNormResult fwd = RmsNorm(x, w);
  const cuda_emu::Counters counts = cuda_emu::CountSteadyCall([&] {
    const RmsNormGrads g = RmsNormBackward(gy, x, w, fwd.rstd);
    EXPECT_EQ(g.grad_weight.defined(), weight);
  });
  return counts.kernel_launches;
}

TEST(CudaNormLaunchesTest, OnlyGradXWithoutAParameter) {
  EXPECT_EQ(BackwardLaunches(64, 256, /*weight=*/false), 1);   // rows of a warp
  EXPECT_EQ(BackwardLaunches(8, 2048, /*weight=*/false), 1);   // rows of a block
}

TEST(CudaNormLaunchesTest, ParameterSumsWithAWeight) {
  EXPECT_EQ(BackwardLaunches(64, 256, /*weight=*/true), 2);  // partials in grad_x's kernel
  EXPECT_EQ(BackwardLaunches(8, 2048, /*weight=*/true), 3);  // a partial-sum kernel too
}

}  // namespace
}  // namespace tensor
