// CUDA kernels: fill.
#include "tensor/cuda/cast.h"
#include "tensor/cuda/common.cuh"

namespace tensor {
namespace cuda {
namespace {

template <typename T>
__global__ void FillKernel(T* p, int64_t n, T value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = value;
  }
}

template <typename T>
void LaunchFill(const Tensor& t, T value) {
  const int64_t n = t.numel();
  FillKernel<T><<<Blocks(n), kThreads, 0, ComputeStream()>>>(Ptr<T>(t), n, value);
}

}  // namespace

void Fill(const Tensor& t, double value) {
  SetDevice(t, "fill");
  switch (t.dtype()) {
    case Dtype::kI32:
      LaunchFill<int32_t>(t, static_cast<int32_t>(value));
      break;
    case Dtype::kI64:
      LaunchFill<int64_t>(t, static_cast<int64_t>(value));
      break;
    case Dtype::kU8:
      LaunchFill<uint8_t>(t, static_cast<uint8_t>(value));
      break;
    default:
      DispatchFloat(t.dtype(), "fill", [&](auto zero) {
        using T = decltype(zero);
        // Rounded on the host once (RNE), as the CPU path does.
        T v;
        if constexpr (std::is_same_v<T, float>) {
          v = static_cast<float>(value);
        } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          v = __float2bfloat16_rn(static_cast<float>(value));
        } else {
          v = __float2half_rn(static_cast<float>(value));
        }
        LaunchFill<T>(t, v);
      });
  }
  CheckLaunch("fill");
}

}  // namespace cuda
}  // namespace tensor
