// The emulation's report of a misaligned vector access (fiber.h's
// MisalignedAccess, reached through tensor/cuda/common.cuh's CheckAligned):
// it aborts naming the thread and block, where a GPU faults with
// "misaligned address". Emulation only.
#include <cuda_runtime.h>

#include <cstdint>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/fiber.h"

namespace cuda_emu {
namespace {

TEST(MisalignedAccessDeathTest, AbortsNamingTheThreadAndBlock) {
  alignas(16) static unsigned char buffer[64];
  EXPECT_DEATH(
      {
        LaunchOnStream(cudaStreamPerThread, dim3(2), dim3(8), 0, [] {
          const ThreadState& t = CurrentThread();
          if (CurrentBlock().block_idx.x == 1 && t.thread_idx.x == 3) {
            MisalignedAccess(buffer + 4, 16);
          }
        });
        cudaStreamSynchronize(cudaStreamPerThread);  // runs it if deferred (CUDA_EMU_DEFER=all)
      },
      "misaligned address: a 16-byte access at 0x[0-9a-f]+ \\(address % 16 = 4\\) by thread "
      "\\(3, 0, 0\\) of block \\(1, 0, 0\\)");
}

}  // namespace
}  // namespace cuda_emu
