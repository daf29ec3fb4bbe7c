// CUDA dropout: one thread per Philox counter (4 elements), the generator of
// tensor/random.cc evaluated on the device.
#include <cmath>
#include <cstdint>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/dropout.h"
#include "tensor/cuda/philox.cuh"

namespace tensor {
namespace cuda {
namespace {

// out[i] = in[i] * mask / (1 - p), plus res[i] when res is given (the sum in
// float, rounded once to R).
template <typename X, typename R>
__global__ void DropoutKernel(const X* in, const R* res, R* out, int64_t n, uint64_t seed,
                              uint64_t offset, uint32_t threshold, float scale) {
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
        const float kept = keep ? __fmul_rn(ToF(in[i]), scale) : 0.0f;
        out[i] = FromF<R>(res != nullptr ? __fadd_rn(ToF(res[i]), kept) : kept);
      }
    }
  }
}

// out = in * mask / (1 - p), plus *res when given; out has res's dtype (in's
// without one). Threshold(p) and the float scale as tensor/ops/dropout.cc.
void Launch(const char* op, const Tensor& in, const Tensor* res, const Tensor& out, float p,
            uint64_t seed, uint64_t offset) {
  const int64_t n = in.numel();
  if (n == 0) return;
  SetDevice(in, op);
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  DispatchFloat(out.dtype(), op, [&](auto r_zero) {
    using R = decltype(r_zero);
    DispatchFloat(in.dtype(), op, [&](auto x_zero) {
      using X = decltype(x_zero);
      DropoutKernel<X, R><<<Blocks((n + 3) / 4), kThreads, 0, ComputeStream()>>>(
          Ptr<X>(in), res != nullptr ? Ptr<R>(*res) : nullptr, Ptr<R>(out), n, seed, offset,
          threshold, scale);
    });
  });
  CheckLaunch(op);
}

}  // namespace

void DropoutAddApply(const char* op, const Tensor& res, const Tensor& in, const Tensor& out,
                     float p, uint64_t seed, uint64_t offset) {
  Launch(op, in, &res, out, p, seed, offset);
}

void DropoutApply(const char* op, const Tensor& in, const Tensor& out, float p, uint64_t seed,
                  uint64_t offset) {
  Launch(op, in, nullptr, out, p, seed, offset);
}

}  // namespace cuda
}  // namespace tensor
