// Fibers of the CUDA emulation: one per CUDA thread of the block running now,
// on stacks the launching thread keeps for its launches, switched by a small
// x86-64 routine (callee-saved registers and the stack pointer; no signal
// masks, so a switch costs nanoseconds, not a system call).
#include "third_party/cuda/emu/fiber.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "third_party/cuda/emu/counters.h"

#if !defined(__x86_64__)
#error "the CUDA emulation's fibers are written for x86-64"
#endif

#if CUDA_EMU_RACECHECK && defined(__SANITIZE_THREAD__)
#error \
    "fiber.cc is the emulation's bookkeeping, shared by all fibers: compile it without -fsanitize=thread (--config=cuda_emu_race's --per_file_copt)"
#endif

#if CUDA_EMU_RACECHECK
// ThreadSanitizer's interface (sanitizer/tsan_interface.h, and the range
// accesses it leaves out).
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_read_range(void* addr, unsigned long size);
void __tsan_write_range(void* addr, unsigned long size);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
}
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

// What ThreadSanitizer is told (fiber.h, CUDA_EMU_RACECHECK); nothing in
// other builds. A sync address's only job is to be an address.
namespace race {
#if CUDA_EMU_RACECHECK
// Switching fibers orders nothing: only Release / Acquire pairs do.
constexpr unsigned kNoSync = 1;
inline void* CurrentFiber() { return __tsan_get_current_fiber(); }
// Named after the thread index it runs (slot = index x kFiberSets + set).
inline void* NewFiber(size_t slot, int sets) {
  void* f = __tsan_create_fiber(0);
  const size_t i = slot / sets;
  char name[128];  // room for three 20-digit indices
  std::snprintf(name, sizeof(name), "CUDA thread %zu (warp %zu, lane %zu) of %s blocks", i, i / 32,
                i % 32, slot % sets == 0 ? "even" : "odd");
  __tsan_set_fiber_name(f, name);
  return f;
}
inline void DestroyFiber(void* f) { __tsan_destroy_fiber(f); }
inline void SwitchTo(void* f) { __tsan_switch_to_fiber(f, kNoSync); }
inline void Release(void* sync) { __tsan_release(sync); }
inline void Acquire(void* sync) { __tsan_acquire(sync); }
inline void Reads(const void* p, size_t n) {
  if (n > 0) __tsan_read_range(const_cast<void*>(p), n);
}
inline void Writes(void* p, size_t n) {
  if (n > 0) __tsan_write_range(p, n);
}
// Replaces `memory` by a new allocation of its size: the block's shared
// memory starts without the previous block's accesses. (An allocation made
// while the thread ignores its accesses resets the range's history.)
inline void Reallocate(std::vector<unsigned char>& memory) {
  if (memory.empty()) return;
  __tsan_ignore_thread_begin();
  std::vector<unsigned char>(memory.size()).swap(memory);
  __tsan_ignore_thread_end();
}
#else
inline void* CurrentFiber() { return nullptr; }
inline void* NewFiber(size_t, int) { return nullptr; }
inline void DestroyFiber(void*) {}
inline void SwitchTo(void*) {}
inline void Release(void*) {}
inline void Acquire(void*) {}
inline void Reads(const void*, size_t) {}
inline void Writes(void*, size_t) {}
inline void Reallocate(std::vector<unsigned char>&) {}
#endif
}  // namespace race

constexpr size_t kStackBytes = 256 << 10;  // touched lazily
constexpr size_t kGuardBytes = 4096;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 227 << 10;  // sm_90's opt-in limit per block
constexpr size_t kMaxStaticShared = 48 << 10;    // CUDA's limit for __shared__ arrays
// The race check tells blocks apart by their fibers: consecutive blocks run
// on two sets of them, so a race between two blocks one apart is reported
// (two apart, the same fibers run both, and their accesses are ordered).
constexpr int kFiberSets = kRaceCheck ? 2 : 1;
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
  void* race_fiber = nullptr;  // ThreadSanitizer's (race::), of this stack
  ThreadState t{};
  State state = State::kRunnable;
  bool in_launch[kFiberSets] = {};      // per fiber set: acquired the launch's start
  int barrier_parity = 0;               // of the __syncthreads it waits at
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
  char sync[2];  // __syncwarp's race:: order, per buffer (a lane cannot be two ahead)
  unsigned char slots[2][32][kMaxGatherBytes];
};

// Stacks owned by one launching thread, reused by its launches, and the
// race:: fiber of each (thread i of every block runs on stack i).
class StackPool {
 public:
  ~StackPool() {
    for (char* s : stacks_) munmap(s, kStackBytes + kGuardBytes);
    for (void* f : race_fibers_) race::DestroyFiber(f);
  }
  void* RaceFiber(size_t i) {
    Top(i);
    return race_fibers_[i];
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
      race_fibers_.push_back(race::NewFiber(race_fibers_.size(), kFiberSets));
    }
    return stacks_[i] + kGuardBytes + kStackBytes;
  }

 private:
  std::vector<char*> stacks_;
  std::vector<void*> race_fibers_;
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
  // Static shared memory (+16), allocated when a kernel first declares an
  // array; where each array (by its key) lies in it, and how much is placed.
  std::vector<unsigned char> static_shared;
  std::vector<std::pair<const void*, size_t>> static_arrays;
  size_t static_shared_bytes = 0;
  int fiber_set = 0;               // of this block (race::)
  bool last_block_of_set = false;  // the set's last block in the launch
  // race:: order: the launching thread's fiber; the launch's start (the
  // launching thread releases, each CUDA thread acquires in its first block)
  // and end (each releases in the last block, the launching thread
  // acquires); the __syncthreads of even and odd generations (no thread can
  // be two ahead).
  void* sched_race_fiber = nullptr;
  char launch_start_sync = 0;
  char launch_end_sync = 0;
  char barrier_sync[2] = {0, 0};
  int barrier_generation = 0;
  bool shared_limit_checked = false;  // CheckDynamicSharedLimit, once a launch
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

unsigned char* StaticSharedBase(Run& r) {
  auto addr = reinterpret_cast<uintptr_t>(r.static_shared.data());
  return reinterpret_cast<unsigned char*>((addr + 15) & ~uintptr_t{15});
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
  race::SwitchTo(r.sched_race_fiber);
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
  ++r.barrier_generation;
}

// Joins the warp collective over `mask` (writing `bytes` of `mine` to this
// lane's slot first); returns once every lane of the mask that has not exited
// has joined, with the index of the buffer that holds the slots. Orders the
// lanes' memory accesses (race::) only if `orders_memory` (__syncwarp).
int JoinWarp(unsigned mask, const void* mine, size_t bytes, bool orders_memory) {
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
  if (orders_memory) race::Release(&wp.sync[buffer]);
  wp.mask = mask;
  wp.arrived |= 1u << lane;
  f.state = State::kAtWarp;
  MaybeReleaseWarp(r, f.t.warp);
  if (f.state != State::kRunnable) Park(r, f);
  if (orders_memory) race::Acquire(&wp.sync[buffer]);
  return buffer;
}

[[noreturn]] void Trampoline() {
  Run& r = *g_run;
  if (!r.fibers[r.current].in_launch[r.fiber_set]) {
    race::Acquire(&r.launch_start_sync);
    r.fibers[r.current].in_launch[r.fiber_set] = true;
  }
  (*r.body)();
  if (r.last_block_of_set) race::Release(&r.launch_end_sync);
  Fiber& f = r.fibers[r.current];
  f.state = State::kDone;
  ++r.done;
  r.warps[f.t.warp].exited |= 1u << f.t.lane;
  MaybeReleaseWarp(r, f.t.warp);
  MaybeReleaseBarrier(r);
  race::SwitchTo(r.sched_race_fiber);
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
    // Thread i of the block runs on stack (and race:: fiber) i of its set.
    const size_t slot = static_cast<size_t>(i) * kFiberSets + r.fiber_set;
    char* top = Stacks().Top(slot);
    f.race_fiber = Stacks().RaceFiber(slot);
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
  race::Reallocate(r.shared);
  race::Reallocate(r.static_shared);
  if (r.shared_bytes > 0) std::memset(DynamicSharedMemory(), 0xff, r.shared_bytes);
  if (r.static_shared_bytes > 0) std::memset(StaticSharedBase(r), 0xff, r.static_shared_bytes);
  current_block = &r.block;
  while (r.done < n) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      if (r.fibers[i].state != State::kRunnable) continue;
      r.current = i;
      current_thread = &r.fibers[i].t;
      race::SwitchTo(r.fibers[i].race_fiber);
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

void CheckDynamicSharedLimit(const void* kernel) {
  Run& r = CurrentRun();
  if (kernel == nullptr || r.shared_limit_checked) return;
  r.shared_limit_checked = true;
  if (r.shared_bytes <= kDefaultDynamicShared) return;
  const size_t limit = MaxDynamicSharedBytes(kernel);
  if (r.shared_bytes <= limit) return;
  std::fprintf(stderr,
               "cuda_emu: a kernel launched with %zu bytes of dynamic shared memory, above its limit "
               "of %zu: raise it first with cudaFuncSetAttribute(kernel, "
               "cudaFuncAttributeMaxDynamicSharedMemorySize, %zu); a GPU refuses this launch\n",
               r.shared_bytes, limit, r.shared_bytes);
  std::abort();
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
  // The copy may happen any time until the wait: it accesses both ends now...
  race::Writes(dst, static_cast<size_t>(bytes));
  race::Reads(src, static_cast<size_t>(src_bytes));
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
    // ... and at the wait.
    race::Writes(c.dst, static_cast<size_t>(c.bytes));
    race::Reads(c.src, static_cast<size_t>(c.src_bytes));
    if (c.src_bytes > 0) std::memcpy(dst, c.src, static_cast<size_t>(c.src_bytes));
    std::memset(dst + c.src_bytes, 0, static_cast<size_t>(c.bytes - c.src_bytes));
  }
  f.async_copies.erase(f.async_copies.begin(), f.async_copies.begin() + done);
  f.async_groups.erase(f.async_groups.begin(), f.async_groups.begin() + done_groups);
  for (size_t& end : f.async_groups) end -= done;
}

void* StaticShared(const void* key, size_t bytes, size_t align) {
  Run& r = CurrentRun();
  if (r.static_shared.empty()) r.static_shared.resize(kMaxStaticShared + 16);
  unsigned char* base = StaticSharedBase(r);
  for (const auto& [k, offset] : r.static_arrays) {
    if (k == key) return base + offset;
  }
  const size_t offset = (r.static_shared_bytes + align - 1) / align * align;
  if (align > 16 || offset + bytes > kMaxStaticShared) {
    std::fprintf(stderr,
                 "cuda_emu: static __shared__ arrays of a kernel take more than %zu bytes (or one "
                 "is aligned to more than 16): %zu bytes aligned to %zu at offset %zu\n",
                 kMaxStaticShared, bytes, align, offset);
    std::abort();
  }
  r.static_arrays.emplace_back(key, offset);
  r.static_shared_bytes = offset + bytes;
  std::memset(base + offset, 0xff, bytes);
  return base + offset;
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
  f.barrier_parity = r.barrier_generation & 1;
  race::Release(&r.barrier_sync[f.barrier_parity]);
  f.state = State::kAtBarrier;
  ++r.at_barrier;
  MaybeReleaseBarrier(r);
  if (f.state != State::kRunnable) Park(r, f);
  race::Acquire(&r.barrier_sync[f.barrier_parity]);
}

void SyncWarp(unsigned mask) { JoinWarp(mask, nullptr, 0, /*orders_memory=*/true); }

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
  const int buffer = JoinWarp(mask, mine, bytes, /*orders_memory=*/false);
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
  const int buffer = JoinWarp(mask, mine, bytes, /*orders_memory=*/false);
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
  if (bad) SetLastError(cudaErrorInvalidValue);
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
  r.sched_race_fiber = race::CurrentFiber();
  g_run = &r;
  race::Release(&r.launch_start_sync);
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  for (uint32_t z = 0; z < grid.z; ++z) {
    for (uint32_t y = 0; y < grid.y; ++y) {
      for (uint32_t x = 0; x < grid.x; ++x) {
        r.block.block_idx = make_uint3(x, y, z);
        const uint64_t linear = (uint64_t{z} * grid.y + y) * grid.x + x;
        r.fiber_set = static_cast<int>(linear % kFiberSets);
        r.last_block_of_set = linear + kFiberSets >= blocks;
        RunBlock(r);
      }
    }
  }
  race::Acquire(&r.launch_end_sync);
  g_run = nullptr;
  current_thread = nullptr;
  current_block = nullptr;
}

}  // namespace cuda_emu
