// Fibers of the CUDA emulation: one per CUDA thread of the block running now,
// on stacks the launching thread keeps for its launches, switched by a small
// x86-64 routine (callee-saved registers and the stack pointer; no signal
// masks, so a switch costs nanoseconds, not a system call).
#include "third_party/cuda/emu/fiber.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "third_party/cuda/emu/counters.h"

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

// A cp.async this thread issued and has not waited for.
struct AsyncCopy {
  void* dst;
  const void* src;
  int bytes;      // what lands in shared memory
  int src_bytes;  // read from src; the rest is zero-filled
};

struct Fiber {
  void* sp = nullptr;
  ThreadState t{};
  State state = State::kRunnable;
  std::vector<AsyncCopy> async_copies;  // issued, oldest first
  std::vector<size_t> async_groups;     // where each committed group ends in async_copies
};

// A warp's collective in progress (one at a time per warp: the lanes in its
// mask arrive, the last one releases them) and its data slots, two buffers
// used in turn, so a lane may write the next collective's slot while slower
// lanes still read this one's.
struct Warp {
  unsigned exists = 0;   // lanes the block has
  unsigned exited = 0;   // lanes whose thread returned
  unsigned mask = 0;     // of the collective in progress
  unsigned arrived = 0;  // lanes waiting in it
  int buffer = 0;        // the slots it writes
  unsigned delivered[2] = {0, 0};  // lanes whose slot a released collective holds
  unsigned char slots[2][32][kMaxGatherBytes];
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
  std::vector<Warp> warps;
  int current = -1;
  int at_barrier = 0;
  int done = 0;
  void* sched_sp = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> shared;  // dynamic shared memory (+16 for alignment)
  size_t shared_bytes = 0;
};

thread_local Run* g_run = nullptr;
// The fiber stacks of this thread, through Stacks(). A pointer, not an
// object: deferred work (pending.h) can run kernels from another
// thread_local's destructor at thread exit (a stream drained there), after an
// object here would have been destroyed.
thread_local StackPool* g_stacks = nullptr;
struct StackPoolOwner {
  ~StackPoolOwner() {
    delete g_stacks;
    g_stacks = nullptr;
  }
};
StackPool& Stacks() {
  if (g_stacks == nullptr) {
    g_stacks = new StackPool;
    // Frees it when the thread ends; a pool made after that (by work run
    // later in the thread's exit) is left to the process.
    thread_local StackPoolOwner owner;
  }
  return *g_stacks;
}

Run& CurrentRun() {
  if (g_run == nullptr || g_run->current < 0) {
    std::fprintf(stderr, "cuda_emu: a device function was called outside a kernel launch\n");
    std::abort();
  }
  return *g_run;
}

// Back to the scheduler until this fiber is runnable again.
void Park(Run& r, Fiber& f) {
  cuda_emu_switch(&f.sp, r.sched_sp);
}

void MaybeReleaseWarp(Run& r, int w) {
  Warp& wp = r.warps[w];
  if (wp.arrived == 0 || ((wp.arrived | wp.exited) & wp.mask) != wp.mask) return;
  for (int l = 0; l < 32; ++l) {
    if ((wp.arrived >> l) & 1u) r.fibers[w * 32 + l].state = State::kRunnable;
  }
  wp.delivered[wp.buffer] = wp.arrived;
  wp.buffer ^= 1;
  wp.arrived = 0;
  wp.mask = 0;
}

void MaybeReleaseBarrier(Run& r) {
  if (r.at_barrier == 0 || r.at_barrier + r.done != static_cast<int>(r.fibers.size())) return;
  for (Fiber& f : r.fibers) {
    if (f.state == State::kAtBarrier) f.state = State::kRunnable;
  }
  r.at_barrier = 0;
}

// Joins the warp collective over `mask` (writing `bytes` of `mine` to this
// lane's slot first); returns once every lane of the mask that has not exited
// has joined, with the index of the buffer that holds the slots.
int JoinWarp(unsigned mask, const void* mine, size_t bytes) {
  Run& r = CurrentRun();
  Fiber& f = r.fibers[r.current];
  const int lane = f.t.lane;
  Warp& wp = r.warps[f.t.warp];
  if (!((mask >> lane) & 1u)) {
    std::fprintf(stderr, "cuda_emu: lane %d calls a warp collective with mask %08x, which omits it\n",
                 lane, mask);
    std::abort();
  }
  if (wp.arrived != 0 && wp.mask != mask) {
    std::fprintf(stderr,
                 "cuda_emu: lane %d of warp %d joins a warp collective with mask %08x while one "
                 "with mask %08x is in progress (different masks at once are not emulated)\n",
                 lane, f.t.warp, mask, wp.mask);
    std::abort();
  }
  const int buffer = wp.buffer;
  if (bytes > 0) std::memcpy(wp.slots[buffer][lane], mine, bytes);
  wp.mask = mask;
  wp.arrived |= 1u << lane;
  f.state = State::kAtWarp;
  MaybeReleaseWarp(r, f.t.warp);
  if (f.state != State::kRunnable) Park(r, f);
  return buffer;
}

[[noreturn]] void Trampoline() {
  Run& r = *g_run;
  (*r.body)();
  Fiber& f = r.fibers[r.current];
  f.state = State::kDone;
  ++r.done;
  r.warps[f.t.warp].exited |= 1u << f.t.lane;
  MaybeReleaseWarp(r, f.t.warp);
  MaybeReleaseBarrier(r);
  cuda_emu_switch(&f.sp, r.sched_sp);
  __builtin_unreachable();
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
    std::fprintf(stderr, "  thread %zu (warp %d lane %d): %s\n", i, f.t.warp, f.t.lane, s);
  }
  std::abort();
}

void RunBlock(Run& r) {
  const int n = static_cast<int>(r.fibers.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    f.state = State::kRunnable;
    f.async_copies.clear();  // copies a thread never waited for are dropped
    f.async_groups.clear();
    // The first switch "returns" into Trampoline with the stack aligned as at
    // a function's entry: slot S (16-aligned) holds Trampoline, S + 8 a null
    // return address, below S the six callee-saved registers.
    char* top = Stacks().Top(static_cast<size_t>(i));
    auto* s = reinterpret_cast<void**>(top - 16);
    s[0] = reinterpret_cast<void*>(&Trampoline);
    s[1] = nullptr;
    void** regs = s - 6;
    for (int k = 0; k < 6; ++k) regs[k] = nullptr;
    f.sp = regs;
  }
  for (Warp& w : r.warps) {
    w.exited = ~w.exists;
    w.mask = w.arrived = 0;
    w.buffer = 0;
    w.delivered[0] = w.delivered[1] = 0;
  }
  r.at_barrier = 0;
  r.done = 0;
  if (r.shared_bytes > 0) std::memset(DynamicSharedMemory(), 0xff, r.shared_bytes);
  current_block = &r.block;
  while (r.done < n) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      if (r.fibers[i].state != State::kRunnable) continue;
      r.current = i;
      current_thread = &r.fibers[i].t;
      cuda_emu_switch(&r.sched_sp, r.fibers[i].sp);
      ran = true;
    }
    r.current = -1;
    if (!ran) Deadlock(r);
  }
}

}  // namespace

void MisalignedAccess(const void* p, int bytes) {
  const Run& r = CurrentRun();
  const ThreadState& t = r.fibers[r.current].t;
  std::fprintf(stderr,
               "cuda_emu: misaligned address: a %d-byte access at %p (address %% %d = %d) by thread "
               "(%u, %u, %u) of block (%u, %u, %u); a GPU faults here\n",
               bytes, p, bytes, static_cast<int>(reinterpret_cast<uintptr_t>(p) % bytes),
               t.thread_idx.x, t.thread_idx.y, t.thread_idx.z, r.block.block_idx.x,
               r.block.block_idx.y, r.block.block_idx.z);
  std::abort();
}

void* DynamicSharedMemory() {
  Run& r = *g_run;
  auto addr = reinterpret_cast<uintptr_t>(r.shared.data());
  return reinterpret_cast<void*>((addr + 15) & ~uintptr_t{15});
}

void AsyncCopyToShared(void* dst, const void* src, int bytes, int src_bytes) {
  Run& r = CurrentRun();
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    std::fprintf(stderr, "cuda_emu: a cp.async of %d bytes (4, 8 or 16)\n", bytes);
    std::abort();
  }
  if (src_bytes < 0 || src_bytes > bytes) {
    std::fprintf(stderr, "cuda_emu: a cp.async of %d bytes reading %d\n", bytes, src_bytes);
    std::abort();
  }
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0) MisalignedAccess(dst, bytes);
  if (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    MisalignedAccess(src, bytes);
  }
  if (!InDynamicSharedMemory(dst, bytes)) NotInSharedMemory("a cp.async destination", dst);
  r.fibers[r.current].async_copies.push_back({dst, src, bytes, src_bytes});
}

void AsyncCopyCommit() {
  Run& r = CurrentRun();
  Fiber& f = r.fibers[r.current];
  f.async_groups.push_back(f.async_copies.size());
}

void AsyncCopyWait(int newest_pending) {
  Run& r = CurrentRun();
  Fiber& f = r.fibers[r.current];
  const size_t groups = f.async_groups.size();
  if (groups <= static_cast<size_t>(newest_pending)) return;
  const size_t done_groups = groups - static_cast<size_t>(newest_pending);
  const size_t done = f.async_groups[done_groups - 1];
  for (size_t i = 0; i < done; ++i) {
    const AsyncCopy& c = f.async_copies[i];
    auto* dst = static_cast<unsigned char*>(c.dst);
    if (c.src_bytes > 0) std::memcpy(dst, c.src, static_cast<size_t>(c.src_bytes));
    std::memset(dst + c.src_bytes, 0, static_cast<size_t>(c.bytes - c.src_bytes));
  }
  f.async_copies.erase(f.async_copies.begin(), f.async_copies.begin() + done);
  f.async_groups.erase(f.async_groups.begin(), f.async_groups.begin() + done_groups);
  for (size_t& end : f.async_groups) end -= done;
}

bool InDynamicSharedMemory(const void* p, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(DynamicSharedMemory());
  const auto addr = reinterpret_cast<uintptr_t>(p);
  return addr >= begin && addr - begin <= g_run->shared_bytes &&
         bytes <= g_run->shared_bytes - (addr - begin);
}

void NotInSharedMemory(const char* what, const void* p) {
  const Run& r = CurrentRun();
  const ThreadState& t = r.fibers[r.current].t;
  std::fprintf(stderr,
               "cuda_emu: %s at %p by thread (%u, %u, %u) of block (%u, %u, %u) is not in the "
               "block's dynamic shared memory (%zu bytes)\n",
               what, p, t.thread_idx.x, t.thread_idx.y, t.thread_idx.z, r.block.block_idx.x,
               r.block.block_idx.y, r.block.block_idx.z, r.shared_bytes);
  std::abort();
}

void SyncThreads() {
  Run& r = CurrentRun();
  Fiber& f = r.fibers[r.current];
  f.state = State::kAtBarrier;
  ++r.at_barrier;
  MaybeReleaseBarrier(r);
  if (f.state != State::kRunnable) Park(r, f);
}

void SyncWarp(unsigned mask) { JoinWarp(mask, nullptr, 0); }

unsigned LiveLanes() {
  Run& r = CurrentRun();
  const Warp& w = r.warps[r.fibers[r.current].t.warp];
  return w.exists & ~w.exited;
}

void WarpGather(unsigned mask, const void* mine, size_t bytes, void* all) {
  if (bytes > kMaxGatherBytes) {
    std::fprintf(stderr, "cuda_emu: a warp collective of %zu bytes per lane\n", bytes);
    std::abort();
  }
  const int buffer = JoinWarp(mask, mine, bytes);
  Run& r = CurrentRun();
  const Warp& w = r.warps[r.fibers[r.current].t.warp];
  auto* out = static_cast<unsigned char*>(all);
  for (int l = 0; l < 32; ++l) {
    if ((w.delivered[buffer] >> l) & 1u) {
      std::memcpy(out + l * bytes, w.slots[buffer][l], bytes);
    } else {
      std::memset(out + l * bytes, 0xff, bytes);
    }
  }
}

void WarpShuffle(unsigned mask, const void* mine, size_t bytes, int src_lane, void* out) {
  const int buffer = JoinWarp(mask, mine, bytes);
  Run& r = CurrentRun();
  const Warp& w = r.warps[r.fibers[r.current].t.warp];
  if ((w.delivered[buffer] >> src_lane) & 1u) {
    std::memcpy(out, w.slots[buffer][src_lane], bytes);
  } else {
    std::memset(out, 0xff, bytes);
  }
}

unsigned WarpBallot(unsigned mask, int pred) {
  const int mine = pred != 0;
  int all[32];
  WarpGather(mask, &mine, sizeof(int), all);
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l) {
    if (((mask >> l) & 1u) && all[l] == 1) ballot |= 1u << l;
  }
  return ballot;
}

bool CheckLaunchConfig(dim3 grid, dim3 block, size_t dynamic_shared_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const bool bad = grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu ||
                   grid.y > 65535 || grid.z > 65535 || threads == 0 ||
                   threads > kMaxThreadsPerBlock || block.z > 64 ||
                   dynamic_shared_bytes > kMaxDynamicShared;
  if (bad) SetLastError(cudaErrorInvalidConfiguration);
  return !bad;
}

void Launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  if (!CheckLaunchConfig(grid, block, dynamic_shared_bytes)) return;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (g_run != nullptr) {
    std::fprintf(stderr, "cuda_emu: a kernel launched from inside a kernel\n");
    std::abort();
  }
  Run r;
  r.body = &body;
  r.block.block_dim = block;
  r.block.grid_dim = grid;
  r.fibers.resize(threads);
  r.warps.resize((threads + 31) / 32);
  for (uint32_t i = 0; i < threads; ++i) {
    ThreadState& t = r.fibers[i].t;
    t.thread_idx = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    t.lane = static_cast<int>(i % 32);
    t.warp = static_cast<int>(i / 32);
    r.warps[t.warp].exists |= 1u << t.lane;
  }
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
  current_thread = nullptr;
  current_block = nullptr;
}

}  // namespace cuda_emu
