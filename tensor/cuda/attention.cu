// CUDA: the fused attention's host side (see attention.h for the design):
// argument checks, the argument block, the launches of the kernel families
// (attention_mma.cu, attention_float.cu), the softmax backward's delta and
// the key padding mask as bytes. The unfused baseline's softmax is in
// attention_unfused.cu.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/attention_cudnn.h"
#include "tensor/cuda/attention_internal.cuh"
#include "tensor/cuda/rows.cuh"

namespace tensor {
namespace cuda {
namespace {

using flash::Args;

constexpr char kOp[] = "flash_attention";

flash::Strides StridesOf(const Tensor& x) {
  return {x.strides()[0], x.strides()[1], x.strides()[2]};
}

// delta[row] = sum_d grad_out[row, d] * out[row, d]: a warp per row.
template <typename T>
__global__ void DeltaKernel(const Args a, int d, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += warps) {
    const int64_t bh = row / a.t_q, i = row % a.t_q, b = bh / a.heads, h = bh % a.heads;
    const T* o = static_cast<const T*>(a.out) + b * a.sy.b + h * a.sy.h + i * a.sy.t;
    const T* dout = static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h + i * a.sdo.t;
    float s = 0.0f;
    for (int c = lane; c < d; c += 32) s = fmaf(ToF(o[c]), ToF(dout[c]), s);
    s = WarpAllSum(s);
    if (lane == 0) a.delta[row] = s;
  }
}

// The same with 16-byte loads: kLanes lanes per row (d = kLanes * 16 /
// sizeof(T)), 32 / kLanes rows per warp. For rows of out and grad_out that
// start 16-byte aligned (AlignedRows); on the H200 the warp per row took 52
// us for gpt2's (16, 12, 1024, 64), 2-byte loads from every lane.
template <typename T, int kLanes>
__global__ void DeltaVecKernel(const Args a, int64_t rows) {
  constexpr int kVec = 16 / sizeof(T), kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32, part = lane % kLanes;
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  // The whole warp iterates together (its shuffles need every lane).
  for (int64_t first = warp * kRowsPerWarp; first < rows; first += warps * kRowsPerWarp) {
    const int64_t row = first + lane / kLanes;
    float s = 0.0f;
    if (row < rows) {
      const int64_t bh = row / a.t_q, i = row % a.t_q, b = bh / a.heads, h = bh % a.heads;
      const T* o = static_cast<const T*>(a.out) + b * a.sy.b + h * a.sy.h + i * a.sy.t;
      const T* dout =
          static_cast<const T*>(a.grad_out) + b * a.sdo.b + h * a.sdo.h + i * a.sdo.t;
      float ov[kVec], dv[kVec];
      rows::LoadF<kVec>(o + part * kVec, ov);
      rows::LoadF<kVec>(dout + part * kVec, dv);
#pragma unroll
      for (int k = 0; k < kVec; ++k) s = fmaf(ov[k], dv[k], s);
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      s += __shfl_xor_sync(0xffffffffu, s, offset);  // the row's lanes
    }
    if (row < rows && part == 0) a.delta[row] = s;
  }
}

// Whether every (B, H, T, D) row of t starts 16-byte aligned (the start and
// the B, H, T strides in bytes): the rows the delta kernel and the tensor-core
// kernels' cp.async copies read as 16-byte vectors.
bool AlignedRows(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.strides()[i] * DtypeSize(t.dtype()) % 16 != 0) return false;
  }
  return true;
}

// delta = rowsum(grad_out * out) for the backward: DeltaVecKernel where the
// rows allow it (head sizes 32 to 128 of any floating dtype), else a warp per
// row.
void LaunchDelta(const Args& a, const Tensor& out, const Tensor& grad_out, int64_t d,
                 int64_t rows) {
  DispatchFloat(out.dtype(), kOp, [&](auto zero) {
    using T = decltype(zero);
    constexpr int64_t kVec = 16 / sizeof(T);
    const int64_t lanes = d % kVec == 0 ? d / kVec : 0;
    const bool vec = AlignedRows(out) && AlignedRows(grad_out) &&
                     (lanes == 4 || lanes == 8 || lanes == 16 || lanes == 32);
    if (!vec) {
      DeltaKernel<T>
          <<<Blocks(rows * 32), kThreads, 0, ComputeStream()>>>(a, static_cast<int>(d), rows);
    } else {
      const int64_t threads = rows * lanes;
      switch (lanes) {
        case 4:
          DeltaVecKernel<T, 4><<<Blocks(threads), kThreads, 0, ComputeStream()>>>(a, rows);
          break;
        case 8:
          DeltaVecKernel<T, 8><<<Blocks(threads), kThreads, 0, ComputeStream()>>>(a, rows);
          break;
        case 16:
          DeltaVecKernel<T, 16><<<Blocks(threads), kThreads, 0, ComputeStream()>>>(a, rows);
          break;
        default:
          DeltaVecKernel<T, 32><<<Blocks(threads), kThreads, 0, ComputeStream()>>>(a, rows);
          break;
      }
    }
    CheckLaunch(kOp);
  });
}

// dq[row, :] = T(scale * accum[row, :]) (the atomic-dq backward's last step):
// a warp per (b, h, query) row, accum contiguous (B, H, T_q, D), dq strided.
template <typename T>
__global__ void DqFromAccumKernel(const Args a, int d, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += warps) {
    const int64_t bh = row / a.t_q, i = row % a.t_q, b = bh / a.heads, h = bh % a.heads;
    const float* acc = a.dq_accum + row * d;
    T* dq = static_cast<T*>(a.dq) + b * a.sdq.b + h * a.sdq.h + i * a.sdq.t;
    for (int c = lane; c < d; c += 32) dq[c] = FromF<T>(acc[c] * a.scale);
  }
}

// The switches: the environment read once, at their first use.
std::atomic<bool>& AtomicDqFlag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_ATTENTION_DQ", "atomic")};
  return flag;
}
std::atomic<bool>& NarrowDkDvFlag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_ATTENTION_DKDV", "narrow")};
  return flag;
}
std::atomic<bool>& CudnnFlag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_ATTENTION", "cudnn")};
  return flag;
}
std::atomic<bool>& NarrowDqFlag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_ATTENTION_DQ", "narrow")};
  return flag;
}

void CheckOnDevice(const Tensor& ref, const Tensor& t, const char* name) {
  OP_CHECK(t.defined() && t.device() == ref.device(), kOp, name, " must be on ",
           ref.device().ToString(), " with q");
}

void CheckOutput(const Tensor& ref, const Tensor& t, const char* name, const Shape& shape,
                 Dtype dtype) {
  CheckOnDevice(ref, t, name);
  OP_CHECK(t.shape() == shape && t.dtype() == dtype && t.is_contiguous(), kOp, name, " must be a ",
           "contiguous ", shape.ToString(), " ", DtypeName(dtype), " tensor; got ",
           t.shape().ToString(), " ", DtypeName(t.dtype()),
           t.is_contiguous() ? "" : " (not contiguous)");
}

// A (B, H, T, D) output the kernels write through its strides: unit stride in
// D, and for 2-byte dtypes rows that start 4-byte aligned (the tensor-core
// kernels store element pairs), e.g. heads viewed into a (B, T, H, D) buffer.
void CheckStridedOutput(const Tensor& ref, const Tensor& t, const char* name, const Shape& shape,
                        Dtype dtype) {
  CheckOnDevice(ref, t, name);
  OP_CHECK(t.shape() == shape && t.dtype() == dtype && t.rank() == 4, kOp, name, " must be a ",
           shape.ToString(), " ", DtypeName(dtype), " tensor; got ", t.shape().ToString(), " ",
           DtypeName(t.dtype()));
  const bool pairs_aligned = DtypeSize(dtype) >= 4 ||
                             (reinterpret_cast<uintptr_t>(t.raw_data()) % 4 == 0 &&
                              t.strides()[0] % 2 == 0 && t.strides()[1] % 2 == 0 &&
                              t.strides()[2] % 2 == 0);
  OP_CHECK(t.strides()[3] == 1 && pairs_aligned, kOp, name,
           " must have unit stride in D and (2-byte dtypes) 4-byte aligned rows; got strides ",
           t.strides()[0], ", ", t.strides()[1], ", ", t.strides()[2], ", ", t.strides()[3]);
}

FlashAttentionKernel Resolve(FlashAttentionKernel kernel, Dtype dtype) {
  if (kernel == FlashAttentionKernel::kAuto) {
    return dtype == Dtype::kF32 ? FlashAttentionKernel::kFloat : FlashAttentionKernel::kTensorCore;
  }
  OP_CHECK(kernel != FlashAttentionKernel::kTensorCore || dtype != Dtype::kF32, kOp,
           "the tensor-core kernel takes bf16 or f16, not f32");
  return kernel;
}

Args MakeArgs(const Tensor& q, const Tensor& k, const Tensor& v, float scale, bool causal,
              const FlashDropout& dropout) {
  OP_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, kOp, "dropout p must be in [0, 1); got ",
           dropout.p);
  Args a{};
  a.q = q.raw_data();
  a.k = k.raw_data();
  a.v = v.raw_data();
  a.sq = StridesOf(q);
  a.sk = StridesOf(k);
  a.sv = StridesOf(v);
  a.batch = static_cast<int>(q.dim(0));
  a.heads = static_cast<int>(q.dim(1));
  a.t_q = static_cast<int>(q.dim(2));
  a.t_k = static_cast<int>(k.dim(2));
  a.causal_offset = a.t_k - a.t_q;
  a.causal = causal;
  a.vec = AlignedRows(q) && AlignedRows(k) && AlignedRows(v);
  a.scale = scale;
  a.scale_log2 = scale * kLog2e;
  // As tensor/ops/dropout.cc: the threshold and the float scale.
  a.dropout = dropout.p > 0.0f;
  a.drop_threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(dropout.p) * 16777216.0));
  a.drop_scale = static_cast<float>(1.0 / (1.0 - dropout.p));
  a.drop_seed = dropout.seed;
  a.drop_offset = dropout.offset;
  a.dq_pass = 0;
  a.dq_passes = 1;
  return a;
}

void Launch(flash::KernelFn kernel, unsigned bh, int64_t blocks_y, const FlashAttentionTiles& tiles,
            const Args& a) {
  if (bh == 0 || blocks_y == 0) return;
  OP_CHECK(blocks_y <= 65535, kOp, "sequence too long for the launch grid (", blocks_y,
           " row blocks)");
  if (tiles.smem_bytes > 48 * 1024) {
    CheckCuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(tiles.smem_bytes)),
              kOp, "cudaFuncSetAttribute(max dynamic shared memory)");
  }
  kernel<<<dim3(bh, static_cast<unsigned>(blocks_y)), tiles.threads, tiles.smem_bytes,
           ComputeStream()>>>(a);
  CheckLaunch(kOp);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// out[i] = sum over s of slots[s * n + i], s in order (the groups' sums of a
// shared bias's gradient).
__global__ void SumSlotsKernel(const float* slots, int64_t n, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float sum = slots[i];
    for (int64_t s = 1; s < count; ++s) sum += slots[s * n + i];
    out[i] = sum;
  }
}

__device__ __forceinline__ bool Nonzero(int32_t x) { return x != 0; }
__device__ __forceinline__ bool Nonzero(int64_t x) { return x != 0; }
template <typename S>
__device__ __forceinline__ bool Nonzero(S x) {
  return ToF(x) != 0.0f;
}

// keep[i] = (mask[i] != 0) for a (B, T_k) key padding mask of any dtype.
template <typename S>
__global__ void KeepMaskKernel(const S* mask, uint8_t* keep, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    keep[i] = Nonzero(mask[i]) ? 1 : 0;
  }
}

// Checks the score terms against q (B, H, T_q, D) and k (B, H, T_k, D) and
// points the argument block at them; `keep` receives the key mask as bytes
// (FlashKeyMaskBytes: a copy unless it already is u8). Returns whether any
// term is set.
bool SetTerms(const FlashScoreTerms& terms, const Tensor& q, const Tensor& k, Args* a,
              Tensor* keep) {
  const int64_t b = q.dim(0), h = q.dim(1), t_q = q.dim(2), t_k = k.dim(2);
  if (terms.bias.defined()) {
    const Tensor& bias = terms.bias;
    CheckOnDevice(q, bias, "bias");
    OP_CHECK(bias.rank() == 4 && (bias.dim(0) == 1 || bias.dim(0) == b) && bias.dim(1) == h &&
                 bias.dim(2) == t_q && bias.dim(3) == t_k && bias.is_contiguous(),
             kOp, "bias must be a contiguous (", b, " or 1, ", h, ", ", t_q, ", ", t_k,
             ") tensor; got ", bias.shape().ToString(),
             bias.is_contiguous() ? "" : " (not contiguous)");
    switch (bias.dtype()) {
      case Dtype::kF32:
        a->bias_type = flash::BiasType::kF32;
        break;
      case Dtype::kBF16:
        a->bias_type = flash::BiasType::kBF16;
        break;
      case Dtype::kF16:
        a->bias_type = flash::BiasType::kF16;
        break;
      default:
        ThrowOpError(kOp, "bias must be f32, bf16 or f16; got ", DtypeName(bias.dtype()));
    }
    a->bias = bias.raw_data();
    a->bias_sb = bias.dim(0) == 1 ? 0 : h * t_q * t_k;
    a->bias_sh = t_q * t_k;
  }
  if (terms.key_mask.defined()) {
    const Tensor& mask = terms.key_mask;
    CheckOnDevice(q, mask, "key_mask");
    OP_CHECK(mask.rank() == 2 && mask.dim(0) == b && mask.dim(1) == t_k && mask.is_contiguous(),
             kOp, "key_mask must be a contiguous (B, T_k) = (", b, ", ", t_k, ") tensor; got ",
             mask.shape().ToString(), mask.is_contiguous() ? "" : " (not contiguous)");
    *keep = FlashKeyMaskBytes(mask);
    a->key_keep = keep->data<uint8_t>();
  }
  return terms.bias.defined() || terms.key_mask.defined();
}

// What both entry points check: q, k, v on one CUDA device, fitting the
// kernels, and the forward's out (B, H, T_q, D) and lse (B, H, T_q).
void CheckInputsAndOutputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse) {
  CheckFlashAttentionInputs(q, k, v);
  OP_CHECK(q.device().is_cuda(), kOp, "q is on ", q.device().ToString(), ", not a CUDA device");
  CheckOnDevice(q, k, "k");
  CheckOnDevice(q, v, "v");
  const int64_t b = q.dim(0), h = q.dim(1), t_q = q.dim(2), d = q.dim(3);
  CheckStridedOutput(q, out, "out", Shape({b, h, t_q, d}), q.dtype());
  CheckOutput(q, lse, "lse", Shape({b, h, t_q}), Dtype::kF32);
}

flash::Kernels KernelsFor(FlashAttentionKernel kernel, Dtype dtype, int64_t d, const Args& a,
                          bool terms) {
  return kernel == FlashAttentionKernel::kTensorCore
             ? flash::MmaKernels(dtype, d, a.dropout, terms)
             : flash::FloatKernels(dtype, d, a.dropout, terms);
}

}  // namespace

void SetFlashAttentionAtomicDq(bool atomic) { AtomicDqFlag().store(atomic); }
bool FlashAttentionAtomicDq() { return AtomicDqFlag().load(std::memory_order_relaxed); }
void SetFlashAttentionNarrowDkDv(bool narrow) { NarrowDkDvFlag().store(narrow); }
bool FlashAttentionNarrowDkDv() { return NarrowDkDvFlag().load(std::memory_order_relaxed); }
void SetFlashAttentionNarrowDq(bool narrow) { NarrowDqFlag().store(narrow); }
bool FlashAttentionNarrowDq() { return NarrowDqFlag().load(std::memory_order_relaxed); }
void SetFlashAttentionCudnn(bool use) { CudnnFlag().store(use); }
bool FlashAttentionCudnn() { return CudnnFlag().load(std::memory_order_relaxed); }

Tensor FlashKeyMaskBytes(const Tensor& key_mask) {
  OP_CHECK(key_mask.defined() && key_mask.device().is_cuda() && key_mask.is_contiguous(), kOp,
           "key_mask must be a contiguous tensor on a CUDA device; got ",
           key_mask.defined() ? key_mask.shape().ToString() + " on " + key_mask.device().ToString()
                              : std::string("undefined"));
  if (key_mask.dtype() == Dtype::kU8) return key_mask;
  Tensor keep = Tensor::Empty(key_mask.shape(), Dtype::kU8, key_mask.device());
  const int64_t n = key_mask.numel();
  if (n == 0) return keep;
  SetDevice(key_mask, kOp);
  auto launch = [&](auto zero) {
    using S = decltype(zero);
    KeepMaskKernel<S><<<Blocks(n), kThreads, 0, ComputeStream()>>>(
        static_cast<const S*>(key_mask.raw_data()), keep.data<uint8_t>(), n);
    CheckLaunch(kOp);
  };
  switch (key_mask.dtype()) {
    case Dtype::kI32:
      launch(int32_t{});
      break;
    case Dtype::kI64:
      launch(int64_t{});
      break;
    default:
      DispatchFloat(key_mask.dtype(), kOp, launch);
  }
  return keep;
}

void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                           bool causal, const Tensor& out, const Tensor& lse,
                           FlashAttentionKernel kernel, const FlashDropout& dropout,
                           const FlashScoreTerms& terms) {
  CheckInputsAndOutputs(q, k, v, out, lse);
  const int64_t b = q.dim(0), h = q.dim(1), t_q = q.dim(2), d = q.dim(3);
  SetDevice(q, kOp);
  std::string why;  // where cuDNN declines: said once by attention_cudnn.cc
  if (kernel == FlashAttentionKernel::kAuto && FlashAttentionCudnn() && dropout.p == 0.0f &&
      !terms.bias.defined() && !terms.key_mask.defined() &&
      CudnnAttentionForward(q, k, v, scale, causal, out, lse, &why)) {
    return;
  }
  kernel = Resolve(kernel, q.dtype());
  Args a = MakeArgs(q, k, v, scale, causal, dropout);
  Tensor keep;  // (B, T_k) u8, alive until the launch is queued (the allocator orders reuse)
  const bool with_terms = SetTerms(terms, q, k, &a, &keep);
  a.y = out.raw_data();
  a.sy = StridesOf(out);
  a.lse = lse.data<float>();
  const flash::Kernels kernels = KernelsFor(kernel, q.dtype(), d, a, with_terms);
  const FlashAttentionTiles tiles =
      FlashAttentionTilesFor(kernel, FlashAttentionPass::kForward, d, DtypeSize(q.dtype()));
  Launch(kernels.forward, static_cast<unsigned>(b * h), CeilDiv(t_q, tiles.rows), tiles, a);
}

void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, float scale, bool causal,
                            const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            FlashAttentionKernel kernel, const FlashDropout& dropout,
                            const FlashScoreTerms& terms, const Tensor& dbias,
                            int64_t bias_grad_groups) {
  CheckInputsAndOutputs(q, k, v, out, lse);
  const int64_t b = q.dim(0), h = q.dim(1), t_q = q.dim(2), t_k = k.dim(2), d = q.dim(3);
  CheckOnDevice(q, grad_out, "grad_out");
  OP_CHECK(grad_out.shape() == out.shape() && grad_out.dtype() == q.dtype() &&
               grad_out.strides()[3] == 1,
           kOp, "grad_out must be ", out.shape().ToString(), " ", DtypeName(q.dtype()),
           " with unit stride in D; got ", grad_out.shape().ToString(), " ",
           DtypeName(grad_out.dtype()));
  CheckStridedOutput(q, dq, "dq", q.shape(), q.dtype());
  CheckStridedOutput(q, dk, "dk", k.shape(), q.dtype());
  CheckStridedOutput(q, dv, "dv", v.shape(), q.dtype());
  const bool shared_bias = dbias.defined() && dbias.rank() == 4 && dbias.dim(0) == 1 && b > 1;
  if (dbias.defined()) {
    CheckOutput(q, dbias, "dbias", Shape({shared_bias ? 1 : b, h, t_q, t_k}), Dtype::kF32);
  }
  OP_CHECK(bias_grad_groups >= 0, kOp, "bias_grad_groups must be >= 0; got ", bias_grad_groups);
  SetDevice(q, kOp);
  std::string why;  // where cuDNN declines: said once by attention_cudnn.cc
  if (kernel == FlashAttentionKernel::kAuto && FlashAttentionCudnn() && dropout.p == 0.0f &&
      !terms.bias.defined() && !terms.key_mask.defined() && !dbias.defined() &&
      CudnnAttentionBackward(q, k, v, out, lse, grad_out, scale, causal, dq, dk, dv, &why)) {
    return;
  }
  kernel = Resolve(kernel, q.dtype());
  Tensor delta = Tensor::Empty({b, h, t_q}, Dtype::kF32, q.device());
  Args a = MakeArgs(q, k, v, scale, causal, dropout);
  Tensor keep;
  bool with_terms = SetTerms(terms, q, k, &a, &keep);
  const int64_t elem = DtypeSize(q.dtype());
  // The dq kernel's query blocks (the narrow one's too: it steps over fewer keys).
  const FlashAttentionTiles qt =
      FlashAttentionTilesFor(kernel, FlashAttentionPass::kBackwardDq, d, elem);
  const FlashBiasGradGroups groups =
      FlashBiasGradGroupsFor(b, h, CeilDiv(t_q, qt.rows), shared_bias, bias_grad_groups);
  Tensor slots;  // (G, H, T_q, T_k) f32: the groups' sums, when a shared bias has several
  if (dbias.defined()) {
    slots = groups.groups > 1 && shared_bias
                ? Tensor::Empty({groups.groups, h, t_q, t_k}, Dtype::kF32, q.device())
                : dbias;
    // The dq kernel adds the pairs it visits; causally skipped tiles stay 0.
    if (slots.numel() > 0) {
      CheckCuda(cudaMemsetAsync(slots.raw_data(), 0, slots.nbytes(), ComputeStream()), kOp,
                "cudaMemsetAsync(dbias)");
    }
    a.dbias_slots = slots.data<float>();
    with_terms = true;
  }
  a.out = out.raw_data();
  a.sy = StridesOf(out);
  a.grad_out = grad_out.raw_data();
  a.sdo = StridesOf(grad_out);
  a.vec = a.vec && AlignedRows(grad_out);
  a.lse = lse.data<float>();
  a.delta = delta.data<float>();
  a.dq = dq.raw_data();
  a.dk = dk.raw_data();
  a.dv = dv.raw_data();
  a.sdq = StridesOf(dq);
  a.sdk = StridesOf(dk);
  a.sdv = StridesOf(dv);
  const unsigned bh = static_cast<unsigned>(b * h);
  const int64_t rows = b * h * t_q;
  if (rows > 0) LaunchDelta(a, out, grad_out, d, rows);
  const flash::Kernels kernels = KernelsFor(kernel, q.dtype(), d, a, with_terms);
  if (kernel == FlashAttentionKernel::kTensorCore && !dbias.defined() && FlashAttentionAtomicDq()) {
    // dk, dv and dq in one pass over the key blocks, dq summed by atomics.
    Tensor accum = Tensor::Empty({b, h, t_q, d}, Dtype::kF32, q.device());  // unscaled dS K
    if (accum.numel() > 0) {
      CheckCuda(cudaMemsetAsync(accum.raw_data(), 0, accum.nbytes(), ComputeStream()), kOp,
                "cudaMemsetAsync(dq accumulator)");
    }
    a.dq_accum = accum.data<float>();
    const FlashAttentionTiles fused =
        FlashAttentionTilesFor(kernel, FlashAttentionPass::kBackwardDkDvDq, d, elem);
    Launch(kernels.dkdv_dq, bh, CeilDiv(t_k, fused.rows), fused, a);
    if (accum.numel() == 0) return;  // no query rows (dk, dv are zeros)
    DispatchFloat(q.dtype(), kOp, [&](auto zero) {
      using T = decltype(zero);
      DqFromAccumKernel<T>
          <<<Blocks(rows * 32), kThreads, 0, ComputeStream()>>>(a, static_cast<int>(d), rows);
      CheckLaunch(kOp);
    });
    return;
  }
  // The narrow kernels (32 rows a step) where they are built and chosen.
  const bool narrow_dkdv = kernels.dkdv_narrow != nullptr && FlashAttentionNarrowDkDv();
  const bool narrow_dq = kernels.dq_narrow != nullptr && FlashAttentionNarrowDq();
  const FlashAttentionTiles kv = FlashAttentionTilesFor(
      kernel,
      narrow_dkdv ? FlashAttentionPass::kBackwardDkDvNarrow : FlashAttentionPass::kBackwardDkDv, d,
      elem);
  Launch(narrow_dkdv ? kernels.dkdv_narrow : kernels.dkdv, bh, CeilDiv(t_k, kv.rows), kv, a);
  const FlashAttentionTiles dq_tiles =
      narrow_dq ? FlashAttentionTilesFor(kernel, FlashAttentionPass::kBackwardDqNarrow, d, elem)
                : qt;
  // dq (and dS): pass i takes example g * passes + i of each group g.
  a.dq_passes = static_cast<int>(groups.passes);
  for (int64_t pass = 0; pass < groups.passes; ++pass) {
    a.dq_pass = static_cast<int>(pass);
    Launch(narrow_dq ? kernels.dq_narrow : kernels.dq, static_cast<unsigned>(groups.groups * h),
           CeilDiv(t_q, dq_tiles.rows), dq_tiles, a);
  }
  if (slots.defined() && !slots.SharesStorageWith(dbias)) {
    const int64_t n = dbias.numel();
    if (n > 0) {
      SumSlotsKernel<<<Blocks(n), kThreads, 0, ComputeStream()>>>(
          slots.data<float>(), n, groups.groups, dbias.data<float>());
      CheckLaunch(kOp);
    }
  }
}

}  // namespace cuda
}  // namespace tensor
