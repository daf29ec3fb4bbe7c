// The loss scaler's unscale and inf/NaN check with gradients on a CUDA
// device, against the same call on the CPU. Tagged gpu; skips where no device
// is visible.
#include <cmath>
#include <limits>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "precision/loss_scaler.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace precision {
namespace {

using tensor::Tensor;
using tensor::cuda::testing::MatchesCpu;
using tensor::cuda::testing::ToGpu;

constexpr tensor::cuda::testing::Tolerance kExact = {0, 0};

TEST(CudaLossScalerTest, UnscalesEveryGradientAsTheCpu) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> cpu = {tensor::testing::RandomTensor({10007}, 1),
                             tensor::testing::RandomTensor({3, 5}, 2), Tensor::Zeros({0}),
                             tensor::testing::RandomTensor({1}, 3)};
  std::vector<Tensor> gpu;
  for (const Tensor& t : cpu) gpu.push_back(ToGpu(t));
  EXPECT_FALSE(ScaleAndCheckNonFinite(absl::MakeSpan(cpu), 1.0f / 1024));
  EXPECT_FALSE(ScaleAndCheckNonFinite(absl::MakeSpan(gpu), 1.0f / 1024));
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(MatchesCpu(gpu[i], cpu[i], kExact)) << i;
}

TEST(CudaLossScalerTest, FindsInfAndNanInAnyGradient) {
  SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {inf, -inf, nan}) {
    for (int which = 0; which < 3; ++which) {
      std::vector<Tensor> gpu;
      for (int i = 0; i < 3; ++i) {
        std::vector<float> v(4099, 0.5f);
        if (i == which) v[4098] = bad;
        gpu.push_back(ToGpu(Tensor::FromVector(v, {4099})));
      }
      EXPECT_TRUE(ScaleAndCheckNonFinite(absl::MakeSpan(gpu), 0.5f)) << bad << " in " << which;
    }
  }
  // Finite inputs that overflow when scaled up count too.
  Tensor big = ToGpu(Tensor::FromVector({3e38f, 1.0f}, {2}));
  EXPECT_TRUE(ScaleAndCheckNonFinite(big, 2.0f));
  Tensor fine = ToGpu(Tensor::FromVector({3e38f, 1.0f}, {2}));
  EXPECT_FALSE(ScaleAndCheckNonFinite(fine, 0.5f));
  EXPECT_TRUE(MatchesCpu(fine, Tensor::FromVector({1.5e38f, 0.5f}, {2}), kExact));
}

TEST(CudaLossScalerTest, OtherDtypesGoThroughTheHost) {
  SKIP_WITHOUT_GPU();
  const Tensor cpu = tensor::testing::RandomTensor({257}, 4).To(tensor::Dtype::kBF16);
  Tensor want = cpu.Clone();
  Tensor gpu = ToGpu(cpu);
  EXPECT_FALSE(ScaleAndCheckNonFinite(want, 0.25f));
  EXPECT_FALSE(ScaleAndCheckNonFinite(gpu, 0.25f));
  EXPECT_TRUE(MatchesCpu(gpu, want, kExact));
}

}  // namespace
}  // namespace precision
