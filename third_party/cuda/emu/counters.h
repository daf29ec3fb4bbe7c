// What a program asked of the emulated GPU that costs time on a real one
// beyond the kernels' own work: launches, allocations, copies, and the calls
// after which the host waits for the GPU to drain its queue. Tests read the
// counters around a training step to pin that a steady-state step allocates
// no device memory and synchronizes a bounded number of times (a real GPU
// idles from each synchronization until the host queues the next kernel).
#ifndef THIRD_PARTY_CUDA_EMU_COUNTERS_H_
#define THIRD_PARTY_CUDA_EMU_COUNTERS_H_

#include <cstdint>
#include <functional>
#include <string>

namespace cuda_emu {

struct Counters {
  int64_t kernel_launches = 0;   // <<<...>>> launches and cuBLASLt matmuls
  int64_t host_syncs = 0;        // the host waited while GPU work it queued was unfinished:
                                 // synchronizations, cudaFree, blocking copies (runtime.cc)
  int64_t device_allocs = 0;     // cudaMalloc
  int64_t device_frees = 0;      // cudaFree (which also synchronizes the device)
  int64_t pinned_allocs = 0;     // cudaHostAlloc / cudaMallocHost
  int64_t copies_to_host = 0;    // device -> host copies, synchronous or not
  int64_t copies_to_device = 0;  // host -> device copies, synchronous or not
  int64_t memsets = 0;           // cudaMemset / cudaMemsetAsync (a kernel on a real GPU)

  Counters operator-(const Counters& earlier) const;
  std::string ToString() const;  // "launches 12, host syncs 1, ..."
};

// Totals since the process started, over all threads. Queued work is tracked
// per host thread (each issues on its own per-thread default stream), and an
// event synchronization counts as a wait for the calling thread's stream.
Counters ReadCounters();

// What one steady-state call of `step` asks: `step` runs warmup + 1 times and
// the counts of the last run come back (the warm-up runs fill the caching
// allocator and the libraries' caches, as the first steps of training do).
Counters CountSteadyCall(const std::function<void()>& step, int warmup = 2);

// Called by the emulation itself: one launch of kernel `name`.
//
// With CUDA_EMU_LAUNCH_CENSUS=1 in the environment, the launches are also
// counted per kernel name and listed on stderr when the process exits, most
// first ("launch census: N launches" then "count name" lines): which kernels
// a program's step launches, and how often, without a GPU (with
// CUDA_EMU_KERNELS=skip, at the speed of the host work alone).
void CountLaunch(const char* name);

}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_COUNTERS_H_
