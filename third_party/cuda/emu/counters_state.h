// The process's counters behind counters.h, which the emulated runtime and
// libraries increment as programs ask things of the GPU (counters.cc holds
// them, and the launch census). Private to the emulation.
#ifndef THIRD_PARTY_CUDA_EMU_COUNTERS_STATE_H_
#define THIRD_PARTY_CUDA_EMU_COUNTERS_STATE_H_

#include <atomic>
#include <cstdint>

namespace cuda_emu {
namespace internal {

struct AtomicCounters {
  std::atomic<int64_t> kernel_launches{0};
  std::atomic<int64_t> host_syncs{0};
  std::atomic<int64_t> device_allocs{0};
  std::atomic<int64_t> device_frees{0};
  std::atomic<int64_t> pinned_allocs{0};
  std::atomic<int64_t> copies_to_host{0};
  std::atomic<int64_t> copies_to_device{0};
  std::atomic<int64_t> memsets{0};
};

// The process's counters, like the device's own state one per process;
// never freed (work may be counted until the process ends).
AtomicCounters& Count();

// Counts one launch of kernel `name` in the launch census when
// CUDA_EMU_LAUNCH_CENSUS=1 asks for one (counters.h); nothing otherwise.
void AddToCensus(const char* name);

}  // namespace internal
}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_COUNTERS_STATE_H_
