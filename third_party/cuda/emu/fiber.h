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

namespace cuda_emu {

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
// cudaErrorInvalidConfiguration for cudaGetLastError and runs nothing. A
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

// Whether Launch would take the geometry; false records
// cudaErrorInvalidConfiguration.
bool CheckLaunchConfig(dim3 grid, dim3 block, size_t dynamic_shared_bytes);

// A launch on `stream`: deferred on a created stream (pending.h: checked and
// counted now, run when something waits for it), else run now after the
// stream's pending work.
void LaunchOnStream(cudaStream_t stream, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                    std::function<void()> body);

// The block's dynamic shared memory (`extern __shared__`), 16-byte aligned,
// filled with 0xff bytes (NaN in every float type) when each block starts.
void* DynamicSharedMemory();
template <typename T>
T* DynamicShared() {
  return static_cast<T*>(DynamicSharedMemory());
}
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
