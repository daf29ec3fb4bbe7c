// Block execution of the CUDA emulation (see cuda_emu.h): the CUDA threads of
// a block run as fibers on the launching thread and switch only where CUDA
// threads meet (__syncthreads, warp collectives).
#ifndef THIRD_PARTY_CUDA_EMU_FIBER_H_
#define THIRD_PARTY_CUDA_EMU_FIBER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

// --config=cuda_emu_race: the emulation built with ThreadSanitizer, which
// then checks the kernels for data races as compute-sanitizer's racecheck
// does on a GPU. Each CUDA thread is a ThreadSanitizer fiber, and switching
// fibers orders nothing: only what orders memory on the GPU does, so a race
// is reported whatever order the fibers happen to run in.
//  - __syncthreads orders the block's threads; __syncwarp the lanes in its
//    mask. Shuffles, votes, mma.sync and ldmatrix order nothing.
//  - Launches are ordered in stream order. The blocks of a launch are not
//    ordered: two blocks accessing one global word (not both atomically,
//    one of them writing) race, reported for neighbouring blocks (in the
//    linear block order; the check has two sets of fibers, and a block runs
//    on the same set as the block two before it). Each block's shared memory
//    (static and dynamic) is a fresh allocation, as on the GPU.
//  - Atomics are atomic accesses (no race with each other; relaxed).
//  - A cp.async writes its destination (and reads its source) both when it
//    is issued and when its group is waited for: a read of the destination
//    by another thread that is not ordered after the wait, or a write or read
//    not ordered before the issue, is a race.
// Only the kernels are instrumented: the host code, the emulation's own
// bookkeeping (fiber.cc) and libc's accesses (TSAN_OPTIONS
// ignore_interceptors_accesses=1) are not checked. A report names the
// kernel's source lines; the fiber's name gives the thread and warp.
// (fiber.cc, uninstrumented, gets CUDA_EMU_RACECHECK=1 from the build.)
#ifndef CUDA_EMU_RACECHECK
#if defined(__SANITIZE_THREAD__)
#define CUDA_EMU_RACECHECK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUDA_EMU_RACECHECK 1
#endif
#endif
#endif
#ifndef CUDA_EMU_RACECHECK
#define CUDA_EMU_RACECHECK 0
#endif

namespace cuda_emu {

// Whether this build checks kernels for data races (CUDA_EMU_RACECHECK).
inline constexpr bool kRaceCheck = CUDA_EMU_RACECHECK != 0;

struct ThreadState {
  uint3 thread_idx;
  int lane;  // linear thread index % 32
  int warp;  // linear thread index / 32
};

struct BlockState {
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// The CUDA thread / block running now (set by the scheduler before it
// switches to a fiber; only meaningful inside a launch).
inline thread_local const ThreadState* current_thread = nullptr;
inline thread_local const BlockState* current_block = nullptr;
inline const ThreadState& CurrentThread() { return *current_thread; }
inline const BlockState& CurrentBlock() { return *current_block; }

// Runs `body` once per thread of every block of the grid. Invalid geometry
// (empty or oversized grid or block, too much dynamic shared memory) records
// cudaErrorInvalidValue for cudaGetLastError and runs nothing, as CUDA 13
// does on an H200 (seen there for each of those cases; older CUDA said
// cudaErrorInvalidConfiguration for some). A
// block whose threads cannot all proceed (a barrier or warp collective that
// some of them never reach) aborts the process naming the kernel's block.
// Counts nothing: LaunchOnStream counts the launch when it is issued.
void Launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body);

// A GPU faults on an access of `bytes` bytes (a vector load or store) at an
// address that is not a multiple of `bytes` ("misaligned address"; the
// context is lost); a CPU would not. Kernels check their vector accesses
// (tensor/cuda/common.cuh's CheckAligned) and the emulation aborts here,
// naming the block and thread.
[[noreturn]] void MisalignedAccess(const void* p, int bytes);

// Whether Launch would take the geometry; false records cudaErrorInvalidValue.
bool CheckLaunchConfig(dim3 grid, dim3 block, size_t dynamic_shared_bytes);

// A launch on `stream`: deferred on a created stream (pending.h: checked and
// counted now, run when something waits for it), else run now after the
// stream's pending work. `name` (the kernel's) goes to the launch census.
void LaunchOnStream(cudaStream_t stream, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                    std::function<void()> body, const char* name = "kernel");

// The block's dynamic shared memory (`extern __shared__`), 16-byte aligned,
// filled with 0xff bytes (NaN in every float type) when each block starts.
void* DynamicSharedMemory();
// Above kDefaultDynamicShared bytes of dynamic shared memory a GPU launches a
// kernel only after cudaFuncSetAttribute(kernel,
// cudaFuncAttributeMaxDynamicSharedMemorySize, >= the bytes) raised its limit;
// the launch fails otherwise. `kernel` (transform.py passes the address of the
// kernel declaring the memory; nullptr: not checked) is checked once per
// launch: a launch the GPU would refuse aborts, naming the bytes and the limit.
constexpr size_t kDefaultDynamicShared = 48 << 10;
void CheckDynamicSharedLimit(const void* kernel);
template <typename T>
T* DynamicShared(const void* kernel = nullptr) {
  CheckDynamicSharedLimit(kernel);
  return static_cast<T*>(DynamicSharedMemory());
}
// The kernel's dynamic shared memory limit: kDefaultDynamicShared, or what
// cudaFuncSetAttribute set (runtime.cc).
size_t MaxDynamicSharedBytes(const void* kernel);
// The running block's copy of the static __shared__ array declared where
// `key` (a static local of the kernel's source) is: `bytes` of block memory
// aligned to `align`, placed when a thread of the launch first reaches the
// declaration, filled with 0xff bytes when each block starts. Static shared
// memory above 48 KiB aborts (the GPU's limit). transform.py rewrites each
// static __shared__ declaration into a call.
void* StaticShared(const void* key, size_t bytes, size_t align);

// Whether [p, p + bytes) lies in the running block's dynamic shared memory.
bool InDynamicSharedMemory(const void* p, size_t bytes);
// Aborts naming the block and thread: `what` (e.g. an ldmatrix) took an
// address outside the block's dynamic shared memory, where a GPU reads
// whatever that shared-window address holds (or faults).
[[noreturn]] void NotInSharedMemory(const char* what, const void* p);

// cp.async (PTX ISA, "Data movement: cp.async"): copies `bytes` (4, 8 or 16,
// both addresses aligned to it) from global memory into the block's dynamic
// shared memory, reading `src_bytes` of them and zero-filling the rest. The
// copy is only recorded: it lands when this thread waits for its group
// (AsyncCopyWait), so a read of the destination before the wait sees the old
// bytes, as it may on the GPU. cp.async.commit_group closes the thread's
// group of copies issued since the last one; cp.async.wait_group N completes
// every committed group but the newest N. Copies never waited for are dropped
// when the block ends.
void AsyncCopyToShared(void* dst, const void* src, int bytes, int src_bytes);
void AsyncCopyCommit();
void AsyncCopyWait(int newest_pending);

// __syncthreads: waits until every thread of the block that has not exited
// arrives.
void SyncThreads();
// __syncwarp(mask): waits until every lane in mask that has not exited
// arrives with the same mask.
void SyncWarp(unsigned mask);
// Lanes of the current warp that exist and have not exited.
unsigned LiveLanes();

// A warp collective over `mask`: every participating lane contributes `bytes`
// (at most 64) from `mine`; `all` receives 32 slots of `bytes`, lane order
// (slots of lanes outside the mask or exited hold 0xff bytes).
void WarpGather(unsigned mask, const void* mine, size_t bytes, void* all);
// The same for one source lane (a shuffle): its `bytes` into `out`, 0xff
// bytes when that lane is outside the mask or has exited.
void WarpShuffle(unsigned mask, const void* mine, size_t bytes, int src_lane, void* out);

template <typename T>
T WarpExchange(unsigned mask, T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  T r;
  WarpShuffle(mask, &v, sizeof(T), src_lane, &r);
  return r;
}
unsigned WarpBallot(unsigned mask, int pred);

// Records an error for the runtime's cudaGetLastError (runtime.cc).
void SetLastError(cudaError_t err);

}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_FIBER_H_
