// Benchmarks of the CPU tensor ops. GEMM: tensor::Matmul / MatmulInto against
// the raw oneDNN matmul primitive (created once, outside the timing loop) at
// transformer shapes, in GFLOP/s (2*M*N*K per iteration): separately, and
// paired (alternating in one loop, steadier on a shared machine), with a
// summary table of ours / raw at the end. Also: what OpenMP spinning after a
// GEMM costs our thread pool, and the per-call cost of tiny GEMMs.
//
//   ./bazelw run -c opt //tensor:ops_benchmark -- --benchmark_min_time=0.5
//   (--benchmark_repetitions=3: the summary then uses the medians)
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "benchmark/benchmark.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/cpu/matmul.h"
#include "tensor/ops/matmul.h"
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

// Raw and ours (MatmulInto) alternating inside one loop, each timed on its
// own: on a machine shared with other work both see the same interference, so
// their ratio is steadier than the ratio of two separate benchmarks.
void BM_Paired(benchmark::State& state, GemmShape s, Dtype dtype) {
  const GemmInputs in = MakeInputs(s, dtype);
  const Tensor raw_out = Tensor::Empty({s.m, s.n}, dtype);
  Tensor our_out = Tensor::Empty({s.m, s.n}, dtype);
  RawOneDnnGemm raw(s, dtype, in, raw_out);
  const MatmulOptions opts{false, s.trans_b};
  raw.Run();
  MatmulInto(in.a, in.b, our_out, opts);
  double raw_seconds = 0;
  double our_seconds = 0;
  int64_t i = 0;
  for (auto _ : state) {
    using Clock = std::chrono::steady_clock;
    const bool raw_first = (i++ % 2) == 0;  // alternate to cancel order effects
    const auto t0 = Clock::now();
    if (raw_first) {
      raw.Run();
    } else {
      MatmulInto(in.a, in.b, our_out, opts);
    }
    const auto t1 = Clock::now();
    if (raw_first) {
      MatmulInto(in.a, in.b, our_out, opts);
    } else {
      raw.Run();
    }
    const auto t2 = Clock::now();
    const double first = std::chrono::duration<double>(t1 - t0).count();
    const double second = std::chrono::duration<double>(t2 - t1).count();
    raw_seconds += raw_first ? first : second;
    our_seconds += raw_first ? second : first;
    state.SetIterationTime(first + second);
  }
  const double gflop = 2.0 * s.m * s.n * s.k * 1e-9 * static_cast<double>(state.iterations());
  state.counters["raw GFLOP/s"] = gflop / raw_seconds;
  state.counters["ours GFLOP/s"] = gflop / our_seconds;
  state.counters["ours/raw"] = raw_seconds / our_seconds;
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

// Layer norm and softmax benchmarks: added with those ops.

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
  void PrintSummary() const {
    std::printf("\nGEMM GFLOP/s: ours vs the raw oneDNN primitive\n");
    std::printf("%-32s %-5s|%8s %9s %7s %10s %7s|%8s %8s %7s\n", "shape", "dtype", "raw",
                "ours_into", "ratio", "ours_alloc", "ratio", "p.raw", "p.ours", "p.ratio");
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
        std::printf("%-32s %-5s|%8.1f %9.1f %6.1f%% %10.1f %6.1f%%|%8.1f %8.1f %6.1f%%\n", s.name,
                    std::string(DtypeName(dtype)).c_str(), raw, into, Percent(into, raw), alloc,
                    Percent(alloc, raw), p_raw, p_ours, 100 * p_ratio);
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
  tensor::SummaryReporter reporter(isatty(STDOUT_FILENO)
                                       ? benchmark::ConsoleReporter::OO_ColorTabular
                                       : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
