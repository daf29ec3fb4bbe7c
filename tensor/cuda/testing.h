// The generic check of the CUDA backend: run an op on the GPU and on the CPU
// (the reference) and compare, per dtype. Tests using it are tagged "gpu",
// build with --config=cuda only, and skip (GTEST_SKIP) where no device is
// visible:
//
//   TEST(CudaElementwiseTest, Add) {
//     SKIP_WITHOUT_GPU();
//     for (Dtype d : FloatDtypes()) {
//       Tensor a = RandomTensor({33, 70}, d), b = RandomTensor({33, 70}, d);
//       EXPECT_TRUE(MatchesCpu(tensor::Add(ToGpu(a), ToGpu(b)), tensor::Add(a, b)));
//     }
//   }
#ifndef TENSOR_CUDA_TESTING_H_
#define TENSOR_CUDA_TESTING_H_

#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cuda {
namespace testing {

// A --config=cuda build with at least one visible device.
bool HasGpu();

#define SKIP_WITHOUT_GPU()                                   \
  do {                                                       \
    if (!::tensor::cuda::testing::HasGpu()) {                \
      GTEST_SKIP() << "no CUDA device visible (or no CUDA)"; \
    }                                                        \
  } while (0)

// Skips unless at least n CUDA devices are visible (one rank per device, as
// NCCL requires; the CUDA emulation has CUDA_EMU_DEVICES of them).
#define SKIP_WITHOUT_GPUS(n)                                                         \
  do {                                                                               \
    const int visible = ::tensor::cuda::DeviceCount();                               \
    if (visible < (n)) {                                                             \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << visible << " visible"; \
    }                                                                                \
  } while (0)

// Copies to cuda:index / to the host.
Tensor ToGpu(const Tensor& t, int index = 0);
Tensor ToCpu(const Tensor& t);

struct Tolerance {
  double rtol;
  double atol;
};
// f32 1e-5/1e-5 (different summation orders), f16 2e-3/2e-3, bf16 1.6e-2/1.6e-2
// (two roundings of 2^-8), scaled by `factor` for ops that accumulate long sums.
Tolerance DefaultTolerance(Dtype dtype, double factor = 1.0);

// The GPU result (copied back) against the CPU reference: same shape and
// dtype, and |gpu - cpu| <= atol + rtol |cpu| everywhere (NaN/inf must match).
// On failure the message names the first few differing elements.
::testing::AssertionResult MatchesCpu(const Tensor& gpu, const Tensor& cpu);
::testing::AssertionResult MatchesCpu(const Tensor& gpu, const Tensor& cpu, Tolerance tol);

// For results of long reductions (attention, its gradients): |gpu - ref| <=
// tol * (max(max|ref|, 1e-2) + |ref|) everywhere, an error relative to the
// largest reference value. The floor of 1e-2 covers values that are exactly
// zero in exact arithmetic (a gradient through a constant softmax) and come
// out as the rounding of cancelling terms of size ~1. An infinite reference
// must be matched exactly; NaN never passes. The message names the worst
// element.
::testing::AssertionResult NearScaled(const Tensor& gpu, const std::vector<double>& ref,
                                      double tol);
// The same against a CPU tensor of the same shape.
::testing::AssertionResult NearScaled(const Tensor& gpu, const Tensor& cpu, double tol);

// f32, bf16, f16.
std::vector<Dtype> FloatDtypes();

}  // namespace testing
}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_TESTING_H_
