// Fibers of the CUDA emulation: one per CUDA thread of the block running now,
// on stacks the launching thread keeps for its launches, switched by a small
// x86-64 routine (callee-saved registers and the stack pointer; no signal
// masks, so a switch costs nanoseconds, not a system call).
#include "third_party/cuda/emu/fiber.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA emulation's fibers are written for x86-64"
#endif

// cuda_emu_switch(save, load): saves the callee-saved registers on the current
// stack, stores the stack pointer in *save, continues on the stack `load`.
extern "C" void cuda_emu_switch(void** save, void* load);
asm(R"(
  .text
  .globl cuda_emu_switch
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace cuda_emu {
namespace {

constexpr size_t kStackBytes = 256 << 10;  // touched lazily
constexpr size_t kGuardBytes = 4096;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 227 << 10;  // sm_90's opt-in limit per block
constexpr size_t kMaxGatherBytes = 64;

enum class State { kRunnable, kAtBarrier, kAtWarp, kDone };

struct Fiber {
  void* sp = nullptr;
  ThreadState t{};
  State state = State::kRunnable;
  unsigned mask = 0;  // of the warp collective it waits in
};

// Stacks owned by one launching thread, reused by its launches.
class StackPool {
 public:
  ~StackPool() {
    for (char* s : stacks_) munmap(s, kStackBytes + kGuardBytes);
  }
  char* Top(size_t i) {
    while (stacks_.size() <= i) {
      void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        std::fprintf(stderr, "cuda_emu: cannot map a fiber stack\n");
        std::abort();
      }
      mprotect(p, kGuardBytes, PROT_NONE);  // the low end: overflow faults
      stacks_.push_back(static_cast<char*>(p));
    }
    return stacks_[i] + kGuardBytes + kStackBytes;
  }

 private:
  std::vector<char*> stacks_;
};

struct Run {
  BlockState block{};
  std::vector<Fiber> fibers;
  int current = -1;
  void* sched_sp = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> slots;  // warps x 32 lanes x kMaxGatherBytes
  std::vector<unsigned char> shared;  // dynamic shared memory (+16 for alignment)
  size_t shared_bytes = 0;
};

thread_local Run* g_run = nullptr;
thread_local StackPool g_stacks;

Run& CurrentRun() {
  if (g_run == nullptr || g_run->current < 0) {
    std::fprintf(stderr, "cuda_emu: a device function was called outside a kernel launch\n");
    std::abort();
  }
  return *g_run;
}

Fiber& Self() {
  Run& r = CurrentRun();
  return r.fibers[r.current];
}

void Yield(State state, unsigned mask) {
  Run& r = CurrentRun();
  Fiber& f = r.fibers[r.current];
  f.state = state;
  f.mask = mask;
  cuda_emu_switch(&f.sp, r.sched_sp);
}

[[noreturn]] void Trampoline() {
  Run& r = *g_run;
  (*r.body)();
  Fiber& f = r.fibers[r.current];
  f.state = State::kDone;
  cuda_emu_switch(&f.sp, r.sched_sp);
  __builtin_unreachable();
}

// Releases the warp collectives and the block barrier that every thread they
// wait for has reached; true if any thread became runnable.
bool Release(Run& r) {
  bool released = false;
  const int n = static_cast<int>(r.fibers.size());
  for (int w = 0; w * 32 < n; ++w) {
    const int first = w * 32, last = std::min(n, first + 32);
    for (int i = first; i < last; ++i) {
      if (r.fibers[i].state != State::kAtWarp) continue;
      const unsigned mask = r.fibers[i].mask;
      bool ready = true;
      for (int l = 0; l < 32 && ready; ++l) {
        if (!((mask >> l) & 1u) || first + l >= last) continue;
        const Fiber& o = r.fibers[first + l];
        ready = o.state == State::kDone || (o.state == State::kAtWarp && o.mask == mask);
      }
      if (!ready) continue;
      for (int l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1u) || first + l >= last) continue;
        Fiber& o = r.fibers[first + l];
        if (o.state == State::kAtWarp) o.state = State::kRunnable;
      }
      released = true;
    }
  }
  if (released) return true;
  bool any_waiting = false, all_at_barrier = true;
  for (const Fiber& f : r.fibers) {
    if (f.state == State::kDone) continue;
    if (f.state == State::kAtBarrier) {
      any_waiting = true;
    } else {
      all_at_barrier = false;
    }
  }
  if (any_waiting && all_at_barrier) {
    for (Fiber& f : r.fibers) {
      if (f.state == State::kAtBarrier) f.state = State::kRunnable;
    }
    return true;
  }
  return false;
}

[[noreturn]] void Deadlock(const Run& r) {
  std::fprintf(stderr,
               "cuda_emu: deadlock in block (%u, %u, %u) of a (%u, %u, %u) x (%u, %u, %u) launch: "
               "threads wait for others that never arrive\n",
               r.block.block_idx.x, r.block.block_idx.y, r.block.block_idx.z, r.block.grid_dim.x,
               r.block.grid_dim.y, r.block.grid_dim.z, r.block.block_dim.x, r.block.block_dim.y,
               r.block.block_dim.z);
  for (size_t i = 0; i < r.fibers.size(); ++i) {
    const Fiber& f = r.fibers[i];
    const char* s = f.state == State::kAtBarrier ? "at __syncthreads"
                    : f.state == State::kAtWarp  ? "in a warp collective"
                    : f.state == State::kDone    ? "exited"
                                                 : "runnable";
    std::fprintf(stderr, "  thread %zu (warp %d lane %d): %s mask %08x\n", i, f.t.warp, f.t.lane, s,
                 f.mask);
  }
  std::abort();
}

void RunBlock(Run& r) {
  const int n = static_cast<int>(r.fibers.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    f.state = State::kRunnable;
    f.mask = 0;
    // The first switch "returns" into Trampoline with the stack aligned as at
    // a function's entry: slot S (16-aligned) holds Trampoline, S + 8 a null
    // return address, below S the six callee-saved registers.
    char* top = g_stacks.Top(static_cast<size_t>(i));
    auto* s = reinterpret_cast<void**>(top - 16);
    s[0] = reinterpret_cast<void*>(&Trampoline);
    s[1] = nullptr;
    void** regs = s - 6;
    for (int k = 0; k < 6; ++k) regs[k] = nullptr;
    f.sp = regs;
  }
  if (r.shared_bytes > 0) std::memset(DynamicSharedMemory(), 0xff, r.shared_bytes);
  int live = n;
  while (live > 0) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      if (r.fibers[i].state != State::kRunnable) continue;
      r.current = i;
      cuda_emu_switch(&r.sched_sp, r.fibers[i].sp);
      ran = true;
      if (r.fibers[i].state == State::kDone) --live;
    }
    r.current = -1;
    if (live == 0) break;
    if (!Release(r) && !ran) Deadlock(r);
  }
}

}  // namespace

const ThreadState& CurrentThread() { return Self().t; }
const BlockState& CurrentBlock() { return CurrentRun().block; }

void* DynamicSharedMemory() {
  Run& r = *g_run;
  auto addr = reinterpret_cast<uintptr_t>(r.shared.data());
  return reinterpret_cast<void*>((addr + 15) & ~uintptr_t{15});
}

void SyncThreads() { Yield(State::kAtBarrier, 0); }

void SyncWarp(unsigned mask) {
  const Fiber& f = Self();
  if (!((mask >> f.t.lane) & 1u)) {
    std::fprintf(stderr, "cuda_emu: lane %d calls a warp collective with mask %08x, which omits it\n",
                 f.t.lane, mask);
    std::abort();
  }
  Yield(State::kAtWarp, mask);
}

unsigned LiveLanes() {
  Run& r = CurrentRun();
  const Fiber& f = r.fibers[r.current];
  const int first = f.t.warp * 32;
  unsigned live = 0;
  for (int l = 0; l < 32 && first + l < static_cast<int>(r.fibers.size()); ++l) {
    if (r.fibers[first + l].state != State::kDone) live |= 1u << l;
  }
  return live;
}

void WarpGather(unsigned mask, const void* mine, size_t bytes, void* all) {
  if (bytes > kMaxGatherBytes) {
    std::fprintf(stderr, "cuda_emu: a warp collective of %zu bytes per lane\n", bytes);
    std::abort();
  }
  Run& r = CurrentRun();
  const int me = r.current;
  const ThreadState t = r.fibers[me].t;
  unsigned char* warp_slots = r.slots.data() + static_cast<size_t>(t.warp) * 32 * kMaxGatherBytes;
  std::memcpy(warp_slots + t.lane * kMaxGatherBytes, mine, bytes);
  SyncWarp(mask);  // everyone has written
  const int first = t.warp * 32;
  auto* out = static_cast<unsigned char*>(all);
  for (int l = 0; l < 32; ++l) {
    const bool there = ((mask >> l) & 1u) && first + l < static_cast<int>(r.fibers.size()) &&
                       r.fibers[first + l].state != State::kDone;
    if (there) {
      std::memcpy(out + l * bytes, warp_slots + l * kMaxGatherBytes, bytes);
    } else {
      std::memset(out + l * bytes, 0xff, bytes);
    }
  }
  SyncWarp(mask);  // everyone has read: the slots may be written again
}

unsigned WarpBallot(unsigned mask, int pred) {
  const int mine = pred != 0;
  int all[32];
  WarpGather(mask, &mine, sizeof(int), all);
  const unsigned live = LiveLanes();
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l) {
    if (((mask & live) >> l) & 1u && all[l] == 1) ballot |= 1u << l;
  }
  return ballot;
}

void Launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const bool bad = grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
                   grid.y > 65535 || grid.z > 65535 || threads == 0 ||
                   threads > kMaxThreadsPerBlock || block.z > 64 ||
                   dynamic_shared_bytes > kMaxDynamicShared;
  if (bad) {
    SetLastError(cudaErrorInvalidConfiguration);
    return;
  }
  if (g_run != nullptr) {
    std::fprintf(stderr, "cuda_emu: a kernel launched from inside a kernel\n");
    std::abort();
  }
  Run r;
  r.body = &body;
  r.block.block_dim = block;
  r.block.grid_dim = grid;
  r.fibers.resize(threads);
  for (uint32_t i = 0; i < threads; ++i) {
    ThreadState& t = r.fibers[i].t;
    t.thread_idx = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    t.lane = static_cast<int>(i % 32);
    t.warp = static_cast<int>(i / 32);
  }
  r.slots.resize((threads + 31) / 32 * 32 * kMaxGatherBytes);
  r.shared_bytes = dynamic_shared_bytes;
  r.shared.resize(dynamic_shared_bytes + 16);
  g_run = &r;
  for (uint32_t z = 0; z < grid.z; ++z) {
    for (uint32_t y = 0; y < grid.y; ++y) {
      for (uint32_t x = 0; x < grid.x; ++x) {
        r.block.block_idx = make_uint3(x, y, z);
        RunBlock(r);
      }
    }
  }
  g_run = nullptr;
}

}  // namespace cuda_emu
