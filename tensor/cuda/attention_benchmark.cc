// Fused causal attention (tensor/cuda/attention.h) against the unfused path
// that materializes the scores: cuBLAS batched GEMMs (bf16 in, f32 compute)
// and a row softmax over (B, H, T, T), forward and forward + backward, at
// GPT-2 head shapes (H = 12, D = 64, bf16). Timed with CUDA events on the
// compute stream; prints ms, TFLOP/s of the causal half (the useful work:
// forward 2 * 2 * B*H*T*T*D / 2, backward 2.5x that) and the bytes of the
// (T, T) tensors the unfused path allocates; the fused kernels' cost of
// attention dropout and of T5's score terms (bias, key mask, dS); the
// backward alone, deterministic (7 products: dk/dv, then dq) against the
// atomic-dq one (FlashAttention-2's 5 products, SetFlashAttentionAtomicDq),
// timed in alternation, and the deterministic one with the narrow kernels
// (SetFlashAttentionNarrowDkDv / Dq: 32 rows a step, more CTAs an SM); and
// cuDNN's fused attention (attention_cudnn.h, FSDP_CUDA_ATTENTION=cudnn),
// forward and backward each timed in alternation with ours.
// Also prints how far apart the outputs are.
//
//   ./bazelw run --config=cuda //tensor/cuda:attention_benchmark -- [B] [iters]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/attention_cudnn.h"
#include "tensor/cuda/bench_timing.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

void Check(cudaError_t err, const char* what) { bench::CheckCuda(err, what); }
void Check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(st));
    std::exit(1);
  }
}

cudaDataType CudaType(Dtype d) {
  return d == Dtype::kF32 ? CUDA_R_32F : d == Dtype::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// Column-major batched GEMM C = op(A) op(B) over B*H matrices (row-major
// callers pass the transposed problem, see the uses).
void Gemm(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const Tensor& a, int lda,
          int64_t sa, const Tensor& b, int ldb, int64_t sb, const Tensor& c, int ldc, int64_t sc,
          int batch) {
  const float one = 1.0f, zero = 0.0f;
  Check(cublasGemmStridedBatchedEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, a.raw_data(),
                                   CudaType(a.dtype()), lda, sa, b.raw_data(), CudaType(b.dtype()),
                                   ldb, sb, &zero, c.raw_data(), CudaType(c.dtype()), ldc, sc,
                                   batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

// Milliseconds per call of fn, averaged over iters after 2 warm-up calls.
double TimeMs(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 2; ++i) fn();
  return bench::EventMs(fn, iters);
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.ToVector<float>(), y = b.ToVector<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(double(x[i]) - y[i]));
  return m;
}

void Run(cublasHandle_t handle, int64_t b, int64_t h, int64_t t, int64_t d, int iters) {
  const Dtype dt = Dtype::kBF16;
  const Device dev = Device::Cuda(0);
  const Shape shape({b, h, t, d});
  const Tensor q = testing::RandomTensor(shape, 1, -1, 1, dt).To(dev);
  const Tensor k = testing::RandomTensor(shape, 2, -1, 1, dt).To(dev);
  const Tensor v = testing::RandomTensor(shape, 3, -1, 1, dt).To(dev);
  const Tensor dout = testing::RandomTensor(shape, 4, -1, 1, dt).To(dev);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int bh = static_cast<int>(b * h), ti = static_cast<int>(t), di = static_cast<int>(d);
  const int64_t td = t * d, tt = t * t;

  // Fused.
  Tensor y = Tensor::Empty(shape, dt, dev), lse = Tensor::Empty({b, h, t}, Dtype::kF32, dev);
  Tensor dq = Tensor::Empty(shape, dt, dev), dk = Tensor::Empty(shape, dt, dev),
         dv = Tensor::Empty(shape, dt, dev);
  auto fused_fwd = [&] { cuda::FlashAttentionForward(q, k, v, scale, true, y, lse); };
  auto fused_bwd = [&] {
    cuda::FlashAttentionBackward(q, k, v, y, lse, dout, scale, true, dq, dk, dv);
  };
  // Fused with attention dropout 0.1 (the mask regenerated in every kernel).
  const cuda::FlashDropout drop{0.1f, 7, 0};
  auto fused_drop = [&] {
    cuda::FlashAttentionForward(q, k, v, scale, true, y, lse, cuda::FlashAttentionKernel::kAuto,
                                drop);
    cuda::FlashAttentionBackward(q, k, v, y, lse, dout, scale, true, dq, dk, dv,
                                 cuda::FlashAttentionKernel::kAuto, drop);
  };
  // Fused with T5's score terms: a (1, H, T, T) bf16 bias shared by the
  // batch, a key padding mask, and the bias's gradient (dS summed over the
  // batch): in the groups the kernels pick, and in one group per example (one
  // pass, B slots: the (B, H, T, T) dS PyTorch's memory-efficient attention
  // returns).
  cuda::FlashScoreTerms terms;
  terms.bias = testing::RandomTensor({1, h, t, t}, 5, -1, 1, dt).To(dev);
  terms.key_mask = Tensor::Full({b, t}, 1.0).To(dev);
  Tensor dbias = Tensor::Empty({1, h, t, t}, Dtype::kF32, dev);
  auto fused_terms = [&](int64_t groups) {
    cuda::FlashAttentionForward(q, k, v, scale, true, y, lse, cuda::FlashAttentionKernel::kAuto, {},
                                terms);
    cuda::FlashAttentionBackward(q, k, v, y, lse, dout, scale, true, dq, dk, dv,
                                 cuda::FlashAttentionKernel::kAuto, {}, terms, dbias, groups);
  };
  const int64_t dq_rows = cuda::FlashAttentionTilesFor(cuda::FlashAttentionKernel::kTensorCore,
                                                       cuda::FlashAttentionPass::kBackwardDq, d, 2)
                              .rows;
  const cuda::FlashBiasGradGroups groups =
      cuda::FlashBiasGradGroupsFor(b, h, (t + dq_rows - 1) / dq_rows, /*shared_bias=*/true);

  // Unfused: S = Q K^T (f32), P = softmax (bf16), Y = P V; backward dV = P^T dO,
  // dP = dO V^T (f32), dS = softmax backward (bf16), dQ = dS K, dK = dS^T Q.
  Tensor s = Tensor::Empty({b, h, t, t}, Dtype::kF32, dev);
  Tensor p = Tensor::Empty({b, h, t, t}, dt, dev);
  Tensor ds = Tensor::Empty({b, h, t, t}, dt, dev);
  Tensor y2 = Tensor::Empty(shape, dt, dev), dq2 = Tensor::Empty(shape, dt, dev),
         dk2 = Tensor::Empty(shape, dt, dev), dv2 = Tensor::Empty(shape, dt, dev);
  auto unfused_fwd = [&] {
    Gemm(handle, true, false, ti, ti, di, k, di, td, q, di, td, s, ti, tt, bh);  // S^T = K Q^T
    cuda::UnfusedAttentionSoftmax(s, scale, true, p);
    Gemm(handle, false, false, di, ti, ti, v, di, td, p, ti, tt, y2, di, td, bh);  // Y^T = V^T P^T
  };
  auto unfused_bwd = [&] {
    Gemm(handle, false, true, di, ti, ti, dout, di, td, p, ti, tt, dv2, di, td,
         bh);                                                                       // dV^T = dO^T P
    Gemm(handle, true, false, ti, ti, di, v, di, td, dout, di, td, s, ti, tt, bh);  // dP^T = V dO^T
    cuda::UnfusedAttentionSoftmaxBackward(s, p, scale, ds);
    Gemm(handle, false, false, di, ti, ti, k, di, td, ds, ti, tt, dq2, di, td,
         bh);  // dQ^T = K^T dS^T
    Gemm(handle, false, true, di, ti, ti, q, di, td, ds, ti, tt, dk2, di, td, bh);  // dK^T = Q^T dS
  };

  const double f_ms = TimeMs(fused_fwd, iters);
  const double fb_ms = TimeMs(
      [&] {
        fused_fwd();
        fused_bwd();
      },
      iters);
  const double fd_ms = TimeMs(fused_drop, iters);
  const double ft_ms = TimeMs([&] { fused_terms(0); }, iters);
  const double ftb_ms = TimeMs([&] { fused_terms(b); }, iters);
  // The backward alone in both modes, alternating rounds so both see the
  // same clocks; the better round of each.
  fused_fwd();
  // The deterministic one also with the narrow kernels (32 rows a step: the
  // same bits): dk/dv's, dq's, both (mode bits 1, 2).
  double det_ms = 1e30, atomic_ms = 1e30, narrow_ms[4] = {0, 1e30, 1e30, 1e30};
  auto set_narrow = [](int mode) {
    cuda::SetFlashAttentionNarrowDkDv((mode & 1) != 0);
    cuda::SetFlashAttentionNarrowDq((mode & 2) != 0);
  };
  Tensor dq_atomic = Tensor::Empty(shape, dt, dev), dq_narrow = Tensor::Empty(shape, dt, dev),
         dk_narrow = Tensor::Empty(shape, dt, dev);
  for (int round = 0; round < 3; ++round) {
    set_narrow(0);  // whatever FSDP_CUDA_ATTENTION_DKDV / _DQ said at startup
    cuda::SetFlashAttentionAtomicDq(false);
    det_ms = std::min(det_ms, TimeMs(fused_bwd, iters));
    for (int mode : {1, 2, 3}) {
      set_narrow(mode);
      narrow_ms[mode] = std::min(narrow_ms[mode], TimeMs(fused_bwd, iters));
    }
    set_narrow(0);
    cuda::SetFlashAttentionAtomicDq(true);
    atomic_ms = std::min(atomic_ms, TimeMs(fused_bwd, iters));
  }
  dq_atomic.CopyFrom(dq);  // the atomic run's (the last one)
  cuda::SetFlashAttentionAtomicDq(false);
  set_narrow(3);
  fused_bwd();
  dq_narrow.CopyFrom(dq);
  dk_narrow.CopyFrom(dk);
  set_narrow(0);
  fused_bwd();  // dq, dk, dv deterministic again for the comparisons below
  // cuDNN's forward and backward (direct calls), alternating rounds with ours.
  std::string cudnn_why;
  double cudnn_fwd_ms = 0, cudnn_bwd_ms = 0, ours_fwd_ms = 1e30, ours_bwd_ms = 1e30;
  Tensor yc = Tensor::Empty(shape, dt, dev), lsec = Tensor::Empty({b, h, t}, Dtype::kF32, dev);
  Tensor dqc = Tensor::Empty(shape, dt, dev), dkc = Tensor::Empty(shape, dt, dev),
         dvc = Tensor::Empty(shape, dt, dev);
  auto cudnn_fwd = [&] {
    return cuda::CudnnAttentionForward(q, k, v, scale, true, yc, lsec, &cudnn_why);
  };
  auto cudnn_bwd = [&] {
    return cuda::CudnnAttentionBackward(q, k, v, yc, lsec, dout, scale, true, dqc, dkc, dvc,
                                        &cudnn_why);
  };
  const bool with_cudnn = cudnn_fwd() && cudnn_bwd();
  if (with_cudnn) {
    cudnn_fwd_ms = cudnn_bwd_ms = 1e30;
    for (int round = 0; round < 3; ++round) {
      ours_fwd_ms = std::min(ours_fwd_ms, TimeMs(fused_fwd, iters));
      cudnn_fwd_ms = std::min(cudnn_fwd_ms, TimeMs([&] { cudnn_fwd(); }, iters));
      ours_bwd_ms = std::min(ours_bwd_ms, TimeMs(fused_bwd, iters));
      cudnn_bwd_ms = std::min(cudnn_bwd_ms, TimeMs([&] { cudnn_bwd(); }, iters));
    }
  }
  const double u_ms = TimeMs(unfused_fwd, iters);
  const double ub_ms = TimeMs(
      [&] {
        unfused_fwd();
        unfused_bwd();
      },
      iters);
  const double fwd_flops = 2.0 * b * h * t * t * d;  // causal half of 4 B H T^2 D
  const double all_flops = fwd_flops * 3.5;          // + backward at 2.5x
  const double tt_bytes = double(s.nbytes() + p.nbytes() + ds.nbytes());
  // tools/attention_vs_torch.py reads the header, forward, fwd + bwd and
  // backward lines (tools/testdata/attention_benchmark_sample.txt).
  std::printf("B=%lld H=%lld T=%lld D=%lld bf16 causal\n", static_cast<long long>(b),
              static_cast<long long>(h), static_cast<long long>(t), static_cast<long long>(d));
  std::printf("  forward:        fused %8.3f ms (%6.1f TFLOP/s)  unfused %8.3f ms (%6.1f)  x%.2f\n",
              f_ms, fwd_flops / f_ms * 1e-9, u_ms, fwd_flops / u_ms * 1e-9, u_ms / f_ms);
  std::printf("  fwd + bwd:      fused %8.3f ms (%6.1f TFLOP/s)  unfused %8.3f ms (%6.1f)  x%.2f\n",
              fb_ms, all_flops / fb_ms * 1e-9, ub_ms, all_flops / ub_ms * 1e-9, ub_ms / fb_ms);
  std::printf("  fwd + bwd, attention dropout 0.1: fused %8.3f ms (x%.2f the fused time without)\n",
              fd_ms, fd_ms / fb_ms);
  const double bwd_flops = fwd_flops * 2.5;
  std::printf(
      "  backward: deterministic (7 products) %8.3f ms (%6.1f TFLOP/s)  atomic dq (5) %8.3f ms "
      "(%6.1f)  atomic / deterministic %.3f; max |dq atomic - deterministic| %.3g; "
      "accumulator %.1f MiB\n",
      det_ms, bwd_flops / det_ms * 1e-9, atomic_ms, bwd_flops / atomic_ms * 1e-9,
      atomic_ms / det_ms, MaxAbsDiff(dq_atomic, dq), double(b * h * t * d * 4) / (1 << 20));
  std::printf(
      "  backward, narrow kernels (32 rows a step; FSDP_CUDA_ATTENTION_DKDV=narrow, "
      "FSDP_CUDA_ATTENTION_DQ=narrow): dk/dv %8.3f ms (x%.3f the deterministic), dq %8.3f ms "
      "(x%.3f), both %8.3f ms (%6.1f TFLOP/s, x%.3f); max |narrow - deterministic| dq %.3g "
      "dk %.3g\n",
      narrow_ms[1], narrow_ms[1] / det_ms, narrow_ms[2], narrow_ms[2] / det_ms, narrow_ms[3],
      bwd_flops / narrow_ms[3] * 1e-9, narrow_ms[3] / det_ms, MaxAbsDiff(dq_narrow, dq),
      MaxAbsDiff(dk_narrow, dk));
  if (with_cudnn) {
    std::printf(
        "  cuDNN (FSDP_CUDA_ATTENTION=cudnn): forward %8.3f ms (%6.1f TFLOP/s, x%.3f ours), "
        "backward %8.3f ms (%6.1f TFLOP/s, x%.3f ours' deterministic); max |cuDNN - ours| y %.3g "
        "lse %.3g dq %.3g dk %.3g dv %.3g\n",
        cudnn_fwd_ms, fwd_flops / cudnn_fwd_ms * 1e-9, cudnn_fwd_ms / ours_fwd_ms, cudnn_bwd_ms,
        bwd_flops / cudnn_bwd_ms * 1e-9, cudnn_bwd_ms / ours_bwd_ms, MaxAbsDiff(yc, y),
        MaxAbsDiff(lsec, lse), MaxAbsDiff(dqc, dq), MaxAbsDiff(dkc, dk), MaxAbsDiff(dvc, dv));
  } else {
    std::printf("  cuDNN (FSDP_CUDA_ATTENTION=cudnn): not run: %s\n", cudnn_why.c_str());
  }
  const double slot_mib = double(h) * t * t * 4 / (1 << 20);
  std::printf(
      "  fwd + bwd, bias + key mask, the bias's gradient (T5): fused %8.3f ms (x%.2f the "
      "fused time without); %lld groups of %lld examples: %.1f MiB of sums\n",
      ft_ms, ft_ms / fb_ms, static_cast<long long>(groups.groups),
      static_cast<long long>(groups.passes), groups.groups > 1 ? groups.groups * slot_mib : 0.0);
  std::printf(
      "    the same with a group per example (B slots, one dq launch): %8.3f ms (x%.2f); "
      "%.1f MiB\n",
      ftb_ms, ftb_ms / fb_ms, b * slot_mib);
  std::printf("  unfused (T, T) buffers: %.1f MiB; fused extra: lse %.2f MiB + delta %.2f MiB\n",
              tt_bytes / (1 << 20), lse.nbytes() / double(1 << 20),
              cuda::FlashAttentionBackwardWorkspaceBytes(b, h, t) / double(1 << 20));
  std::printf("  max |fused - unfused|: y %.3g  dq %.3g  dk %.3g  dv %.3g\n", MaxAbsDiff(y, y2),
              MaxAbsDiff(dq, dq2), MaxAbsDiff(dk, dk2), MaxAbsDiff(dv, dv2));
}

}  // namespace
}  // namespace tensor

int main(int argc, char** argv) {
  constexpr char kUsage[] = "attention_benchmark [B] [iters]";
  const int64_t b = tensor::bench::PositiveArg(argc, argv, 1, "B", 8, kUsage);
  const int iters = static_cast<int>(tensor::bench::PositiveArg(argc, argv, 2, "iters", 20, kUsage));
  if (tensor::cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "no CUDA device visible\n");
    return 1;
  }
  cublasHandle_t handle;
  tensor::Check(cublasCreate(&handle), "cublasCreate");
  tensor::Check(cublasSetStream(handle, cudaStreamPerThread), "cublasSetStream");
  for (int64_t t : {1024, 2048}) tensor::Run(handle, b, 12, t, 64, iters);
  cublasDestroy(handle);
  return 0;
}
