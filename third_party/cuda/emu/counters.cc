// The counters of what a program asked of the emulated GPU (counters.h,
// counters_state.h) and the per-kernel launch census.
#include "third_party/cuda/emu/counters.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "third_party/cuda/emu/counters_state.h"

namespace cuda_emu {
namespace internal {
namespace {

// Launches per kernel name (CUDA_EMU_LAUNCH_CENSUS=1), listed on stderr at
// exit, most first.
class LaunchCensus {
 public:
  void Add(const char* name) {
    std::lock_guard<std::mutex> lock(mu_);
    ++by_name_[name];
  }
  void Print() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<int64_t, std::string>> rows;
    int64_t total = 0;
    for (const auto& [name, n] : by_name_) {
      rows.emplace_back(n, name);
      total += n;
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    std::fprintf(stderr, "launch census: %lld launches\n", static_cast<long long>(total));
    for (const auto& [n, name] : rows) {
      std::fprintf(stderr, "%10lld %s\n", static_cast<long long>(n), name.c_str());
    }
  }

 private:
  std::mutex mu_;
  std::map<std::string, int64_t> by_name_;
};

// The census (printed at exit), or nullptr when the environment does not ask
// for one. Never freed, like the counters: launches may come until the end.
LaunchCensus* Census() {
  static LaunchCensus* census = [] {
    const char* v = std::getenv("CUDA_EMU_LAUNCH_CENSUS");
    if (v == nullptr || std::strcmp(v, "1") != 0) return static_cast<LaunchCensus*>(nullptr);
    std::atexit([] { Census()->Print(); });
    return new LaunchCensus;
  }();
  return census;
}

}  // namespace

AtomicCounters& Count() {
  static AtomicCounters* c = new AtomicCounters;
  return *c;
}

void AddToCensus(const char* name) {
  if (LaunchCensus* census = Census()) census->Add(name);
}

}  // namespace internal

using internal::Count;

Counters ReadCounters() {
  const internal::AtomicCounters& c = Count();
  Counters r;
  r.kernel_launches = c.kernel_launches;
  r.host_syncs = c.host_syncs;
  r.device_allocs = c.device_allocs;
  r.device_frees = c.device_frees;
  r.pinned_allocs = c.pinned_allocs;
  r.copies_to_host = c.copies_to_host;
  r.copies_to_device = c.copies_to_device;
  r.memsets = c.memsets;
  return r;
}

Counters CountSteadyCall(const std::function<void()>& step, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
  const Counters before = ReadCounters();
  step();
  return ReadCounters() - before;
}

Counters Counters::operator-(const Counters& e) const {
  Counters r;
  r.kernel_launches = kernel_launches - e.kernel_launches;
  r.host_syncs = host_syncs - e.host_syncs;
  r.device_allocs = device_allocs - e.device_allocs;
  r.device_frees = device_frees - e.device_frees;
  r.pinned_allocs = pinned_allocs - e.pinned_allocs;
  r.copies_to_host = copies_to_host - e.copies_to_host;
  r.copies_to_device = copies_to_device - e.copies_to_device;
  r.memsets = memsets - e.memsets;
  return r;
}

std::string Counters::ToString() const {
  return absl::StrFormat(
      "kernel launches %d, host syncs %d, cudaMalloc %d, cudaFree %d, cudaHostAlloc %d, "
      "copies to host %d, copies to device %d, memsets %d",
      kernel_launches, host_syncs, device_allocs, device_frees, pinned_allocs, copies_to_host,
      copies_to_device, memsets);
}

}  // namespace cuda_emu
