// CUDA kernels of the optimizers and of gradient clipping.
#include <algorithm>
#include <cstdint>
#include <type_traits>
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

// One element of an AdamW step, in registers. Explicit _rn intrinsics: no FMA
// contraction, so every rounding is the one a separate multiply and add make.
template <bool kDecay>
__device__ __forceinline__ void AdamWValue(float& p, float g, float& m, float& v,
                                           const AdamWScalars& s) {
  if (kDecay) p = __fmul_rn(p, s.decay);
  m = __fadd_rn(__fmul_rn(m, s.beta1), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fadd_rn(p, __fmul_rn(s.neg_step_size, __fdiv_rn(m, denom)));
}

// Element i of an AdamW step; with a low-precision copy (L bf16 or f16; void:
// none) the updated p also goes there, rounded to nearest even as a cast.
template <bool kDecay, typename L>
__device__ __forceinline__ void AdamWElement(float* __restrict__ p, const float* __restrict__ g,
                                             float* __restrict__ m, float* __restrict__ v,
                                             L* __restrict__ low, int64_t i,
                                             const AdamWScalars& s) {
  float pi = p[i], mi = m[i], vi = v[i];
  AdamWValue<kDecay>(pi, g[i], mi, vi, s);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  if constexpr (!std::is_void_v<L>) low[i] = FromF<L>(pi);
}

// Elements [i, i + 4) of an AdamW step as 16-byte accesses (LoadF / StoreF,
// the four loads issued together; i is where all four are 16-byte aligned,
// and the copy 8-byte aligned).
template <bool kDecay, typename L>
__device__ __forceinline__ void AdamWQuad(float* __restrict__ p, const float* __restrict__ g,
                                          float* __restrict__ m, float* __restrict__ v,
                                          L* __restrict__ low, int64_t i, const AdamWScalars& s) {
  float pq[4], gq[4], mq[4], vq[4];
  LoadF<4>(p + i, pq);
  LoadF<4>(g + i, gq);
  LoadF<4>(m + i, mq);
  LoadF<4>(v + i, vq);
#pragma unroll
  for (int k = 0; k < 4; ++k) AdamWValue<kDecay>(pq[k], gq[k], mq[k], vq[k], s);
  StoreF<4>(m + i, mq);
  StoreF<4>(v + i, vq);
  StoreF<4>(p + i, pq);
  if constexpr (!std::is_void_v<L>) StoreF<4>(low + i, pq);
}

// A type as a value (C++17 has no std::type_identity).
template <typename T>
struct TypeTag {
  using type = T;
};

// Up to kSegmentsPerLaunch segments of AdamWStepMany, passed by value (the
// launch's parameters, so no copy of pointers to the device: about 2.8 KiB of
// the 4 KiB a launch may carry). The segments of a launch all have a copy of
// one dtype, or none (low unused).
constexpr int kSegmentsPerLaunch = 32;
struct AdamWBatch {
  float* p[kSegmentsPerLaunch];
  const float* g[kSegmentsPerLaunch];
  float* m[kSegmentsPerLaunch];
  float* v[kSegmentsPerLaunch];
  void* low[kSegmentsPerLaunch];
  int64_t n[kSegmentsPerLaunch];
  AdamWScalars s[kSegmentsPerLaunch];
  int decay[kSegmentsPerLaunch];
};

// The segment's elements: one at a time up to where p is 16-byte aligned,
// then 4 at a time while g, m and v are aligned there too (they are when
// their buffers are, as the segments' offsets are the same in all four) and
// the copy is 8-byte aligned, the rest one at a time.
template <bool kDecay, typename L>
__device__ __forceinline__ void AdamWSegmentRun(float* p, const float* g, float* m, float* v,
                                                L* low, int64_t n, const AdamWScalars& s) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const auto misalign = [](const void* x, int bytes) {
    return reinterpret_cast<uintptr_t>(x) % bytes;
  };
  int64_t head = static_cast<int64_t>((16 - misalign(p, 16)) % 16 / sizeof(float));
  if (head > n) head = n;
  bool vec = misalign(p + head, 16) == 0 && misalign(g + head, 16) == 0 &&
             misalign(m + head, 16) == 0 && misalign(v + head, 16) == 0;
  if constexpr (!std::is_void_v<L>) vec = vec && misalign(low + head, 4 * sizeof(L)) == 0;
  const int64_t quads = vec ? (n - head) / 4 : 0;
  for (int64_t i = first; i < head; i += stride) AdamWElement<kDecay>(p, g, m, v, low, i, s);
  for (int64_t q = first; q < quads; q += stride) {
    AdamWQuad<kDecay>(p, g, m, v, low, head + 4 * q, s);
  }
  for (int64_t i = head + 4 * quads + first; i < n; i += stride) {
    AdamWElement<kDecay>(p, g, m, v, low, i, s);
  }
}

// blockIdx.y picks the segment; its blocks stride over it. L: the copies'
// element type (void: none).
template <typename L>
__global__ void AdamWBatchKernel(AdamWBatch b) {
  const int k = blockIdx.y;
  L* low = static_cast<L*>(b.low[k]);
  if (b.decay[k]) {
    AdamWSegmentRun<true>(b.p[k], b.g[k], b.m[k], b.v[k], low, b.n[k], b.s[k]);
  } else {
    AdamWSegmentRun<false>(b.p[k], b.g[k], b.m[k], b.v[k], low, b.n[k], b.s[k]);
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
constexpr int kScaleChunk = 1 << 13;  // elements per block of the scaling kernels

// Up to kTensorsPerLaunch f32 tensors cut into chunks of `chunk` elements,
// passed by value (about 1.6 KiB of launch parameters): block c of a launch
// works on the chunk of tensor k with first_chunk[k] <= c < first_chunk[k + 1].
constexpr int kTensorsPerLaunch = 64;
struct TensorChunks {
  float* data[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
  int64_t first_chunk[kTensorsPerLaunch + 1];
  int count;
};

// The tensor of chunk c (binary search over first_chunk), and where the
// chunk starts in it.
__device__ __forceinline__ int ChunkTensor(const TensorChunks& t, int64_t c, int64_t chunk,
                                           int64_t* begin) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.first_chunk[mid] <= c) lo = mid; else hi = mid - 1;
  }
  *begin = (c - t.first_chunk[lo]) * chunk;
  return lo;
}

// One block of kThreads threads per kSumBlock elements: its sum of squares,
// written to partial[blockIdx.x].
__global__ void SumSquaresKernel(TensorChunks t, float* partial) {
  __shared__ float warp_sums[kThreads / 32];
  int64_t begin = 0;
  const int k = ChunkTensor(t, blockIdx.x, kSumBlock, &begin);
  const float* g = t.data[k];
  const int64_t end = begin + kSumBlock < t.n[k] ? begin + kSumBlock : t.n[k];
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

// g *= factor over a chunk; with `found`, any result that is inf or NaN sets
// *found (every writer stores the same 1).
__global__ void ScaleKernel(TensorChunks t, float factor, int* found) {
  int64_t begin = 0;
  const int k = ChunkTensor(t, blockIdx.x, kScaleChunk, &begin);
  float* g = t.data[k];
  const int64_t end = begin + kScaleChunk < t.n[k] ? begin + kScaleChunk : t.n[k];
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = __fmul_rn(g[i], factor);
    g[i] = v;
    bad |= !(fabsf(v) <= 3.402823466e38f);  // inf or NaN
  }
  if (bad && found != nullptr) *found = 1;
}

// Calls launch(chunks, blocks, first_block) for groups of at most
// kTensorsPerLaunch of `tensors` (f32, contiguous, one device, checked by
// the caller), cut into chunks of `chunk` elements; empty tensors are skipped.
// first_block: the group's first chunk among all of them.
template <typename Launch>
void ForEachChunkBatch(const std::vector<Tensor>& tensors, int64_t chunk, Launch&& launch) {
  TensorChunks batch;
  batch.count = 0;
  batch.first_chunk[0] = 0;
  int64_t done = 0;  // chunks of earlier groups
  auto flush = [&] {
    if (batch.count == 0) return;
    const int64_t blocks = batch.first_chunk[batch.count];
    launch(batch, blocks, done);
    done += blocks;
    batch.count = 0;
  };
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel();
    if (n == 0) continue;
    const int64_t chunks = (n + chunk - 1) / chunk;
    // A launch's grid.x holds at most 2^31 - 1 blocks.
    if (batch.count == kTensorsPerLaunch ||
        batch.first_chunk[batch.count] + chunks > int64_t{0x7fffffff}) {
      flush();
    }
    batch.data[batch.count] = Ptr<float>(t);
    batch.n[batch.count] = n;
    batch.first_chunk[batch.count + 1] = batch.first_chunk[batch.count] + chunks;
    ++batch.count;
  }
  flush();
}

void CheckSameDevice(const char* op, const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    CheckF32(op, t, t);
    OP_CHECK(t.device() == tensors[0].device(), op, "gradients on ",
             tensors[0].device().ToString(), " and ", t.device().ToString());
  }
}

}  // namespace

void AdamWStep(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t begin,
               int64_t end, const AdamWScalars& s, bool decay) {
  AdamWStepMany({AdamWSegment{p, g, m, v, begin, end, s, decay}});
}

void AdamWStepMany(const std::vector<AdamWSegment>& segments) {
  const char* op = "adamw";
  if (segments.empty()) return;
  const Tensor& first = segments[0].p;
  for (const AdamWSegment& seg : segments) {
    CheckF32(op, seg.p, seg.p);
    CheckF32(op, seg.g, seg.p);
    CheckF32(op, seg.m, seg.p);
    CheckF32(op, seg.v, seg.p);
    OP_CHECK(seg.p.device() == first.device(), op, "parameters on ", first.device().ToString(),
             " and ", seg.p.device().ToString());
    OP_CHECK(0 <= seg.begin && seg.begin <= seg.end && seg.end <= seg.p.numel(), op, "range [",
             seg.begin, ", ", seg.end, ") outside ", seg.p.numel(), " elements");
    if (seg.low.defined()) {
      OP_CHECK((seg.low.dtype() == Dtype::kBF16 || seg.low.dtype() == Dtype::kF16) &&
                   seg.low.is_contiguous() && seg.low.numel() == seg.p.numel() &&
                   seg.low.device() == seg.p.device(),
               op, "the low-precision copy must be bf16 or f16, contiguous, of ", seg.p.numel(),
               " elements on ", seg.p.device().ToString(), ", got ", DtypeName(seg.low.dtype()),
               " of ", seg.low.numel(), " elements on ", seg.low.device().ToString());
    }
  }
  SetDevice(first, op);
  // One series of launches per kind of copy (none, bf16, f16): a launch's
  // kernel is compiled for one.
  auto run = [&](auto low_type, auto wanted) {
    using L = typename decltype(low_type)::type;
    AdamWBatch batch;
    int count = 0;
    int64_t longest = 0;
    auto launch = [&] {
      // Enough blocks for the longest segment, at most 1024 (they stride).
      const unsigned x = std::min<unsigned>(Blocks((longest + 3) / 4), 1024);
      AdamWBatchKernel<L>
          <<<dim3(x, static_cast<unsigned>(count)), kThreads, 0, ComputeStream()>>>(batch);
      CheckLaunch(op);
      count = 0;
      longest = 0;
    };
    for (const AdamWSegment& seg : segments) {
      if (seg.begin == seg.end || !wanted(seg)) continue;
      batch.p[count] = Ptr<float>(seg.p) + seg.begin;
      batch.g[count] = Ptr<float>(seg.g) + seg.begin;
      batch.m[count] = Ptr<float>(seg.m) + seg.begin;
      batch.v[count] = Ptr<float>(seg.v) + seg.begin;
      batch.low[count] = nullptr;
      if constexpr (!std::is_void_v<L>) batch.low[count] = Ptr<L>(seg.low) + seg.begin;
      batch.n[count] = seg.end - seg.begin;
      batch.s[count] = seg.s;
      batch.decay[count] = seg.decay ? 1 : 0;
      longest = std::max(longest, seg.end - seg.begin);
      if (++count == kSegmentsPerLaunch) launch();
    }
    if (count > 0) launch();
  };
  auto low_is = [](Dtype d) {
    return [d](const AdamWSegment& seg) { return seg.low.defined() && seg.low.dtype() == d; };
  };
  run(TypeTag<void>{}, [](const AdamWSegment& seg) { return !seg.low.defined(); });
  run(TypeTag<__nv_bfloat16>{}, low_is(Dtype::kBF16));
  run(TypeTag<__half>{}, low_is(Dtype::kF16));
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
  CheckSameDevice(op, grads);
  // Each tensor's blocks get a run of `partial`: [first[i], first[i + 1]).
  std::vector<int64_t> first(grads.size() + 1, 0);
  for (size_t i = 0; i < grads.size(); ++i) {
    first[i + 1] = first[i] + (grads[i].numel() + kSumBlock - 1) / kSumBlock;
  }
  const int64_t blocks = first.back();
  if (blocks == 0) return 0.0;
  SetDevice(grads[0], op);
  Tensor partial = Tensor::Empty({blocks}, Dtype::kF32, grads[0].device());  // (blocks,)
  ForEachChunkBatch(grads, kSumBlock, [&](const TensorChunks& batch, int64_t n, int64_t at) {
    SumSquaresKernel<<<static_cast<unsigned>(n), kThreads, 0, ComputeStream()>>>(
        batch, Ptr<float>(partial) + at);
    CheckLaunch(op);
  });
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

void ScaleGrads(const std::vector<Tensor>& grads, float factor) {
  const char* op = "clip_grad";
  if (grads.empty()) return;
  CheckSameDevice(op, grads);
  SetDevice(grads[0], op);
  ForEachChunkBatch(grads, kScaleChunk, [&](const TensorChunks& batch, int64_t n, int64_t) {
    ScaleKernel<<<static_cast<unsigned>(n), kThreads, 0, ComputeStream()>>>(batch, factor,
                                                                            nullptr);
    CheckLaunch(op);
  });
}

bool ScaleGradsAndCheckNonFinite(const std::vector<Tensor>& grads, float factor) {
  const char* op = "unscale_grads";
  if (grads.empty()) return false;
  CheckSameDevice(op, grads);
  SetDevice(grads[0], op);
  Tensor found = Tensor::Zeros({1}, Dtype::kI32, grads[0].device());  // (1,): a memset
  ForEachChunkBatch(grads, kScaleChunk, [&](const TensorChunks& batch, int64_t n, int64_t) {
    ScaleKernel<<<static_cast<unsigned>(n), kThreads, 0, ComputeStream()>>>(batch, factor,
                                                                            Ptr<int>(found));
    CheckLaunch(op);
  });
  // The one wait: the flag of every tensor.
  int host = 0;
  CheckCuda(cudaMemcpyAsync(&host, Ptr<int>(found), sizeof(int), cudaMemcpyDeviceToHost,
                            ComputeStream()),
            op, "copy of the flag");
  CheckCuda(cudaStreamSynchronize(ComputeStream()), op, "synchronize");
  return host != 0;
}

}  // namespace cuda
}  // namespace tensor
