// Softmax forward and backward on the GPU against the CPU: rows per warp and
// per block, vector and scalar paths, the causal mask (T_q = T_k and T_q <
// T_k), scales (including negative), in place, long rows (50257) and more
// than 65535 rows.
#include "tensor/ops/softmax.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::DefaultTolerance;
using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using testing::RandomTensor;

// Probabilities of long rows are small: a tight absolute tolerance keeps the
// comparison meaningful.
Tolerance ProbTolerance(Dtype d) {
  const Tolerance t = DefaultTolerance(d, 2.0);
  return {t.rtol, t.atol * 1e-3};
}

// The backward's y * (grad_y - dot) cancels where grad_y is near the dot
// product, whose summation order differs from the CPU's.
Tolerance GradTolerance(Dtype d) {
  const Tolerance t = DefaultTolerance(d, 2.0);
  return {t.rtol, t.atol * 0.05};
}

struct Case {
  Shape shape;
  SoftmaxOptions options;
};

std::vector<Case> Cases() {
  SoftmaxOptions causal;
  causal.causal = true;
  causal.scale = 0.125f;
  SoftmaxOptions scaled;
  scaled.scale = -1.5f;
  return {
      {{1, 1}, {}},
      {{3, 7}, {}},
      {{4, 33}, scaled},
      {{2, 2, 64, 64}, causal},
      {{3, 48, 80}, causal},
      {{2, 1024}, {}},
      {{2, 1025}, scaled},
      {{2, 3, 1500}, {}},
      {{2, 200, 1600}, causal},
      {{3, 4096}, {}},
      {{2, 50257}, {}},
      {{70000, 33}, {}},
  };
}

std::string CaseName(const Case& c, Dtype d) {
  return c.shape.ToString() + " " + std::string(DtypeName(d)) + " scale " +
         std::to_string(c.options.scale) + (c.options.causal ? " causal" : "");
}

TEST(CudaSoftmaxTest, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Case& c : Cases()) {
    for (Dtype d : FloatDtypes()) {
      SCOPED_TRACE(CaseName(c, d));
      const Tensor x = RandomTensor(c.shape, ++seed, -8.0f, 8.0f, d);
      EXPECT_TRUE(
          MatchesCpu(Softmax(ToGpu(x), c.options), Softmax(x, c.options), ProbTolerance(d)));
    }
  }
}

TEST(CudaSoftmaxTest, InPlaceAndIntoMatchCpu) {
  SKIP_WITHOUT_GPU();
  SoftmaxOptions causal;
  causal.causal = true;
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({2, 3, 40, 40}, 5, -4.0f, 4.0f, d);
    const Tensor cpu = Softmax(x, causal);
    const Tensor in_place = ToGpu(x);
    SoftmaxInto(in_place, in_place, causal);
    EXPECT_TRUE(MatchesCpu(in_place, cpu, ProbTolerance(d))) << DtypeName(d);
    const Tensor out = Tensor::Empty(x.shape(), d, Device::Cuda(0));
    SoftmaxInto(ToGpu(x), out, causal);
    EXPECT_TRUE(MatchesCpu(out, cpu, ProbTolerance(d))) << DtypeName(d);
  }
}

TEST(CudaSoftmaxTest, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const Case& c : Cases()) {
    for (Dtype d : FloatDtypes()) {
      SCOPED_TRACE(CaseName(c, d));
      const Tensor x = RandomTensor(c.shape, ++seed, -4.0f, 4.0f, d);
      const Tensor gy = RandomTensor(c.shape, ++seed, -1.0f, 1.0f, d);
      const Tensor y = Softmax(x, c.options);  // the same y on both sides
      EXPECT_TRUE(MatchesCpu(SoftmaxBackward(ToGpu(gy), ToGpu(y), c.options),
                             SoftmaxBackward(gy, y, c.options), GradTolerance(d)));
    }
  }
}

TEST(CudaSoftmaxTest, ExtremeValuesAndStridedInput) {
  SKIP_WITHOUT_GPU();
  // Large logits (no overflow), -inf entries (probability 0).
  std::vector<float> v = {1000.0f, 999.0f, -1000.0f, -INFINITY, 0.0f, 88.0f, 89.0f, -INFINITY};
  const Tensor x = Tensor::FromVector(v, {2, 4});
  EXPECT_TRUE(MatchesCpu(Softmax(ToGpu(x)), Softmax(x)));
  const Tensor t = RandomTensor({50, 7}, 9, -3.0f, 3.0f);
  EXPECT_TRUE(MatchesCpu(Softmax(ToGpu(t).Transpose(0, 1)), Softmax(t.Transpose(0, 1))));
}

TEST(CudaSoftmaxTest, ForwardIsBitIdenticalAcrossRuns) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({64, 50257}, 13, -10.0f, 10.0f, Dtype::kBF16));
  EXPECT_EQ(ToCpu(Softmax(x)).ToVector<float>(), ToCpu(Softmax(x)).ToVector<float>());
}

}  // namespace
}  // namespace tensor
