// BatchNorm forward and backward on the GPU against the CPU: (N, C) inputs
// (the column layout, C not a multiple of 32, many rows) and (N, C, L) inputs
// (short and long rows), training (batch statistics, running-statistics
// updates and the counter) and eval, with and without weight and bias, a mean
// far from zero, bit-identical results across runs, and device errors.
#include "tensor/ops/batch_norm.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::DefaultTolerance;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using testing::RandomTensor;

std::vector<Shape> Shapes() {
  return {{2, 3},    {64, 16},     {1000, 70},  {70000, 3},
          {4, 3, 5}, {8, 33, 100}, {32, 64, 7}, {2, 4, 40000}};
}

// Both sides sum in double; they differ in the order and in float roundings
// of the elementwise passes (grad_x: a sum of three terms that may cancel).
const Tolerance kStats{1e-5, 1e-6};
const Tolerance kOut = DefaultTolerance(Dtype::kF32, 10.0);

Tensor Gpu(const Tensor& t) { return t.defined() ? ToGpu(t) : Tensor(); }

BatchNormRunningStats RunningStats(int64_t c, uint64_t seed) {
  return {RandomTensor({c}, seed, -0.5f, 0.5f), RandomTensor({c}, seed + 1, 0.5f, 2.0f),
          Tensor::Full({}, 7, Dtype::kI64)};
}

BatchNormRunningStats Gpu(const BatchNormRunningStats& r) {
  return {Gpu(r.mean), Gpu(r.var), Gpu(r.num_batches_tracked)};
}

TEST(CudaBatchNormTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Shape& shape : Shapes()) {
    const int64_t c = shape[1];
    for (bool training : {true, false}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(shape.ToString() + (training ? " train" : " eval") +
                     (affine ? " affine" : " plain"));
        const Tensor x = RandomTensor(shape, ++seed, -1.0f, 3.0f);
        const Tensor gy = RandomTensor(shape, ++seed);
        const Tensor w = affine ? RandomTensor({c}, ++seed, 0.5f, 1.5f) : Tensor();
        const Tensor b = affine ? RandomTensor({c}, ++seed) : Tensor();
        BatchNormRunningStats run_cpu = RunningStats(c, ++seed);
        BatchNormRunningStats run_gpu = Gpu(run_cpu);
        ++seed;

        const BatchNormResult cpu = BatchNorm(x, w, b, run_cpu, training, 0.1f, 1e-5f);
        const BatchNormResult gpu =
            BatchNorm(ToGpu(x), Gpu(w), Gpu(b), run_gpu, training, 0.1f, 1e-5f);
        EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, kOut));
        EXPECT_TRUE(MatchesCpu(gpu.mean, cpu.mean, kStats));
        EXPECT_TRUE(MatchesCpu(gpu.rstd, cpu.rstd, kStats));
        EXPECT_TRUE(MatchesCpu(run_gpu.mean, run_cpu.mean, kStats));
        EXPECT_TRUE(MatchesCpu(run_gpu.var, run_cpu.var, kStats));
        EXPECT_EQ(run_gpu.num_batches_tracked.Item(), training ? 8.0 : 7.0);
        EXPECT_EQ(run_cpu.num_batches_tracked.Item(), training ? 8.0 : 7.0);

        // The same saved statistics on both sides: only the backward is compared.
        const BatchNormGrads gcpu = BatchNormBackward(gy, x, w, cpu.mean, cpu.rstd, training);
        const BatchNormGrads ggpu = BatchNormBackward(ToGpu(gy), ToGpu(x), Gpu(w), ToGpu(cpu.mean),
                                                      ToGpu(cpu.rstd), training);
        EXPECT_TRUE(MatchesCpu(ggpu.grad_x, gcpu.grad_x, kOut));
        EXPECT_TRUE(MatchesCpu(ggpu.grad_weight, gcpu.grad_weight, kOut));
        EXPECT_TRUE(MatchesCpu(ggpu.grad_bias, gcpu.grad_bias, kOut));
      }
    }
  }
}

// Training without running statistics (the recomputed forward of an
// activation checkpoint, or track_running_stats = false).
TEST(CudaBatchNormTest, TrainingWithoutRunningStats) {
  SKIP_WITHOUT_GPU();
  const Tensor x = RandomTensor({16, 5, 9}, 3);
  const BatchNormResult cpu = BatchNorm(x, Tensor(), Tensor(), {}, /*training=*/true);
  const BatchNormResult gpu = BatchNorm(ToGpu(x), Tensor(), Tensor(), {}, /*training=*/true);
  EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, kOut));
  EXPECT_TRUE(MatchesCpu(gpu.rstd, cpu.rstd, kStats));
}

// |mean| >> spread: the statistics must not cancel.
TEST(CudaBatchNormTest, LargeMeanSmallSpread) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{5000, 4}, Shape{20, 4, 300}}) {
    SCOPED_TRACE(shape.ToString());
    const Tensor x = RandomTensor(shape, 4, 1000.0f, 1000.5f);
    const BatchNormResult cpu = BatchNorm(x, Tensor(), Tensor(), {}, /*training=*/true);
    const BatchNormResult gpu = BatchNorm(ToGpu(x), Tensor(), Tensor(), {}, /*training=*/true);
    EXPECT_TRUE(MatchesCpu(gpu.mean, cpu.mean, kStats));
    EXPECT_TRUE(MatchesCpu(gpu.rstd, cpu.rstd, Tolerance{1e-4, 0}));
    EXPECT_TRUE(MatchesCpu(gpu.y, cpu.y, Tolerance{1e-3, 1e-3}));
  }
}

TEST(CudaBatchNormTest, BitIdenticalAcrossRuns) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({256, 48, 33}, 5));
  const Tensor gy = ToGpu(RandomTensor({256, 48, 33}, 6));
  const BatchNormResult a = BatchNorm(x, Tensor(), Tensor(), {}, true);
  const BatchNormResult b = BatchNorm(x, Tensor(), Tensor(), {}, true);
  EXPECT_EQ(ToCpu(a.y).ToVector<float>(), ToCpu(b.y).ToVector<float>());
  const BatchNormGrads ga = BatchNormBackward(gy, x, Tensor(), a.mean, a.rstd, true);
  const BatchNormGrads gb = BatchNormBackward(gy, x, Tensor(), a.mean, a.rstd, true);
  EXPECT_EQ(ToCpu(ga.grad_weight).ToVector<float>(), ToCpu(gb.grad_weight).ToVector<float>());
  EXPECT_EQ(ToCpu(ga.grad_x).ToVector<float>(), ToCpu(gb.grad_x).ToVector<float>());
}

TEST(CudaBatchNormTest, RunningStatsOnAnotherDeviceAreAnError) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({4, 3}, 7));
  try {
    BatchNorm(x, Tensor(), Tensor(), RunningStats(3, 8), /*training=*/true);
    FAIL() << "no error";
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[batch_norm] running_mean (3) is on cpu but x (4,3) is on cuda:0");
  }
  EXPECT_THROW(BatchNorm(x, Tensor::Full({3}, 1.0), Tensor(), {}, true), OpError);
}

}  // namespace
}  // namespace tensor
