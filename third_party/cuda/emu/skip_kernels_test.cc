// CUDA_EMU_KERNELS=skip (this target's environment): launches are checked,
// counted and queued in their stream's order but compute nothing; copies and
// memsets move their bytes up to kSkipBytesAbove and skip larger ones. What
// a program then spends is its host work (pending.h's KernelsRun).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/counters.h"
#include "third_party/cuda/emu/fiber.h"
#include "third_party/cuda/emu/pending.h"

namespace cuda_emu {
namespace {

int FirstByte(const void* device) {
  unsigned char b = 0;
  EXPECT_EQ(cudaMemcpy(&b, device, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}

TEST(SkipKernelsTest, LaunchesAreCountedAndComputeNothing) {
  ASSERT_FALSE(KernelsRun()) << "CUDA_EMU_KERNELS is not skip";
  const uint64_t before = ReadCounters().kernel_launches;
  bool ran = false;
  LaunchOnStream(nullptr, dim3(2), dim3(32), 0, [&ran] { ran = true; });
  EXPECT_FALSE(ran);
  EXPECT_EQ(ReadCounters().kernel_launches, before + 1);
}

TEST(SkipKernelsTest, BadLaunchesStillFail) {
  LaunchOnStream(nullptr, dim3(1), dim3(2048), 0, [] {});
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(SkipKernelsTest, SmallCopiesAndMemsetsMoveTheirBytesLargeOnesDoNot) {
  const size_t small_n = kSkipBytesAbove, large_n = kSkipBytesAbove + 1;
  void *small = nullptr, *large = nullptr;
  ASSERT_EQ(cudaMalloc(&small, small_n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&large, large_n), cudaSuccess);
  // New device memory holds 0xff bytes (NaN in every float type).
  ASSERT_EQ(cudaMemset(small, 7, small_n), cudaSuccess);
  ASSERT_EQ(cudaMemset(large, 7, large_n), cudaSuccess);
  EXPECT_EQ(FirstByte(small), 7);
  EXPECT_EQ(FirstByte(large), 0xff);

  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(small, 8, small_n, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(large, 8, large_n, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(FirstByte(small), 8);
  EXPECT_EQ(FirstByte(large), 0xff);

  const std::vector<unsigned char> nines(large_n, 9);
  ASSERT_EQ(cudaMemcpy(small, nines.data(), small_n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(large, nines.data(), large_n, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(FirstByte(small), 9);
  EXPECT_EQ(FirstByte(large), 0xff);
  ASSERT_EQ(cudaMemcpyAsync(large, small, small_n, cudaMemcpyDeviceToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(FirstByte(large), 9) << "a small device-to-device copy";

  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFree(small), cudaSuccess);
  EXPECT_EQ(cudaFree(large), cudaSuccess);
}

}  // namespace
}  // namespace cuda_emu
