// Benchmarks of the CPU tensor ops. GEMM: tensor::Matmul / MatmulInto against
// the raw oneDNN matmul primitive (created once, outside the timing loop) at
// transformer shapes, in GFLOP/s (2*M*N*K per iteration): separately, and
// paired (alternating in one loop, steadier on a shared machine), with a
// summary table of ours / raw at the end. Also: what OpenMP spinning after a
// GEMM costs our thread pool, and the per-call cost of tiny GEMMs; layer norm
// (forward, backward) and softmax (causal attention scores, LM-head logits) in
// GB/s against a memcpy of the same bytes, with a second summary table; and
// allocating + touching + freeing a 200 MB block with and without the CPU
// caching allocator.
//
//   ./bazelw run -c opt //tensor:ops_benchmark -- --benchmark_min_time=0.5
//   (--benchmark_repetitions=3: the summary then uses the medians)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/cpu/matmul.h"
#include "tensor/cpu_allocator.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/norm.h"
#include "tensor/ops/softmax.h"
#include "tensor/tensor.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace {

// C (M, N) = A (M, K) @ B, with B (K, N), or B (N, K) used transposed.
struct GemmShape {
  const char* name;
  int64_t m, n, k;
  bool trans_b;
};

constexpr GemmShape kShapes[] = {
    {"attn_qkv 1024x768*768x3072", 1024, 3072, 768, false},
    {"mlp_proj 1024x3072*3072x768", 1024, 768, 3072, false},
    {"lm_head 1024x768*(50257x768)^T", 1024, 50257, 768, true},
    {"cube 2048x2048*2048x2048", 2048, 2048, 2048, false},
};

// Uniform values in [-1, 1) from a fixed LCG, converted to dtype.
Tensor Random(const Shape& shape, uint64_t seed, Dtype dtype) {
  std::vector<float> v(shape.numel());
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
  return Tensor::FromVector(v, shape, dtype);
}

struct GemmInputs {
  Tensor a;  // (M, K)
  Tensor b;  // (K, N), or (N, K) with trans_b
};

GemmInputs MakeInputs(const GemmShape& s, Dtype dtype) {
  return {Random({s.m, s.k}, 1, dtype),
          Random(s.trans_b ? Shape{s.n, s.k} : Shape{s.k, s.n}, 2, dtype)};
}

void SetGflops(benchmark::State& state, const GemmShape& s) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}

// Ours into a preallocated output: what a layer's forward and backward do.
void BM_OursInto(benchmark::State& state, GemmShape s, Dtype dtype) {
  const GemmInputs in = MakeInputs(s, dtype);
  Tensor out = Tensor::Empty({s.m, s.n}, dtype);
  const MatmulOptions opts{false, s.trans_b};
  MatmulInto(in.a, in.b, out, opts);  // creates and caches the primitive
  const cpu::GemmCacheStats before = cpu::GetGemmCacheStats();
  for (auto _ : state) {
    MatmulInto(in.a, in.b, out, opts);
    benchmark::DoNotOptimize(out.raw_data());
  }
  if (cpu::GetGemmCacheStats().misses != before.misses)
    state.SkipWithError("primitive cache missed");
  state.SetLabel(cpu::LastGemmPath());
  SetGflops(state, s);
}

// Ours allocating the output each call (Matmul).
void BM_OursAlloc(benchmark::State& state, GemmShape s, Dtype dtype) {
  const GemmInputs in = MakeInputs(s, dtype);
  const MatmulOptions opts{false, s.trans_b};
  Matmul(in.a, in.b, opts);
  for (auto _ : state) {
    Tensor out = Matmul(in.a, in.b, opts);
    benchmark::DoNotOptimize(out.raw_data());
  }
  state.SetLabel(cpu::LastGemmPath());
  SetGflops(state, s);
}

// The raw library call: one oneDNN matmul primitive with default attributes
// and its memory objects, made once; Run() only executes it.
class RawOneDnnGemm {
 public:
  RawOneDnnGemm(const GemmShape& s, Dtype dtype, const GemmInputs& in, const Tensor& out)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using dt = dnnl::memory::data_type;
    const dt t = dtype == Dtype::kBF16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc a_md({s.m, s.k}, t, {s.k, 1});
    const dnnl::memory::desc b_md(
        {s.k, s.n}, t, s.trans_b ? dnnl::memory::dims{1, s.k} : dnnl::memory::dims{s.n, 1});
    const dnnl::memory::desc c_md({s.m, s.n}, t, {s.n, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine_);
    impl_ = std::string("onednn:") + pd.impl_info_str();
    matmul_ = dnnl::matmul(pd);
    args_ = {
        {DNNL_ARG_SRC, dnnl::memory(a_md, engine_, in.a.raw_data())},
        {DNNL_ARG_WEIGHTS, dnnl::memory(b_md, engine_, in.b.raw_data())},
        {DNNL_ARG_DST, dnnl::memory(c_md, engine_, out.raw_data())},
    };
  }

  void Run() {
    matmul_.execute(stream_, args_);
    stream_.wait();
  }

  const std::string& impl() const { return impl_; }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul matmul_;
  std::unordered_map<int, dnnl::memory> args_;
  std::string impl_;
};

void BM_RawOneDnn(benchmark::State& state, GemmShape s, Dtype dtype) {
  const GemmInputs in = MakeInputs(s, dtype);
  const Tensor out = Tensor::Empty({s.m, s.n}, dtype);
  RawOneDnnGemm raw(s, dtype, in, out);
  raw.Run();
  for (auto _ : state) raw.Run();
  state.SetLabel(raw.impl());
  SetGflops(state, s);
}

// Runs `first` and `second` alternately inside the benchmark loop (which of
// them goes first alternates too, to cancel order effects), each timed on its
// own: on a machine shared with other work both see the same interference,
// so their ratio is steadier than that of two separate benchmarks. Returns
// the seconds each took in all.
std::pair<double, double> TimePaired(benchmark::State& state, const std::function<void()>& first,
                                     const std::function<void()>& second) {
  first();
  second();
  double first_seconds = 0, second_seconds = 0;
  int64_t i = 0;
  for (auto _ : state) {
    using Clock = std::chrono::steady_clock;
    const bool in_order = (i++ % 2) == 0;
    const auto t0 = Clock::now();
    in_order ? first() : second();
    const auto t1 = Clock::now();
    in_order ? second() : first();
    const auto t2 = Clock::now();
    const double a = std::chrono::duration<double>(t1 - t0).count();
    const double b = std::chrono::duration<double>(t2 - t1).count();
    first_seconds += in_order ? a : b;
    second_seconds += in_order ? b : a;
    state.SetIterationTime(a + b);
  }
  return {first_seconds, second_seconds};
}

// Raw and ours (MatmulInto), paired (TimePaired).
void BM_Paired(benchmark::State& state, GemmShape s, Dtype dtype) {
  const GemmInputs in = MakeInputs(s, dtype);
  const Tensor raw_out = Tensor::Empty({s.m, s.n}, dtype);
  Tensor our_out = Tensor::Empty({s.m, s.n}, dtype);
  RawOneDnnGemm raw(s, dtype, in, raw_out);
  const MatmulOptions opts{false, s.trans_b};
  const auto [raw_seconds, our_seconds] = TimePaired(
      state, [&] { raw.Run(); }, [&] { MatmulInto(in.a, in.b, our_out, opts); });
  const double gflop = 2.0 * s.m * s.n * s.k * 1e-9 * static_cast<double>(state.iterations());
  state.counters["raw GFLOP/s"] = gflop / raw_seconds;
  state.counters["ours GFLOP/s"] = gflop / our_seconds;
  state.counters["ours/raw"] = raw_seconds / our_seconds;
}

// Attention's y (B, nh, T, hs) = P (B, nh, T, T) @ V for the projection
// after it, which reads (B, T, nh * hs): written there directly by
// MatmulInto into the interleaved-heads view ("in place"), against the
// contiguous product then the head-merging copy ("then copy"), paired.
void BM_HeadsInPlacePaired(benchmark::State& state, Dtype dtype) {
  constexpr int64_t B = 4, nh = 12, T = 256, hs = 64;
  const Tensor p = Random({B, nh, T, T}, 5, dtype);
  const Tensor v = Random({B, T, nh * hs}, 6, dtype).View({B, T, nh, hs}).Transpose(1, 2);
  const Tensor merged = Tensor::Empty({B, T, nh * hs}, dtype);  // the projection's input
  Tensor heads = merged.View({B, T, nh, hs}).Transpose(1, 2);   // (B, nh, T, hs) view
  const Tensor contiguous = Tensor::Empty({B, nh, T, hs}, dtype);
  const auto [in_place, then_copy] = TimePaired(
      state, [&] { MatmulInto(p, v, heads); },
      [&] {
        MatmulInto(p, v, contiguous);
        heads.CopyFrom(contiguous);
      });
  const double n = static_cast<double>(state.iterations());
  state.counters["in place ms"] = 1e3 * in_place / n;
  state.counters["then copy ms"] = 1e3 * then_copy / n;
  state.counters["copy/in place"] = then_copy / in_place;
}

// A Linear layer's forward at gpt-mini's shapes (16 x 128 rows, C = 192,
// the MLP's 4C outputs): the bias in the GEMM (LinearForward: oneDNN's bias
// argument) against the product then AddBias, paired.
void BM_LinearBiasPaired(benchmark::State& state, Dtype dtype) {
  constexpr int64_t N = 16 * 128, K = 192, M = 4 * 192;
  const Tensor x = Random({N, K}, 7, dtype);
  const Tensor w = Random({M, K}, 8, dtype);
  const Tensor b = Random({M}, 9, dtype);
  MatmulOptions tb;
  tb.trans_b = true;
  const auto [fused, separate] = TimePaired(
      state, [&] { benchmark::DoNotOptimize(LinearForward(x, w, b).raw_data()); },
      [&] { benchmark::DoNotOptimize(AddBias(Matmul(x, w, tb), b).raw_data()); });
  const double n = static_cast<double>(state.iterations());
  state.counters["in GEMM ms"] = 1e3 * fused / n;
  state.counters["then AddBias ms"] = 1e3 * separate / n;
  state.counters["AddBias/in GEMM"] = separate / fused;
}

// A compute-bound ParallelFor on our pool (64K elements of exp/tanh), timed
// right after a 256^3 f32 GEMM and again after a 10 ms pause (when no OpenMP
// worker can still be spinning), in the same iteration so that both see the
// same machine. after/alone near 1 means the GEMM's OpenMP team leaves our
// pool alone; run once as is and once with FSDP_OMP_SPIN=default to see what
// the spin throttle in tensor/cpu/matmul.cc buys.
void BM_ParallelForAfterGemm(benchmark::State& state) {
  const Tensor a = Random({256, 256}, 3, Dtype::kF32);
  const Tensor b = Random({256, 256}, 4, Dtype::kF32);
  Tensor c = Tensor::Empty({256, 256});
  std::vector<float> x(1 << 16, 0.5f);
  using Clock = std::chrono::steady_clock;
  auto timed_parallel_for = [&] {
    const auto start = Clock::now();
    ParallelFor(static_cast<int64_t>(x.size()), 1 << 10, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) x[i] = std::tanh(std::exp(x[i] * 0.5f) * 0.3f);
    });
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  MatmulInto(a, b, c);
  double after = 0;
  double alone = 0;
  for (auto _ : state) {
    MatmulInto(a, b, c);
    const double t_after = timed_parallel_for();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double t_alone = timed_parallel_for();
    after += t_after;
    alone += t_alone;
    state.SetIterationTime(t_after + t_alone);
    benchmark::DoNotOptimize(x.data());
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["after_gemm_us"] = 1e6 * after / n;
  state.counters["alone_us"] = 1e6 * alone / n;
  state.counters["after/alone"] = after / alone;
}

// Back-to-back tiny GEMMs (64^3): the fixed cost per call, where waking the
// OpenMP worker (futex) shows; the price of the spin throttle.
void BM_SmallGemm(benchmark::State& state, Dtype dtype) {
  const Tensor a = Random({64, 64}, 5, dtype);
  const Tensor b = Random({64, 64}, 6, dtype);
  Tensor c = Tensor::Empty({64, 64}, dtype);
  MatmulInto(a, b, c);
  for (auto _ : state) MatmulInto(a, b, c);
  SetGflops(state, {"small", 64, 64, 64, false});
}

// ---- Layer norm and softmax: bandwidth ----
// Memory-bound kernels in GB/s of the tensors they read and write (each counted
// once), next to a memcpy that moves the same bytes (half read, half written),
// on our thread pool as the kernels are: the bandwidth they could reach. The
// causal softmax counts its whole (T, T) input although it reads only the
// unmasked part (it writes every element), so its GB/s is an effective rate.
enum class BwKind {
  kLayerNormForward,
  kLayerNormBackward,
  kSoftmaxForward,
  kSoftmaxBackward,
  kCrossEntropyInPlace,
};

struct BwCase {
  std::string name;
  BwKind kind;
  Shape shape;  // LayerNorm (rows, C); softmax (..., cols), causal: (B*nh, T, T)
  bool causal;
  Dtype dtype;
};

// The bytes a case reads and writes, from its shape (checked against the
// tensors in the benchmark).
int64_t TrafficBytes(const BwCase& c) {
  const int64_t e = DtypeSize(c.dtype);
  const int64_t numel = c.shape.numel();
  const int64_t cols = c.shape.dim(-1);
  const int64_t rows = numel / cols;
  switch (c.kind) {
    case BwKind::kLayerNormForward:  // x, weight, bias -> y, mean, rstd
      return 2 * numel * e + 2 * cols * 4 + 2 * rows * 4;
    case BwKind::kLayerNormBackward:  // grad_y, x, weight, mean, rstd -> grad_x, grad_w, grad_b
      return 3 * numel * e + 3 * cols * 4 + 2 * rows * 4;
    case BwKind::kSoftmaxForward:  // x -> y
      return 2 * numel * e;
    case BwKind::kSoftmaxBackward:  // grad_y, y -> grad_x
      return 3 * numel * e;
    case BwKind::kCrossEntropyInPlace:  // logits -> their gradient (in place), targets, lse
      return 2 * numel * e + rows * 8 + rows * 4;
  }
  return 0;
}

int64_t TotalBytes(std::initializer_list<Tensor> tensors) {
  int64_t total = 0;
  for (const Tensor& t : tensors) total += t.nbytes();
  return total;
}

void BM_Bandwidth(benchmark::State& state, BwCase c) {
  const int64_t cols = c.shape.dim(-1);
  const Tensor x = Random(c.shape, 7, c.dtype);
  int64_t bytes = 0;
  switch (c.kind) {
    case BwKind::kLayerNormForward:
    case BwKind::kLayerNormBackward: {
      const Tensor w = Random({cols}, 8, Dtype::kF32);
      const Tensor b = Random({cols}, 9, Dtype::kF32);
      const LayerNormResult fwd = LayerNorm(x, w, b);
      if (c.kind == BwKind::kLayerNormForward) {
        bytes = TotalBytes({x, w, b, fwd.y, fwd.mean, fwd.rstd});
        for (auto _ : state) {
          const LayerNormResult r = LayerNorm(x, w, b);
          benchmark::DoNotOptimize(r.y.raw_data());
        }
      } else {
        const Tensor gy = Random(c.shape, 10, c.dtype);
        const LayerNormGrads g0 = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
        bytes = TotalBytes({gy, x, w, fwd.mean, fwd.rstd, g0.grad_x, g0.grad_weight,
                            g0.grad_bias});
        for (auto _ : state) {
          const LayerNormGrads g = LayerNormBackward(gy, x, w, fwd.mean, fwd.rstd);
          benchmark::DoNotOptimize(g.grad_x.raw_data());
        }
      }
      break;
    }
    case BwKind::kCrossEntropyInPlace: {
      // The LM head's loss and gradient (llm.c style, in place). Each
      // iteration runs on the previous one's output: the work per element
      // does not depend on the values.
      std::vector<int64_t> ids(x.numel() / cols);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919) % cols;
      const Tensor targets = Tensor::FromData<int64_t>(ids, {static_cast<int64_t>(ids.size())});
      const CrossEntropyResult r0 = CrossEntropyForwardBackwardInPlace(x, targets);
      bytes = TotalBytes({x, x, targets, r0.lse});
      for (auto _ : state) {
        const CrossEntropyResult r = CrossEntropyForwardBackwardInPlace(x, targets);
        benchmark::DoNotOptimize(r.lse.raw_data());
      }
      break;
    }
    case BwKind::kSoftmaxForward:
    case BwKind::kSoftmaxBackward: {
      SoftmaxOptions opts;
      opts.causal = c.causal;
      opts.scale = c.causal ? 0.125f : 1.0f;  // 1/sqrt(head_dim 64) for attention scores
      if (c.kind == BwKind::kSoftmaxForward) {
        const Tensor y = Tensor::Empty(c.shape, c.dtype);
        SoftmaxInto(x, y, opts);
        bytes = TotalBytes({x, y});
        for (auto _ : state) {
          SoftmaxInto(x, y, opts);
          benchmark::DoNotOptimize(y.raw_data());
        }
      } else {
        const Tensor y = Softmax(x, opts);
        const Tensor gy = Random(c.shape, 11, c.dtype);
        const Tensor gx0 = SoftmaxBackward(gy, y, opts);
        bytes = TotalBytes({gy, y, gx0});
        for (auto _ : state) {
          const Tensor gx = SoftmaxBackward(gy, y, opts);
          benchmark::DoNotOptimize(gx.raw_data());
        }
      }
      break;
    }
  }
  if (bytes != TrafficBytes(c)) state.SkipWithError("traffic bytes do not match the tensors");
  state.SetBytesProcessed(state.iterations() * bytes);
}

// memcpy of traffic / 2 bytes (so traffic bytes move: read + write), split
// over our thread pool in 256 KiB chunks, or on one thread.
void BM_Memcpy(benchmark::State& state, int64_t traffic, bool pool) {
  const int64_t n = traffic / 2;
  std::vector<unsigned char> src(n, 1), dst(n, 0);
  for (auto _ : state) {
    if (pool) {
      ParallelFor(n, int64_t{256} << 10, [&](int64_t begin, int64_t end) {
        std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
      });
    } else {
      std::memcpy(dst.data(), src.data(), n);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * n);
}

std::vector<BwCase> BandwidthCases() {
  std::vector<BwCase> cases;
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const std::string dt(DtypeName(dtype));
    // GPT-2 small: B=8, T=1024, C=768; attention B*nh = 8*12 heads at T=256;
    // the LM head's softmax over a (B*T = 8*128, vocab 50257) logits matrix.
    cases.push_back({"LayerNorm/fwd/8192x768/" + dt, BwKind::kLayerNormForward,
                     {8 * 1024, 768}, false, dtype});
    cases.push_back({"LayerNorm/bwd/8192x768/" + dt, BwKind::kLayerNormBackward,
                     {8 * 1024, 768}, false, dtype});
    cases.push_back({"Softmax/fwd/causal_96x256x256/" + dt, BwKind::kSoftmaxForward,
                     {8 * 12, 256, 256}, true, dtype});
    cases.push_back({"Softmax/bwd/causal_96x256x256/" + dt, BwKind::kSoftmaxBackward,
                     {8 * 12, 256, 256}, true, dtype});
    cases.push_back({"Softmax/fwd/1024x50257/" + dt, BwKind::kSoftmaxForward,
                     {8 * 128, 50257}, false, dtype});
    cases.push_back({"CrossEntropyInPlace/1024x50257/" + dt,
                     BwKind::kCrossEntropyInPlace,
                     {8 * 128, 50257},
                     false,
                     dtype});
  }
  return cases;
}

std::string MemcpyName(int64_t traffic, bool pool) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "Memcpy/%.1fMB/%s", traffic * 1e-6, pool ? "pool" : "1thread");
  return buf;
}

void RegisterBandwidthBenchmarks() {
  std::vector<std::string> registered;  // one memcpy per size to 0.1 MB
  for (const BwCase& c : BandwidthCases()) {
    benchmark::RegisterBenchmark(c.name.c_str(), BM_Bandwidth, c)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    const int64_t traffic = TrafficBytes(c);
    const std::string name = MemcpyName(traffic, true);
    if (std::find(registered.begin(), registered.end(), name) != registered.end()) continue;
    registered.push_back(name);
    for (const bool pool : {true, false}) {
      benchmark::RegisterBenchmark(MemcpyName(traffic, pool).c_str(), BM_Memcpy, traffic, pool)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
}

// ---- Allocation of a large tensor ----
// Allocating a 200 MB block, touching it (one write per 4 KiB page: the page
// faults a fresh mapping costs) or filling it (what an op writing its output
// does), and freeing it. The CPU caching allocator (tensor/cpu_allocator.h)
// against the system allocator (cap 0: aligned_alloc / free, as before it).
constexpr int64_t kAllocBytes = 200'000'000;

void TouchPages(void* p, int64_t bytes) {
  char* c = static_cast<char*>(p);
  for (int64_t i = 0; i < bytes; i += 4096) c[i] = 1;
}

void BM_AllocTouchFree(benchmark::State& state, bool cache, bool fill) {
  CpuCacheOptions options;
  options.cap_bytes = cache ? options.cap_bytes : 0;
  CpuCachingAllocator alloc(options);
  for (auto _ : state) {
    void* p = alloc.Allocate(kAllocBytes);
    if (fill) {
      std::memset(p, 1, kAllocBytes);
    } else {
      TouchPages(p, kAllocBytes);
    }
    benchmark::ClobberMemory();
    alloc.Deallocate(p, kAllocBytes);
  }
  const CpuCacheStats s = alloc.Stats();
  state.counters["hits"] = static_cast<double>(s.hits);
  state.counters["misses"] = static_cast<double>(s.misses);
  state.SetBytesProcessed(state.iterations() * kAllocBytes);
}

// Zeroing a gradient-sized f32 tensor (48 MiB, gpt-mini's with vocab 50257)
// right after reading it, as ZeroGrad follows the optimizer's step: the time
// of both, the read alone timed separately ("ReadOnly").
void BM_ZeroAfterRead(benchmark::State& state, bool zero) {
  const Tensor t = Tensor::Full({12 << 20}, 1.0);
  for (auto _ : state) {
    double sum = 0;  // the step's read, per thread chunk
    ParallelFor(t.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      const float* p = t.data<float>();
      float s = 0;
      for (int64_t i = b; i < e; ++i) s += p[i];
      benchmark::DoNotOptimize(s);
    });
    benchmark::DoNotOptimize(sum);
    if (zero) Zero(t);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * t.nbytes() * (zero ? 2 : 1));
}

// The same through Tensor::Empty and the process allocator (so it follows
// FSDP_CPU_CACHE_MB: run once with FSDP_CPU_CACHE_MB=0 for the uncached time).
void BM_TensorAllocTouchFree(benchmark::State& state) {
  for (auto _ : state) {
    Tensor t = Tensor::Empty({kAllocBytes / 4});
    TouchPages(t.raw_data(), t.nbytes());
    benchmark::ClobberMemory();
  }
  const int64_t cap = ProcessCpuAllocator().options().cap_bytes;
  state.SetLabel(cap == 0 ? "process allocator, caching off" : "process allocator, caching on");
  state.SetBytesProcessed(state.iterations() * kAllocBytes);
}

void RegisterAllocBenchmarks() {
  for (const bool fill : {false, true}) {
    for (const bool cache : {false, true}) {
      const std::string name = std::string("Alloc200MB/") + (fill ? "fill" : "touch") + "/" +
                               (cache ? "cached" : "system");
      benchmark::RegisterBenchmark(name.c_str(), BM_AllocTouchFree, cache, fill)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("ZeroAfterRead/48MiB", BM_ZeroAfterRead, true)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("ZeroAfterRead/48MiB/ReadOnly", BM_ZeroAfterRead, false)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("Alloc200MB/touch/tensor", BM_TensorAllocTouchFree)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

void RegisterGemmBenchmarks() {
  for (const GemmShape& s : kShapes) {
    for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
      const std::string prefix =
          std::string("Gemm/") + s.name + "/" + std::string(DtypeName(dtype));
      // Raw and ours next to each other, so they see the same machine state.
      benchmark::RegisterBenchmark((prefix + "/raw").c_str(), BM_RawOneDnn, s, dtype)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark((prefix + "/ours_into").c_str(), BM_OursInto, s, dtype)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark((prefix + "/ours_alloc").c_str(), BM_OursAlloc, s, dtype)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark((prefix + "/paired").c_str(), BM_Paired, s, dtype)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
    }
  }
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    benchmark::RegisterBenchmark(
        ("HeadsInPlace/4x12x256x64/" + std::string(DtypeName(dtype))).c_str(),
        BM_HeadsInPlacePaired, dtype)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
    benchmark::RegisterBenchmark(
        ("LinearBias/2048x192x768/" + std::string(DtypeName(dtype))).c_str(), BM_LinearBiasPaired,
        dtype)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
  benchmark::RegisterBenchmark("ParallelForAfterGemm", BM_ParallelForAfterGemm)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("SmallGemm64/f32", BM_SmallGemm, Dtype::kF32)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("SmallGemm64/bf16", BM_SmallGemm, Dtype::kBF16)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

// The console output, plus GFLOP/s kept per benchmark for the summary (the
// median when repetitions are on).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  using benchmark::ConsoleReporter::ConsoleReporter;

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.run_type == Run::RT_Aggregate && !median) continue;
      const std::string name = run.run_name.function_name;
      if (!median && has_median_.count(name)) continue;
      if (median) has_median_[name] = true;
      for (const auto& [counter, value] : run.counters) values_[name + "#" + counter] = value.value;
    }
  }

  // Separate runs: raw, ours_into, ours_alloc and their ratios to raw; paired
  // runs: raw and ours alternating, and their ratio.
  // A table whose benchmarks did not run (--benchmark_filter,
  // --benchmark_list_tests) is left out.
  void PrintSummary() const {
    bool gemm_header = false;
    for (const GemmShape& s : kShapes) {
      for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
        const std::string prefix =
            std::string("Gemm/") + s.name + "/" + std::string(DtypeName(dtype));
        const double raw = Get(prefix + "/raw#GFLOP/s");
        const double into = Get(prefix + "/ours_into#GFLOP/s");
        const double alloc = Get(prefix + "/ours_alloc#GFLOP/s");
        const double p_raw = Get(prefix + "/paired#raw GFLOP/s");
        const double p_ours = Get(prefix + "/paired#ours GFLOP/s");
        const double p_ratio = Get(prefix + "/paired#ours/raw");
        if (raw <= 0 && p_raw <= 0) continue;
        if (!gemm_header) {
          gemm_header = true;
          std::printf("\nGEMM GFLOP/s: ours vs the raw oneDNN primitive\n");
          std::printf("%-32s %-5s|%8s %9s %7s %10s %7s|%8s %8s %7s\n", "shape", "dtype", "raw",
                      "ours_into", "ratio", "ours_alloc", "ratio", "p.raw", "p.ours", "p.ratio");
        }
        std::printf("%-32s %-5s|%8.1f %9.1f %6.1f%% %10.1f %6.1f%%|%8.1f %8.1f %6.1f%%\n", s.name,
                    std::string(DtypeName(dtype)).c_str(), raw, into, Percent(into, raw), alloc,
                    Percent(alloc, raw), p_raw, p_ours, 100 * p_ratio);
      }
    }

    bool bw_header = false;
    for (const BwCase& c : BandwidthCases()) {
      const double bw = Get(c.name + "#bytes_per_second") * 1e-9;
      const double ref = Get(MemcpyName(TrafficBytes(c), true) + "#bytes_per_second") * 1e-9;
      if (bw <= 0) continue;
      if (!bw_header) {
        bw_header = true;
        std::printf("\nLayer norm / softmax bandwidth (GB/s = 1e9 bytes/s read + written) vs "
                    "memcpy of the same bytes on the pool\n");
        std::printf("%-36s %9s %10s %8s\n", "kernel", "GB/s", "memcpy", "ratio");
      }
      if (ref <= 0) {  // the memcpy of the same bytes was filtered out
        std::printf("%-36s %9.2f %10s %8s\n", c.name.c_str(), bw, "-", "-");
      } else {
        std::printf("%-36s %9.2f %10.2f %7.1f%%\n", c.name.c_str(), bw, ref, Percent(bw, ref));
      }
    }
  }

 private:
  static double Percent(double x, double of) { return of > 0 ? 100 * x / of : 0.0; }
  double Get(const std::string& key) const {
    auto it = values_.find(key);
    return it == values_.end() ? 0.0 : it->second;
  }
  std::map<std::string, double> values_;
  std::map<std::string, bool> has_median_;
};

}  // namespace
}  // namespace tensor

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tensor::RegisterGemmBenchmarks();
  tensor::RegisterBandwidthBenchmarks();
  tensor::RegisterAllocBenchmarks();
  tensor::SummaryReporter reporter(isatty(STDOUT_FILENO)
                                       ? benchmark::ConsoleReporter::OO_ColorTabular
                                       : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
