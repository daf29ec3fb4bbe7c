// CUDA dropout: one thread per Philox counter (4 elements), the generator of
// tensor/random.cc evaluated on the device.
#include <cmath>
#include <cstdint>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/dropout.h"

namespace tensor {
namespace cuda {
namespace {

// Philox4x32-10 (key, counter_hi = 0, counter_lo = counter), as
// tensor::Philox4x32: words w[0..3].
__device__ __forceinline__ void Philox(uint64_t key, uint64_t counter, uint32_t w[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

template <typename T>
__global__ void DropoutKernel(const T* in, T* out, int64_t n, uint64_t seed, uint64_t offset,
                              uint32_t threshold, float scale) {
  const int64_t counters = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < counters;
       j += int64_t{gridDim.x} * blockDim.x) {
    uint32_t w[4];
    Philox(seed, offset + static_cast<uint64_t>(j), w);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = 4 * j + k;
      if (i < n) {
        const bool keep = (w[k] >> 8) >= threshold;
        out[i] = FromF<T>(keep ? __fmul_rn(ToF(in[i]), scale) : 0.0f);
      }
    }
  }
}

}  // namespace

void DropoutApply(const char* op, const Tensor& in, const Tensor& out, float p, uint64_t seed,
                  uint64_t offset) {
  const int64_t n = in.numel();
  if (n == 0) return;
  SetDevice(in, op);
  // As tensor/ops/dropout.cc: Threshold(p) and the float scale.
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  DispatchFloat(in.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    DropoutKernel<T><<<Blocks((n + 3) / 4), kThreads, 0, ComputeStream()>>>(
        Ptr<T>(in), Ptr<T>(out), n, seed, offset, threshold, scale);
  });
  CheckLaunch(op);
}

}  // namespace cuda
}  // namespace tensor
