// CUDA kernels of the unfused attention baseline (attention.h): the row
// softmax over materialized (B, H, T_q, T_k) scores and its backward, for
// benchmarks and tests of the fused kernels (attention.cu).
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/common.cuh"

namespace tensor {
namespace cuda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------
// Unfused baseline: row softmax over materialized scores, and its backward.
// A CTA of 256 threads per row.
// ---------------------------------------------------------------------------

__device__ float BlockReduce(float x, bool is_max, float* scratch) {
  x = is_max ? WarpAllMax(x) : WarpAllSum(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n = blockDim.x / 32;
  __syncthreads();  // scratch is free
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float r = is_max ? -kInf : 0.0f;
  for (int i = 0; i < n; ++i) r = is_max ? fmaxf(r, scratch[i]) : r + scratch[i];
  return r;
}

template <typename P>
__global__ void SoftmaxKernel(const float* scores, P* probs, int t_q, int t_k, float scale_log2,
                              bool causal) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int i = static_cast<int>(row % t_q);
  const int limit = causal ? min(t_k, i + (t_k - t_q) + 1) : t_k;  // keys < limit
  const float* s = scores + row * t_k;
  P* p = probs + row * t_k;
  float mx = -kInf;
  for (int j = threadIdx.x; j < limit; j += blockDim.x) mx = fmaxf(mx, s[j] * scale_log2);
  mx = BlockReduce(mx, true, scratch);
  const float m_use = mx == -kInf ? 0.0f : mx;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < limit; j += blockDim.x) sum += exp2f(s[j] * scale_log2 - m_use);
  sum = BlockReduce(sum, false, scratch);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int j = threadIdx.x; j < t_k; j += blockDim.x) {
    p[j] = FromF<P>(j < limit ? exp2f(s[j] * scale_log2 - m_use) * inv : 0.0f);
  }
}

template <typename P, typename G>
__global__ void SoftmaxBackwardKernel(const float* dprobs, const P* probs, G* dscores, int t_k,
                                      float scale) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float* dp = dprobs + row * t_k;
  const P* p = probs + row * t_k;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < t_k; j += blockDim.x) dot = fmaf(ToF(p[j]), dp[j], dot);
  dot = BlockReduce(dot, false, scratch);
  G* ds = dscores + row * t_k;
  for (int j = threadIdx.x; j < t_k; j += blockDim.x) {
    ds[j] = FromF<G>(scale * ToF(p[j]) * (dp[j] - dot));
  }
}

}  // namespace

void UnfusedAttentionSoftmax(const Tensor& scores, float scale, bool causal, const Tensor& probs) {
  constexpr char kSm[] = "unfused_attention_softmax";
  OP_CHECK(scores.rank() == 4 && scores.dtype() == Dtype::kF32 && scores.is_contiguous() &&
               scores.device().is_cuda() && probs.shape() == scores.shape() &&
               probs.is_contiguous() && probs.device() == scores.device(),
           kSm, "scores must be contiguous f32 (B, H, T_q, T_k) on CUDA and probs alike; got ",
           scores.shape().ToString(), " ", DtypeName(scores.dtype()), " and ",
           probs.shape().ToString(), " ", DtypeName(probs.dtype()));
  SetDevice(scores, kSm);
  const int64_t rows = scores.numel() / std::max<int64_t>(scores.dim(3), 1);
  if (rows == 0 || scores.dim(3) == 0) return;
  DispatchFloat(probs.dtype(), kSm, [&](auto zero) {
    using P = decltype(zero);
    SoftmaxKernel<P><<<static_cast<unsigned>(rows), 256, 0, ComputeStream()>>>(
        scores.data<float>(), Ptr<P>(probs), static_cast<int>(scores.dim(2)),
        static_cast<int>(scores.dim(3)), scale * kLog2e, causal);
  });
  CheckLaunch(kSm);
}

void UnfusedAttentionSoftmaxBackward(const Tensor& dprobs, const Tensor& probs, float scale,
                                     const Tensor& dscores) {
  constexpr char kSm[] = "unfused_attention_softmax_backward";
  OP_CHECK(dprobs.rank() == 4 && dprobs.dtype() == Dtype::kF32 && dprobs.is_contiguous() &&
               dprobs.device().is_cuda() && probs.shape() == dprobs.shape() &&
               probs.is_contiguous() && probs.device() == dprobs.device() &&
               dscores.shape() == dprobs.shape() && dscores.is_contiguous() &&
               dscores.device() == dprobs.device(),
           kSm, "dprobs must be contiguous f32 (B, H, T_q, T_k) on CUDA and probs, dscores alike");
  SetDevice(dprobs, kSm);
  const int64_t t_k = dprobs.dim(3);
  const int64_t rows = t_k == 0 ? 0 : dprobs.numel() / t_k;
  if (rows == 0) return;
  DispatchFloat(probs.dtype(), kSm, [&](auto pz) {
    using P = decltype(pz);
    DispatchFloat(dscores.dtype(), kSm, [&](auto gz) {
      using G = decltype(gz);
      SoftmaxBackwardKernel<P, G><<<static_cast<unsigned>(rows), 256, 0, ComputeStream()>>>(
          dprobs.data<float>(), Ptr<P>(probs), Ptr<G>(dscores), static_cast<int>(t_k), scale);
    });
  });
  CheckLaunch(kSm);
}

}  // namespace cuda
}  // namespace tensor
