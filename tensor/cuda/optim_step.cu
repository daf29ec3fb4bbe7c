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

__device__ __forceinline__ bool Aligned(const void* x, int bytes) {
  return reinterpret_cast<uintptr_t>(x) % bytes == 0;
}

// Whether a low-precision copy (L: its element type; void: none) takes a
// 4-element store at element i.
template <typename L>
__device__ __forceinline__ bool CopyAligned(L* low, int64_t i) {
  if constexpr (std::is_void_v<L>) {
    return true;
  } else {
    return Aligned(low + i, 4 * sizeof(L));
  }
}

// An optimizer segment's n elements over the block's threads (striding over
// the grid): one(i) up to where p is 16-byte aligned, then quad(i) for 4
// elements at a time while aligned_at(head) says the other operands are
// aligned there too (they are when their buffers are, as the segments'
// offsets are the same in all), one(i) for the rest.
template <typename AlignedAt, typename One, typename Quad>
__device__ __forceinline__ void SegmentElements(const float* p, int64_t n,
                                                const AlignedAt& aligned_at, const One& one,
                                                const Quad& quad) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / 4);
  if (head > n) head = n;
  const int64_t quads = Aligned(p + head, 16) && aligned_at(head) ? (n - head) / 4 : 0;
  for (int64_t i = first; i < head; i += stride) one(i);
  for (int64_t q = first; q < quads; q += stride) quad(head + 4 * q);
  for (int64_t i = head + 4 * quads + first; i < n; i += stride) one(i);
}

// An AdamW segment's elements (SegmentElements).
template <bool kDecay, typename L>
__device__ __forceinline__ void AdamWSegmentRun(float* p, const float* g, float* m, float* v,
                                                L* low, int64_t n, const AdamWScalars& s) {
  SegmentElements(
      p, n,
      [&](int64_t h) {
        return Aligned(g + h, 16) && Aligned(m + h, 16) && Aligned(v + h, 16) &&
               CopyAligned(low, h);
      },
      [&](int64_t i) { AdamWElement<kDecay>(p, g, m, v, low, i, s); },
      [&](int64_t i) { AdamWQuad<kDecay>(p, g, m, v, low, i, s); });
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

// One element of an SGD step, in registers (torch.optim.SGD's order, each
// operation rounded once as the CPU's); b: the momentum buffer's element.
__device__ __forceinline__ void SgdValue(float& p, float g, float& b, const SgdScalars& s,
                                         const SgdFlags& f) {
  float d = g;
  if (f.decay) d = __fadd_rn(d, __fmul_rn(s.weight_decay, p));
  if (f.momentum) {
    b = f.first ? d : __fadd_rn(__fmul_rn(b, s.momentum), __fmul_rn(s.one_minus_dampening, d));
    d = f.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, b)) : b;
  }
  p = __fsub_rn(p, __fmul_rn(s.lr, d));
}

// Up to kSegmentsPerLaunch segments of SgdStepMany (as AdamWBatch); buf
// null for segments without momentum.
struct SgdBatch {
  float* p[kSegmentsPerLaunch];
  const float* g[kSegmentsPerLaunch];
  float* buf[kSegmentsPerLaunch];
  void* low[kSegmentsPerLaunch];
  int64_t n[kSegmentsPerLaunch];
  SgdScalars s[kSegmentsPerLaunch];
  SgdFlags flags[kSegmentsPerLaunch];
};

// blockIdx.y picks the segment; its blocks stride over it (SegmentElements:
// 4 elements at a time where p, g, buf and the copy (L: its element type,
// void: none) are aligned). The flags are the same in a whole block (no
// divergence).
template <typename L>
__global__ void SgdBatchKernel(SgdBatch batch) {
  const int k = blockIdx.y;
  float* p = batch.p[k];
  const float* g = batch.g[k];
  float* buf = batch.buf[k];
  L* low = static_cast<L*>(batch.low[k]);
  const SgdScalars s = batch.s[k];
  const SgdFlags f = batch.flags[k];
  SegmentElements(
      p, batch.n[k],
      [&](int64_t h) {
        return Aligned(g + h, 16) && (!f.momentum || Aligned(buf + h, 16)) && CopyAligned(low, h);
      },
      [&](int64_t i) {
        float pi = p[i], bi = f.momentum ? buf[i] : 0.0f;
        SgdValue(pi, g[i], bi, s, f);
        if (f.momentum) buf[i] = bi;
        p[i] = pi;
        if constexpr (!std::is_void_v<L>) low[i] = FromF<L>(pi);
      },
      [&](int64_t i) {
        float pq[4], gq[4], bq[4] = {};
        LoadF<4>(p + i, pq);
        LoadF<4>(g + i, gq);
        if (f.momentum) LoadF<4>(buf + i, bq);
#pragma unroll
        for (int e = 0; e < 4; ++e) SgdValue(pq[e], gq[e], bq[e], s, f);
        if (f.momentum) StoreF<4>(buf + i, bq);
        StoreF<4>(p + i, pq);
        if constexpr (!std::is_void_v<L>) StoreF<4>(low + i, pq);
      });
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

namespace {

// The checks every optimizer segment gets: p f32, contiguous, on `first`'s
// device, the range inside it, the low-precision copy (if any) bf16 or f16,
// contiguous, of p's size and device.
template <typename Segment>
void CheckSegment(const char* op, const Segment& seg, const Tensor& first) {
  CheckF32(op, seg.p, seg.p);
  CheckF32(op, seg.g, seg.p);
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

// The non-empty segments in launches of kSegmentsPerLaunch, one series per
// kind of copy (none, bf16, f16), as a launch's kernel is compiled for one:
// fill(batch, slot, segment, low) puts a segment in a slot (low: its copy at
// the segment's start, or null); launch(TypeTag<L>, batch, count, blocks)
// launches the kernel for copies of type L (void: none) with `blocks` blocks
// a segment (enough for the longest, 4 elements a thread, at most 1024: they
// stride).
template <typename Batch, typename Segment, typename Fill, typename Launch>
void LaunchBatches(const std::vector<Segment>& segments, const Fill& fill, const Launch& launch) {
  auto series = [&](auto low_type, auto wanted) {
    using L = typename decltype(low_type)::type;
    Batch batch;
    int count = 0;
    int64_t longest = 0;
    auto flush = [&] {
      launch(low_type, batch, count, std::min<unsigned>(Blocks((longest + 3) / 4), 1024));
      count = 0;
      longest = 0;
    };
    for (const Segment& seg : segments) {
      if (seg.begin == seg.end || !wanted(seg)) continue;
      void* low = nullptr;
      if constexpr (!std::is_void_v<L>) low = Ptr<L>(seg.low) + seg.begin;
      fill(batch, count, seg, low);
      longest = std::max(longest, seg.end - seg.begin);
      if (++count == kSegmentsPerLaunch) flush();
    }
    if (count > 0) flush();
  };
  auto low_is = [](Dtype d) {
    return [d](const Segment& seg) { return seg.low.defined() && seg.low.dtype() == d; };
  };
  series(TypeTag<void>{}, [](const Segment& seg) { return !seg.low.defined(); });
  series(TypeTag<__nv_bfloat16>{}, low_is(Dtype::kBF16));
  series(TypeTag<__half>{}, low_is(Dtype::kF16));
}

}  // namespace

void AdamWStepMany(const std::vector<AdamWSegment>& segments) {
  const char* op = "adamw";
  if (segments.empty()) return;
  const Tensor& first = segments[0].p;
  for (const AdamWSegment& seg : segments) {
    CheckSegment(op, seg, first);
    CheckF32(op, seg.m, seg.p);
    CheckF32(op, seg.v, seg.p);
  }
  SetDevice(first, op);
  LaunchBatches<AdamWBatch>(
      segments,
      [](AdamWBatch& batch, int k, const AdamWSegment& seg, void* low) {
        batch.p[k] = Ptr<float>(seg.p) + seg.begin;
        batch.g[k] = Ptr<float>(seg.g) + seg.begin;
        batch.m[k] = Ptr<float>(seg.m) + seg.begin;
        batch.v[k] = Ptr<float>(seg.v) + seg.begin;
        batch.low[k] = low;
        batch.n[k] = seg.end - seg.begin;
        batch.s[k] = seg.s;
        batch.decay[k] = seg.decay ? 1 : 0;
      },
      [&](auto low_type, const AdamWBatch& batch, int count, unsigned blocks) {
        using L = typename decltype(low_type)::type;
        AdamWBatchKernel<L>
            <<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, ComputeStream()>>>(batch);
        CheckLaunch(op);
      });
}

void SgdStepMany(const std::vector<SgdSegment>& segments) {
  const char* op = "sgd";
  if (segments.empty()) return;
  const Tensor& first = segments[0].p;
  for (const SgdSegment& seg : segments) {
    CheckSegment(op, seg, first);
    if (seg.flags.momentum) CheckF32(op, seg.buf, seg.p);
  }
  SetDevice(first, op);
  LaunchBatches<SgdBatch>(
      segments,
      [](SgdBatch& batch, int k, const SgdSegment& seg, void* low) {
        batch.p[k] = Ptr<float>(seg.p) + seg.begin;
        batch.g[k] = Ptr<float>(seg.g) + seg.begin;
        batch.buf[k] = seg.flags.momentum ? Ptr<float>(seg.buf) + seg.begin : nullptr;
        batch.low[k] = low;
        batch.n[k] = seg.end - seg.begin;
        batch.s[k] = seg.s;
        batch.flags[k] = seg.flags;
      },
      [&](auto low_type, const SgdBatch& batch, int count, unsigned blocks) {
        using L = typename decltype(low_type)::type;
        SgdBatchKernel<L>
            <<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, ComputeStream()>>>(batch);
        CheckLaunch(op);
      });
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
  WaitForComputeStream(op, "synchronize");
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
  WaitForComputeStream(op, "synchronize");
  return host != 0;
}

}  // namespace cuda
}  // namespace tensor
