// Kernels that pin down the CUDA semantics the emulation reproduces (warp
// shuffles, block barriers, mma.sync fragment layouts, ldmatrix,
// cp.async). Host functions: they
// take and return host vectors. Built by nvcc (--config=cuda) or against the
// emulation (--config=cuda_emu); emu_test.cc runs them on either, so on a GPU
// the same test checks the emulation's model of the hardware.
#ifndef THIRD_PARTY_CUDA_EMU_EMU_TEST_KERNELS_H_
#define THIRD_PARTY_CUDA_EMU_EMU_TEST_KERNELS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace cuda_emu_test {

// For each of 64 threads (two warps) the results of, in order:
// __shfl_xor_sync(v, 5), __shfl_down_sync(v, 3), __shfl_up_sync(v, 2),
// __shfl_sync(v, 7, width 16), a warp sum by butterfly, __ballot_sync(odd v),
// where v = 10 * thread + 1.
std::vector<int64_t> Shuffles();

// A kernel queued on a created stream (which the emulation defers until a
// wait) stores its two int arguments; their host sources change and go out
// of scope before the stream is synchronized. {7, 8}: the arguments' values at
// the launch, as on a GPU.
std::vector<int> ArgumentsAtLaunch();

// 256 threads reverse a 256-element array through shared memory (static and
// dynamic) with __syncthreads, over 3 blocks: out[b * 256 + i] = in[b * 256 +
// 255 - i] + b.
std::vector<float> ReverseThroughSharedMemory(const std::vector<float>& in);

// D (16x8, row major) = A (16x16, row major) B (16x16 x 8, row major) with one
// mma.sync.m16n8k16 (bf16 inputs, f32 accumulators starting from C).
std::vector<float> MmaBf16(const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<float>& c);

// ldmatrix.sync.aligned.m8n8.x4 from shared memory holding four 8x8 16-bit
// matrices, element (m, row, col) = m * 64 + row * 8 + col, lane l giving row
// l % 8 of matrix l / 8: out[(trans * 32 + lane) * 4 + m] is lane's r[m]
// without (trans 0) and with (trans 1) .trans.
std::vector<uint32_t> LdMatrixX4();

// An ldmatrix whose rows are in global memory (from_global) or in shared
// memory but 8 bytes off a 16-byte boundary. Emulation only: it aborts naming
// the thread; a GPU reads garbage or faults.
void LdMatrixMisused(bool from_global);

// cp.async into shared memory in two groups, per lane (32 lanes) 8 words:
// [0] the first group's destination read before any wait, [1] after
// cp.async.wait_group 1, [2] the second group's destination then, [3..6] the
// second group's four words after wait_group 0. The first group copies
// 1000 + 4 lane + i (i < 4); the second copies 5000 + 4 lane + i for i < 2
// and zero-fills i = 2, 3.
std::vector<uint32_t> AsyncCopies();

// A cp.async whose destination is global memory. Emulation only: it aborts.
void AsyncCopyToGlobal();

// A kernel with 64 KiB of dynamic shared memory adds up 16384 ones written
// there: 16384. With raise_limit its limit is raised first
// (cudaFuncSetAttribute); without, a GPU refuses the launch and the
// emulation aborts naming the limit.
float LargeDynamicShared(bool raise_limit);

// A launch with 2048 threads per block: the error cudaGetLastError reports.
std::string OversizedBlockError();

// A kernel whose lanes of one warp wait in different places (lane 0 in
// __syncwarp, the others at __syncthreads). On a GPU that hangs; the
// emulation aborts naming the block.
void MismatchedBarriers();

}  // namespace cuda_emu_test

#endif  // THIRD_PARTY_CUDA_EMU_EMU_TEST_KERNELS_H_
