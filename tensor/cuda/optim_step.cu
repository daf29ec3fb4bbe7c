// CUDA kernels of the optimizers and of gradient clipping.
#include <vector>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/optim_step.h"

namespace tensor {
namespace cuda {
namespace {

void CheckF32(const char* op, const Tensor& t, const Tensor& like) {
  OP_CHECK(t.device() == like.device() && t.dtype() == Dtype::kF32 && t.is_contiguous() &&
               t.numel() == like.numel(),
           op, "tensors must be f32, contiguous, of ", like.numel(), " elements on ",
           like.device().ToString());
}

// Explicit _rn intrinsics: no FMA contraction, so every rounding is the one a
// separate multiply and add make.
template <bool kDecay>
__global__ void AdamWKernel(float* __restrict__ p, const float* __restrict__ g,
                            float* __restrict__ m, float* __restrict__ v, int64_t n,
                            AdamWScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float pi = p[i];
    if (kDecay) pi = __fmul_rn(pi, s.decay);
    const float gi = g[i];
    const float mi = __fadd_rn(__fmul_rn(m[i], s.beta1), __fmul_rn(s.one_minus_beta1, gi));
    const float vi =
        __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias_correction2_sqrt), s.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = __fadd_rn(pi, __fmul_rn(s.neg_step_size, __fdiv_rn(mi, denom)));
  }
}

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
__global__ void SgdKernel(float* __restrict__ p, const float* __restrict__ g,
                          float* __restrict__ buf, int64_t n, SgdScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float d = g[i];
    if (kDecay) d = __fadd_rn(d, __fmul_rn(s.weight_decay, p[i]));
    if (kMomentum) {
      const float b =
          kFirst ? d : __fadd_rn(__fmul_rn(buf[i], s.momentum), __fmul_rn(s.one_minus_dampening, d));
      buf[i] = b;
      d = kNesterov ? __fadd_rn(d, __fmul_rn(s.momentum, b)) : b;
    }
    p[i] = __fsub_rn(p[i], __fmul_rn(s.lr, d));
  }
}

template <bool kDecay, bool kMomentum>
void LaunchSgd(float* p, const float* g, float* buf, int64_t n, const SgdScalars& s,
               const SgdFlags& f) {
  const unsigned blocks = Blocks(n);
  if (!kMomentum) {
    SgdKernel<kDecay, false, false, false><<<blocks, kThreads, 0, ComputeStream()>>>(p, g, buf, n, s);
  } else if (f.first) {
    if (f.nesterov) {
      SgdKernel<kDecay, true, true, true><<<blocks, kThreads, 0, ComputeStream()>>>(p, g, buf, n, s);
    } else {
      SgdKernel<kDecay, true, true, false><<<blocks, kThreads, 0, ComputeStream()>>>(p, g, buf, n, s);
    }
  } else if (f.nesterov) {
    SgdKernel<kDecay, true, false, true><<<blocks, kThreads, 0, ComputeStream()>>>(p, g, buf, n, s);
  } else {
    SgdKernel<kDecay, true, false, false><<<blocks, kThreads, 0, ComputeStream()>>>(p, g, buf, n, s);
  }
}

constexpr int kSumBlock = 1 << 13;  // elements per partial sum (as the CPU's block)

// One block of kThreads threads per kSumBlock elements: its sum of squares.
__global__ void SumSquaresKernel(const float* __restrict__ g, int64_t n, float* partial) {
  __shared__ float warp_sums[kThreads / 32];
  const int64_t begin = int64_t{blockIdx.x} * kSumBlock;
  const int64_t end = begin + kSumBlock < n ? begin + kSumBlock : n;
  float acc = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc += g[i] * g[i];
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    partial[blockIdx.x] = total;
  }
}

__global__ void ScaleKernel(float* g, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    g[i] *= factor;
  }
}

// g *= factor; any result that is inf or NaN sets *found (every writer
// stores the same 1).
__global__ void ScaleCheckKernel(float* g, int64_t n, float factor, int* found) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = __fmul_rn(g[i], factor);
    g[i] = v;
    bad |= !(fabsf(v) <= 3.402823466e38f);  // inf or NaN
  }
  if (bad) *found = 1;
}

}  // namespace

void AdamWStep(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t begin,
               int64_t end, const AdamWScalars& s, bool decay) {
  const char* op = "adamw";
  CheckF32(op, p, p);
  CheckF32(op, g, p);
  CheckF32(op, m, p);
  CheckF32(op, v, p);
  OP_CHECK(0 <= begin && begin <= end && end <= p.numel(), op, "range [", begin, ", ", end,
           ") outside ", p.numel(), " elements");
  if (begin == end) return;
  SetDevice(p, op);
  const int64_t n = end - begin;
  float* pp = Ptr<float>(p) + begin;
  const float* gp = Ptr<float>(g) + begin;
  float* mp = Ptr<float>(m) + begin;
  float* vp = Ptr<float>(v) + begin;
  if (decay) {
    AdamWKernel<true><<<Blocks(n), kThreads, 0, ComputeStream()>>>(pp, gp, mp, vp, n, s);
  } else {
    AdamWKernel<false><<<Blocks(n), kThreads, 0, ComputeStream()>>>(pp, gp, mp, vp, n, s);
  }
  CheckLaunch(op);
}

void SgdStep(const Tensor& p, const Tensor& g, const Tensor& buf, int64_t begin, int64_t end,
             const SgdScalars& s, const SgdFlags& flags) {
  const char* op = "sgd";
  CheckF32(op, p, p);
  CheckF32(op, g, p);
  if (flags.momentum) CheckF32(op, buf, p);
  OP_CHECK(0 <= begin && begin <= end && end <= p.numel(), op, "range [", begin, ", ", end,
           ") outside ", p.numel(), " elements");
  if (begin == end) return;
  SetDevice(p, op);
  const int64_t n = end - begin;
  float* pp = Ptr<float>(p) + begin;
  const float* gp = Ptr<float>(g) + begin;
  float* bp = flags.momentum ? Ptr<float>(buf) + begin : nullptr;
  if (flags.decay) {
    flags.momentum ? LaunchSgd<true, true>(pp, gp, bp, n, s, flags)
                   : LaunchSgd<true, false>(pp, gp, bp, n, s, flags);
  } else {
    flags.momentum ? LaunchSgd<false, true>(pp, gp, bp, n, s, flags)
                   : LaunchSgd<false, false>(pp, gp, bp, n, s, flags);
  }
  CheckLaunch(op);
}

double GradSumSquares(const std::vector<Tensor>& grads) {
  const char* op = "grad_norm";
  if (grads.empty()) return 0.0;
  // Each tensor's blocks get a run of `partial`: [first[i], first[i + 1]).
  std::vector<int64_t> first(grads.size() + 1, 0);
  for (size_t i = 0; i < grads.size(); ++i) {
    CheckF32(op, grads[i], grads[i]);
    OP_CHECK(grads[i].device() == grads[0].device(), op, "gradients on ",
             grads[0].device().ToString(), " and ", grads[i].device().ToString());
    first[i + 1] = first[i] + (grads[i].numel() + kSumBlock - 1) / kSumBlock;
  }
  const int64_t blocks = first.back();
  if (blocks == 0) return 0.0;
  SetDevice(grads[0], op);
  Tensor partial = Tensor::Empty({blocks}, Dtype::kF32, grads[0].device());  // (blocks,)
  for (size_t i = 0; i < grads.size(); ++i) {
    if (first[i + 1] == first[i]) continue;
    SumSquaresKernel<<<static_cast<unsigned>(first[i + 1] - first[i]), kThreads, 0,
                       ComputeStream()>>>(Ptr<float>(grads[i]), grads[i].numel(),
                                          Ptr<float>(partial) + first[i]);
    CheckLaunch(op);
  }
  // The one wait: every tensor's block sums come back in one copy.
  std::vector<float> host(blocks);
  CheckCuda(cudaMemcpyAsync(host.data(), Ptr<float>(partial), blocks * sizeof(float),
                            cudaMemcpyDeviceToHost, ComputeStream()),
            op, "copy of the partial sums");
  CheckCuda(cudaStreamSynchronize(ComputeStream()), op, "synchronize");
  double total = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    double sum = 0.0;  // this tensor's blocks in order, then tensors in order
    for (int64_t b = first[i]; b < first[i + 1]; ++b) sum += host[b];
    total += sum;
  }
  return total;
}

bool ScaleGradsAndCheckNonFinite(const std::vector<Tensor>& grads, float factor) {
  const char* op = "unscale_grads";
  if (grads.empty()) return false;
  for (const Tensor& g : grads) {
    CheckF32(op, g, g);
    OP_CHECK(g.device() == grads[0].device(), op, "gradients on ", grads[0].device().ToString(),
             " and ", g.device().ToString());
  }
  SetDevice(grads[0], op);
  Tensor found = Tensor::Zeros({1}, Dtype::kI32, grads[0].device());  // (1,): a memset
  for (const Tensor& g : grads) {
    const int64_t n = g.numel();
    if (n == 0) continue;
    ScaleCheckKernel<<<Blocks(n), kThreads, 0, ComputeStream()>>>(Ptr<float>(g), n, factor,
                                                                   Ptr<int>(found));
    CheckLaunch(op);
  }
  // The one wait: the flag of every tensor.
  int host = 0;
  CheckCuda(cudaMemcpyAsync(&host, Ptr<int>(found), sizeof(int), cudaMemcpyDeviceToHost,
                            ComputeStream()),
            op, "copy of the flag");
  CheckCuda(cudaStreamSynchronize(ComputeStream()), op, "synchronize");
  return host != 0;
}

void ScaleGrad(const Tensor& g, float factor) {
  const char* op = "clip_grad";
  CheckF32(op, g, g);
  const int64_t n = g.numel();
  if (n == 0) return;
  SetDevice(g, op);
  ScaleKernel<<<Blocks(n), kThreads, 0, ComputeStream()>>>(Ptr<float>(g), n, factor);
  CheckLaunch(op);
}

}  // namespace cuda
}  // namespace tensor
