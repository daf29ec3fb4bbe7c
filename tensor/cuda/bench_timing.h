// What the GPU benchmarks of tensor/cuda share: exiting on a CUDA error with
// the call's name, timing calls between two CUDA events, medians, positive
// integer arguments, and the main() of the ones taking [rounds] [calls].
#ifndef TENSOR_CUDA_BENCH_TIMING_H_
#define TENSOR_CUDA_BENCH_TIMING_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace tensor {
namespace bench {

// Exits with "what: CUDA's message" unless err is cudaSuccess.
inline void CheckCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// Milliseconds a call: `calls` calls of fn between two events on `stream`
// (no warm-up: callers that need one make it).
inline double EventMs(const std::function<void()>& fn, int calls,
                      cudaStream_t stream = cudaStreamPerThread) {
  cudaEvent_t start, stop;
  CheckCuda(cudaEventCreate(&start), "cudaEventCreate");
  CheckCuda(cudaEventCreate(&stop), "cudaEventCreate");
  CheckCuda(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < calls; ++i) fn();
  CheckCuda(cudaEventRecord(stop, stream), "cudaEventRecord");
  CheckCuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.0f;
  CheckCuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / calls;
}

// The median (the upper one of an even count); v must not be empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// argv[i] as a positive integer, or `fallback` when there is no argv[i];
// anything else exits (status 2) naming the argument and printing `usage`.
inline int64_t PositiveArg(int argc, char** argv, int i, const char* name, int64_t fallback,
                           const char* usage) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v <= 0) {
    std::fprintf(stderr, "%s must be a positive integer, got '%s'\nusage: %s\n", name, argv[i],
                 usage);
    std::exit(2);
  }
  return v;
}

// main() of a benchmark run as `name [rounds] [calls]`: both positive (these
// defaults when absent); exits 1 without a CUDA device, else returns
// run(rounds, calls).
inline int RoundsAndCallsMain(int argc, char** argv, const char* name, int rounds, int calls,
                              int (*run)(int rounds, int calls)) {
  const std::string usage = std::string(name) + " [rounds] [calls]";
  rounds = static_cast<int>(PositiveArg(argc, argv, 1, "rounds", rounds, usage.c_str()));
  calls = static_cast<int>(PositiveArg(argc, argv, 2, "calls", calls, usage.c_str()));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "%s: no CUDA device visible\n", name);
    return 1;
  }
  return run(rounds, calls);
}

}  // namespace bench
}  // namespace tensor

#endif  // TENSOR_CUDA_BENCH_TIMING_H_
