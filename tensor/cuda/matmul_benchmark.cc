// GEMM TFLOP/s on one GPU: tensor::Matmul (the op: checks, descriptor cache,
// output from the caching allocator, cuBLASLt) and tensor::MatmulInto against
// a raw cublasLtMatmul call built by hand with the same descriptors (same
// layouts, compute type, 32 MiB workspace, heuristic's first algorithm), side
// by side in one run. Shapes: the minGPT MLP GEMMs, the 50257-vocab LM head
// (contiguous, 64-padded to 50304, and 50257 columns written into rows 50304
// apart as the aligned LM head does), 4096^3, and gpt2's forward GEMMs at
// batch 16 x 1024; in f32 (exact), tf32 and bf16. In bf16 each row also
// times the heuristic's other candidates ("best of N": what autotuning the
// algorithm could gain over its first choice; with FSDP_CUDA_GEMM_TUNE=1 the
// "ours" columns are tuned, see tensor/cuda/matmul.h). Then the gpt2 block's Linear layers with the
// bias (and GELU) fused into cuBLASLt's epilogue against the unfused GEMM + bias kernel, and the
// MLP's backward through the GELU (DGELU epilogue) against GEMM + GeluBackward, and the layers'
// weight + bias gradients (BGRADB epilogue) against GEMM + column sums, and c_fc's bias gradient
// out of the GELU backward's GEMM (DGELU_BGRAD) against BGRADB's. Timed with CUDA
// events on the calling thread's stream: warmup samples, then the median of --samples samples of
// --reps back-to-back calls each.
//
//   bazel-bin/tensor/cuda/matmul_benchmark --samples=20 --reps=10
//   bazel-bin/tensor/cuda/matmul_benchmark --cases=head --dtypes=bf16   (the LM head rows only)
//   bazel-bin/tensor/cuda/matmul_benchmark --epilogues_only             (the fused-epilogue table)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tensor/cuda/bench_timing.h"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda_backend.h"
#include "tensor/ops/init.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/tensor.h"

ABSL_FLAG(int, samples, 20, "timed samples per measurement (the median is reported)");
ABSL_FLAG(int, reps, 10, "back-to-back calls per sample");
ABSL_FLAG(int, warmup, 3, "untimed samples first");
ABSL_FLAG(int, device, 0, "CUDA device index");
ABSL_FLAG(std::string, cases, "",
          "only the cases whose name contains this text (e.g. 'head'); empty: all. The fused "
          "epilogue table runs only when this is empty");
ABSL_FLAG(std::string, dtypes, "", "only these dtypes, comma-separated (f32, tf32, bf16); empty: all");
ABSL_FLAG(bool, epilogues_only, false,
          "only the fused-epilogue table (gpt2's Linear layers, fused against unfused)");

namespace tensor {
namespace {

using bench::CheckCuda;

void CheckLt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cublasLtGetStatusString(st));
    std::exit(1);
  }
}

struct Case {
  const char* name;
  int64_t m;
  int64_t k;
  int64_t n;
  bool trans_b;     // b stored (n, k): the Linear layer x @ W^T
  int64_t ldc = 0;  // 0: n; else C's rows are ldc apart (a row-padded output)
};

struct Precision {
  const char* name;
  Dtype dtype;
  bool tf32;
};

// Seconds per call: median over samples of (reps calls between two events).
double TimeCall(const std::function<void()>& call) {
  const cudaStream_t stream = cudaStreamPerThread;
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup) * reps; ++i) call();
  CheckCuda(cudaStreamSynchronize(stream), "warmup");
  std::vector<double> seconds;
  for (int s = 0; s < absl::GetFlag(FLAGS_samples); ++s) {
    seconds.push_back(bench::EventMs(call, reps, stream) * 1e-3);
  }
  return bench::Median(std::move(seconds));
}

// A device tensor of deterministic values in [-1, 1).
Tensor DeviceRandom(const Shape& shape, Dtype dtype, uint64_t seed, int device) {
  std::vector<float> values(shape.numel());
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : values) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  return Tensor::FromVector(values, shape, dtype).To(Device::Cuda(device));
}

cudaDataType_t LtType(Dtype dtype) {
  return dtype == Dtype::kBF16 ? CUDA_R_16BF : dtype == Dtype::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// The hand-written cuBLASLt call for row-major c (m, n) = a (m, k) @ op(b):
// c^T = op(b)^T a^T in cuBLASLt's column-major terms (see matmul.h).
class RawLt {
 public:
  RawLt(const Case& c, const Precision& p, const Tensor& a, const Tensor& b, const Tensor& out)
      : a_(a.raw_data()), b_(b.raw_data()), c_(out.raw_data()) {
    CheckLt(cublasLtCreate(&handle_), "cublasLtCreate");
    CheckCuda(cudaMalloc(&workspace_, cuda::kMatmulWorkspaceBytes), "cudaMalloc");
    const cublasComputeType_t compute = p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CheckLt(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    // cuBLASLt's A = b: (n, k) row major is column-major k x n, used transposed;
    // (k, n) row major is column-major n x k, used as is.
    const int32_t op_a = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t op_b = CUBLAS_OP_N;  // a (m, k) row major = column-major k x m
    CheckLt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
            "TRANSA");
    CheckLt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
            "TRANSB");
    const cudaDataType_t t = LtType(p.dtype);
    if (c.trans_b) {
      CheckLt(cublasLtMatrixLayoutCreate(&la_, t, c.k, c.n, c.k), "layout A");
    } else {
      CheckLt(cublasLtMatrixLayoutCreate(&la_, t, c.n, c.k, c.n), "layout A");
    }
    CheckLt(cublasLtMatrixLayoutCreate(&lb_, t, c.k, c.m, c.k), "layout B");
    CheckLt(cublasLtMatrixLayoutCreate(&lc_, t, c.n, c.m, c.ldc > 0 ? c.ldc : c.n), "layout C");
    cublasLtMatmulPreference_t pref;
    CheckLt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws = cuda::kMatmulWorkspaceBytes;
    CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)),
            "workspace preference");
    // The heuristic's first algorithm is what tensor::Matmul runs; the
    // others are the candidates an autotuner would time.
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int returned = 0;
    CheckLt(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, la_, lb_, lc_, lc_, pref, kCandidates,
                                           results, &returned),
            "cublasLtMatmulAlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) algos_.push_back(results[i].algo);
    }
    if (algos_.empty()) {
      std::fprintf(stderr, "no cuBLASLt algorithm for %s\n", c.name);
      std::exit(1);
    }
  }
  ~RawLt() {
    cublasLtMatrixLayoutDestroy(lc_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatmulDescDestroy(desc_);
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  RawLt(const RawLt&) = delete;
  RawLt& operator=(const RawLt&) = delete;

  static constexpr int kCandidates = 8;

  void Run() { CheckLt(RunWith(0), "cublasLtMatmul"); }
  // The heuristic's i-th algorithm (0: its first, what Run uses).
  cublasStatus_t RunWith(size_t i) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle_, desc_, &alpha, b_, la_, a_, lb_, &beta, c_, lc_, c_, lc_,
                          &algos_[i], workspace_, cuda::kMatmulWorkspaceBytes, cudaStreamPerThread);
  }
  size_t candidates() const { return algos_.size(); }

 private:
  const void* a_;
  const void* b_;
  void* c_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
};

// The fastest of the heuristic's candidates (seconds per call, index); a
// candidate that fails to run is skipped.
std::pair<double, size_t> BestCandidate(RawLt& raw, double first) {
  std::pair<double, size_t> best = {first, 0};
  for (size_t i = 1; i < raw.candidates(); ++i) {
    if (raw.RunWith(i) != CUBLAS_STATUS_SUCCESS) continue;
    const double t = TimeCall([&] { raw.RunWith(i); });
    if (t < best.first) best = {t, i};
  }
  return best;
}

// Largest |x - y| over the first elements of two same-shaped device tensors.
double MaxDiffHead(const Tensor& x, const Tensor& y) {
  const int64_t n = std::min<int64_t>(x.numel(), int64_t{1} << 20);
  const std::vector<float> vx = x.Flatten().Narrow(0, 0, n).To(Device::Cpu()).ToVector<float>();
  const std::vector<float> vy = y.Flatten().Narrow(0, 0, n).To(Device::Cpu()).ToVector<float>();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(vx[i]) - vy[i]));
  return worst;
}

// The Linear layers of a gpt2 block at batch 16 x 1024 tokens in bf16, with
// the bias (and GELU) in cuBLASLt's epilogue against the GEMM followed by our
// bias / bias-GELU kernel (tensor::LinearForward / LinearGeluForward with
// fusing switched off): the passes over the output the epilogue saves. Then
// the backward GEMMs: the GELU's backward in c_proj's dx GEMM (against GEMM +
// GeluBackward), and each Linear layer's bias gradient out of its dW GEMM
// (cuBLASLt's BGRADB, against GEMM + our column sums: the choice
// FSDP_CUDA_BIAS_GRAD_EPILOGUE makes).
void FusedEpilogues(int device) {
  enum class Fusion { kBias, kBiasGelu, kDGelu, kBiasGrad };
  struct Layer {
    const char* name;
    int64_t in, out;  // the Linear layer's features
    Fusion fusion;
  };
  const Layer layers[] = {{"attn qkv  +bias", 768, 2304, Fusion::kBias},
                          {"attn proj +bias", 768, 768, Fusion::kBias},
                          {"mlp fc    +bias+gelu", 768, 3072, Fusion::kBiasGelu},
                          {"mlp proj  +bias", 3072, 768, Fusion::kBias},
                          // The backward: c_proj's input gradient through the GELU,
                          // and the weight and bias gradients (f32, accumulated).
                          {"mlp proj  dx*gelu'", 3072, 768, Fusion::kDGelu},
                          {"attn qkv  dW+db", 768, 2304, Fusion::kBiasGrad},
                          {"attn proj dW+db", 768, 768, Fusion::kBiasGrad},
                          {"mlp fc    dW+db", 768, 3072, Fusion::kBiasGrad},
                          {"mlp proj  dW+db", 3072, 768, Fusion::kBiasGrad}};
  const int64_t tokens = 16 * 1024;
  std::printf("\nfused epilogues, bf16, %lld tokens (the gpt2 block's Linear layers)\n",
              static_cast<long long>(tokens));
  std::printf("%-22s %6s %6s | %9s %9s | %7s %9s\n", "layer", "K", "N", "fused ms", "unfused ms",
              "speedup", "max|diff|");
  uint64_t seed = 100;
  for (const Layer& l : layers) {
    const Tensor x = DeviceRandom({tokens, l.in}, Dtype::kBF16, seed++, device);
    const Tensor w = DeviceRandom({l.out, l.in}, Dtype::kBF16, seed++, device);
    const Tensor b = DeviceRandom({l.out}, Dtype::kBF16, seed++, device);
    const Tensor g = DeviceRandom({tokens, l.out}, Dtype::kBF16, seed++, device);
    const Tensor grad_w = Tensor::Zeros({l.out, l.in}, Dtype::kF32, Device::Cuda(device));
    const Tensor grad_b = Tensor::Zeros({l.out}, Dtype::kF32, Device::Cuda(device));
    auto run = [&] {
      switch (l.fusion) {
        case Fusion::kBias:
          return LinearForward(x, w, b);
        case Fusion::kBiasGelu:
          return LinearGeluForward(x, w, b).out;
        case Fusion::kDGelu:
          return LinearGeluInputGrad(g, w, x);  // x stands for the GELU's input
        case Fusion::kBiasGrad:
          LinearParamGradsInto(g, x, grad_w, grad_b);
          return grad_b;  // (sums keep growing; the diff compares first calls)
      }
      return Tensor();
    };
    // The GEMM's K and N: forward (tokens x in @ in x out), dx (tokens x out @
    // out x in), dW (out x tokens @ tokens x in).
    const int64_t k = l.fusion == Fusion::kDGelu      ? l.out
                      : l.fusion == Fusion::kBiasGrad ? tokens
                                                      : l.in;
    const bool forward = l.fusion == Fusion::kBias || l.fusion == Fusion::kBiasGelu;
    const int64_t n = forward ? l.out : l.in;
    const int64_t fused_before = cuda::GetMatmulCacheStats().epilogues_fused;
    const Tensor fused_out = run().Clone();
    const bool fused = cuda::GetMatmulCacheStats().epilogues_fused > fused_before;
    const double t_fused = TimeCall([&] { run(); });
    cuda::SetMatmulFuseEpilogues(false);
    Zero(grad_w);
    Zero(grad_b);
    const Tensor unfused_out = run().Clone();
    const double t_unfused = TimeCall([&] { run(); });
    cuda::SetMatmulFuseEpilogues(true);
    CheckCuda(cudaStreamSynchronize(cudaStreamPerThread), "sync");
    std::printf("%-22s %6lld %6lld | %9.3f %9.3f | %7.3f %9.2g%s\n", l.name,
                static_cast<long long>(k), static_cast<long long>(n), t_fused * 1e3,
                t_unfused * 1e3, t_unfused / t_fused, MaxDiffHead(fused_out, unfused_out),
                fused ? "" : "  (cuBLASLt declined: not fused)");
    std::fflush(stdout);
  }
}

// What FSDP_CUDA_DGELU_BIAS_GRAD changes in gpt2's MLP backward (bf16, 16384
// tokens): c_fc's bias gradient summed by c_proj's GELU-backward GEMM
// (DGELU_BGRAD), then c_fc's dW a plain GEMM and the sums copied into the
// bias gradient, against the default: the DGELU GEMM, then c_fc's dW with
// BGRADB (cuBLASLt's separate reduction over the 16384 x 3072 gradient). The
// two ways are timed in turn, a sample of --reps calls each; max|diff|
// compares their bias gradients.
void DGeluBiasGrad(int device) {
  const int64_t tokens = 16 * 1024, dim = 768, hidden = 3072;
  const Tensor g = DeviceRandom({tokens, dim}, Dtype::kBF16, 200, device);      // c_proj's dy
  const Tensor w = DeviceRandom({dim, hidden}, Dtype::kBF16, 201, device);      // c_proj's W
  const Tensor pre = DeviceRandom({tokens, hidden}, Dtype::kBF16, 202, device); // GELU input
  const Tensor x = DeviceRandom({tokens, dim}, Dtype::kBF16, 203, device);      // c_fc's x
  const Tensor grad_w = Tensor::Zeros({hidden, dim}, Dtype::kF32, Device::Cuda(device));
  const Tensor grad_b[2] = {Tensor::Zeros({hidden}, Dtype::kF32, Device::Cuda(device)),
                            Tensor::Zeros({hidden}, Dtype::kF32, Device::Cuda(device))};
  bool summed = false;  // whether cuBLASLt ran DGELU_BGRAD
  auto run = [&](int way) {
    Tensor db;  // (hidden) f32
    cuda::SetMatmulDGeluBiasGrad(way == 1);
    const Tensor dpre = LinearGeluInputGrad(g, w, pre, &db);  // (tokens, hidden)
    cuda::SetMatmulDGeluBiasGrad(false);
    summed = db.defined();
    LinearParamGradsInto(dpre, x, grad_w, summed ? Tensor() : grad_b[way], false, false);
    if (summed) {
      Tensor out = grad_b[way];  // a handle: writes its storage
      out.CopyFrom(db);
    }
  };
  std::printf("\nc_fc's bias gradient, bf16, %lld tokens: DGELU + dW with BGRADB (default) "
              "against DGELU_BGRAD + plain dW (FSDP_CUDA_DGELU_BIAS_GRAD=1)\n",
              static_cast<long long>(tokens));
  run(1);
  const bool fused = summed;
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup) * reps; ++i) {
    for (int way : {0, 1}) run(way);
  }
  std::vector<double> ms[2];  // per sample of reps calls: ms a call
  for (int s = 0; s < absl::GetFlag(FLAGS_samples); ++s) {
    for (int way : {0, 1}) ms[way].push_back(bench::EventMs([&] { run(way); }, reps));
  }
  const double t0 = bench::Median(ms[0]), t1 = bench::Median(ms[1]);
  std::printf("%-30s %9.3f ms\n%-30s %9.3f ms  (x%.3f)  max|db diff| %.3g%s\n",
              "dgelu, dW+db (BGRADB)", t0, "dgelu+db (DGELU_BGRAD), dW", t1, t0 / t1,
              MaxDiffHead(grad_b[0], grad_b[1]),
              fused ? "" : "  (cuBLASLt declined DGELU_BGRAD: both ways the default)");
  std::fflush(stdout);
}

int Main() {
  const int device = absl::GetFlag(FLAGS_device);
  if (cuda::DeviceCount() <= device) {
    std::fprintf(stderr, "no CUDA device cuda:%d visible\n", device);
    return 1;
  }
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d); median of %d samples x %d calls, %d warmup samples\n",
              prop.name, prop.major, prop.minor, absl::GetFlag(FLAGS_samples),
              absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_warmup));
  const Case cases[] = {
      {"mlp up    x@W^T", 1024, 768, 3072, true},
      {"mlp down  x@W^T", 1024, 3072, 768, true},
      {"lm head   x@W^T", 8192, 768, 50257, true},
      {"lm head   50304", 8192, 768, 50304, true},
      // What the aligned LM head runs (nn::LinearOptions::align_output_rows):
      // 50257 columns into rows 50304 apart.
      {"lm head   rows64", 8192, 768, 50257, true, 50304},
      {"square    a@b  ", 4096, 4096, 4096, false},
      // gpt2's forward GEMMs at batch 16 x 1024 (the comparison's setting).
      {"gpt2 qkv  x@W^T", 16384, 768, 2304, true},
      {"gpt2 proj x@W^T", 16384, 768, 768, true},
      {"gpt2 up   x@W^T", 16384, 768, 3072, true},
      {"gpt2 down x@W^T", 16384, 3072, 768, true},
      {"gpt2 head rows64", 16384, 768, 50257, true, 50304},
      // The head's input gradient g @ W over the vocabulary as K: GPT-2's and
      // the padded one (nn::LinearOptions::align_output_rows' padded product).
      {"gpt2 head dx    ", 16384, 50257, 768, false},
      {"gpt2 head dx pad", 16384, 50304, 768, false},
  };
  const Precision precisions[] = {
      {"f32 ", Dtype::kF32, false},
      {"tf32", Dtype::kF32, true},
      {"bf16", Dtype::kBF16, false},
  };
  if (absl::GetFlag(FLAGS_epilogues_only)) {
    FusedEpilogues(device);
    DGeluBiasGrad(device);
    return 0;
  }
  // "best of N": the fastest of cuBLASLt's first N heuristic candidates (bf16
  // only), what autotuning the algorithm could gain over the first one.
  std::printf("%-16s %-5s %6s %6s %6s | %9s %9s %9s | %7s %9s | %9s %8s\n", "case", "dtype", "M",
              "K", "N", "Matmul", "Into", "raw Lt", "ours/Lt", "max|diff|", "best of N", "Lt/best");
  std::printf("%-16s %-5s %6s %6s %6s | %9s %9s %9s | %7s %9s | %9s\n", "", "", "", "", "",
              "TFLOP/s", "TFLOP/s", "TFLOP/s", "", "", "TFLOP/s");
  const std::string only_cases = absl::GetFlag(FLAGS_cases);
  std::vector<std::string> only_dtypes;
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    const std::string name(absl::StripAsciiWhitespace(d));
    if (name != "f32" && name != "tf32" && name != "bf16") {
      std::fprintf(stderr, "--dtypes: '%s' is not one of f32, tf32, bf16\n", name.c_str());
      return 2;
    }
    only_dtypes.push_back(name);
  }
  uint64_t seed = 1;
  for (const Precision& p : precisions) {
    const std::string dtype(absl::StripAsciiWhitespace(p.name));
    if (!only_dtypes.empty() &&
        std::find(only_dtypes.begin(), only_dtypes.end(), dtype) == only_dtypes.end()) {
      continue;
    }
    cuda::SetMatmulAllowTf32(p.tf32);
    for (const Case& c : cases) {
      if (!only_cases.empty() && std::string(c.name).find(only_cases) == std::string::npos) continue;
      const Tensor a = DeviceRandom({c.m, c.k}, p.dtype, seed++, device);
      const Tensor b =
          DeviceRandom(c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, p.dtype, seed++, device);
      const MatmulOptions opts{false, c.trans_b, std::nullopt};
      const int64_t ldc = c.ldc > 0 ? c.ldc : c.n;
      const Tensor into =
          Tensor::Empty({c.m, ldc}, p.dtype, Device::Cuda(device)).Narrow(1, 0, c.n);
      const Tensor raw_out =
          Tensor::Empty({c.m, ldc}, p.dtype, Device::Cuda(device)).Narrow(1, 0, c.n);
      RawLt raw(c, p, a, b, raw_out);

      // Matmul allocates a contiguous output: for a padded case it is the
      // same call as Into.
      const double t_ours = c.ldc > 0 ? TimeCall([&] { MatmulInto(a, b, into, opts); })
                                      : TimeCall([&] { Matmul(a, b, opts); });
      const double t_into = TimeCall([&] { MatmulInto(a, b, into, opts); });
      const double t_raw = TimeCall([&] { raw.Run(); });
      CheckCuda(cudaStreamSynchronize(cudaStreamPerThread), "sync");
      const double diff = MaxDiffHead(into, raw_out);

      const double flops = 2.0 * c.m * c.n * c.k;
      std::printf("%-16s %-5s %6lld %6lld %6lld | %9.1f %9.1f %9.1f | %7.3f %9.2g", c.name, p.name,
                  static_cast<long long>(c.m), static_cast<long long>(c.k),
                  static_cast<long long>(c.n), flops / t_ours * 1e-12, flops / t_into * 1e-12,
                  flops / t_raw * 1e-12, t_raw / t_ours, diff);
      if (p.dtype == Dtype::kBF16) {
        const auto [t_best, index] = BestCandidate(raw, t_raw);
        std::printf(" | %9.1f %7.3f  (#%zu of %zu)", flops / t_best * 1e-12, t_best / t_raw, index,
                    raw.candidates());
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  cuda::SetMatmulAllowTf32(false);
  if (only_cases.empty()) {
    FusedEpilogues(device);
    DGeluBiasGrad(device);
  }
  const cuda::MatmulCacheStats stats = cuda::GetMatmulCacheStats();
  std::printf("descriptor cache: %lld entries, %lld hits, %lld misses\n",
              static_cast<long long>(stats.entries), static_cast<long long>(stats.hits),
              static_cast<long long>(stats.misses));
  return 0;
}

}  // namespace
}  // namespace tensor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tensor::Main();
}
