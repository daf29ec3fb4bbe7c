// Deferred work on the streams a program creates (pending.h): it runs when
// something waits for it, so a reader that does not wait sees the old bytes,
// as it may on a GPU. Emulation only (on a GPU the unordered reads are a race).
#include <cuda_runtime.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/counters.h"
#include "third_party/cuda/emu/fiber.h"
#include "third_party/cuda/emu/pending.h"

namespace cuda_emu {
namespace {

constexpr size_t kBytes = 64;

// The first byte of device memory, read with a synchronous copy on the
// thread's default stream (which does not wait for created streams).
int FirstByte(const void* device) {
  unsigned char b = 0;
  EXPECT_EQ(cudaMemcpy(&b, device, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}

class DeferredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&a_, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b_, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(a_, 1, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(b_, 2, kBytes), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(side_), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(event_), cudaSuccess);
    EXPECT_EQ(cudaFree(a_), cudaSuccess);
    EXPECT_EQ(cudaFree(b_), cudaSuccess);
  }
  cudaStream_t side_ = nullptr;
  cudaEvent_t event_ = nullptr;
  void* a_ = nullptr;
  void* b_ = nullptr;
};

TEST_F(DeferredTest, WorkOnACreatedStreamWaitsForASynchronization) {
  ASSERT_EQ(cudaMemsetAsync(a_, 7, kBytes, side_), cudaSuccess);
  EXPECT_EQ(FirstByte(a_), 1) << "read without waiting: the old bytes";
  ASSERT_EQ(cudaStreamSynchronize(side_), cudaSuccess);
  EXPECT_EQ(FirstByte(a_), 7);
}

TEST_F(DeferredTest, WorkOnAStreamRunsInOrder) {
  ASSERT_EQ(cudaMemsetAsync(a_, 9, kBytes, side_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, side_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a_, 3, kBytes, side_), cudaSuccess);
  EXPECT_EQ(FirstByte(b_), 2);
  ASSERT_EQ(cudaStreamSynchronize(side_), cudaSuccess);
  EXPECT_EQ(FirstByte(b_), 9) << "the copy ran after the first memset, before the second";
  EXPECT_EQ(FirstByte(a_), 3);
}

TEST_F(DeferredTest, AStreamWaitingForAnEventRunsTheWorkBeforeIt) {
  ASSERT_EQ(cudaMemsetAsync(a_, 5, kBytes, side_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, side_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a_, 6, kBytes, side_), cudaSuccess);  // after the event
  ASSERT_EQ(cudaStreamWaitEvent(cudaStreamPerThread, event_, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread),
            cudaSuccess);
  EXPECT_EQ(FirstByte(b_), 5) << "the default stream's copy ran after the event's work only";
}

TEST_F(DeferredTest, QueriesAndFreesMakeProgress) {
  ASSERT_EQ(cudaMemsetAsync(a_, 4, kBytes, side_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, side_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess) << "a polling loop must end";
  EXPECT_EQ(FirstByte(a_), 4);
  ASSERT_EQ(cudaMemsetAsync(a_, 8, kBytes, side_), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(side_), cudaSuccess);
  EXPECT_EQ(FirstByte(a_), 8);
  ASSERT_EQ(cudaMemsetAsync(b_, 11, kBytes, side_), cudaSuccess);
  void* other = nullptr;
  ASSERT_EQ(cudaMalloc(&other, 8), cudaSuccess);
  ASSERT_EQ(cudaFree(other), cudaSuccess);  // waits for the device
  EXPECT_EQ(FirstByte(b_), 11);
}

// A launch on a created stream is checked and counted when issued, and runs
// later with the arguments it was given.
TEST_F(DeferredTest, LaunchesKeepTheirArgumentsAndAreCountedWhenIssued) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto* out = static_cast<unsigned char*>(a_);
  unsigned char value = 42;
  const Counters before = ReadCounters();
  LaunchOnStream(side_, dim3(1), dim3(32), 0, [=] { out[CurrentThread().thread_idx.x] = value; });
  value = 43;
  EXPECT_EQ((ReadCounters() - before).kernel_launches, 1);
  EXPECT_EQ(FirstByte(a_), 1);
  LaunchOnStream(side_, dim3(1), dim3(4096), 0, [] {});  // too many threads: refused now
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ((ReadCounters() - before).kernel_launches, 1);
  ASSERT_EQ(cudaStreamSynchronize(side_), cudaSuccess);
  std::vector<unsigned char> got(32);
  ASSERT_EQ(cudaMemcpy(got.data(), a_, 32, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, std::vector<unsigned char>(32, 42));
}

// Work still queued on a stream that is destroyed goes on.
TEST_F(DeferredTest, DestroyingAStreamRunsItsWork) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a_, 12, kBytes, s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(FirstByte(a_), 12);
}

// CUDA_EMU_DEFER=all (the deferred_all_test target): a thread's default
// stream defers too, so another thread's stream that reads its output without
// an event sees the old bytes; the legacy stream's synchronous copy runs what
// every thread deferred first.
TEST_F(DeferredTest, WithDeferAllAnotherThreadsStreamDoesNotWaitForThisOne) {
  if (DeferModeNow() != DeferMode::kAll) GTEST_SKIP() << "CUDA_EMU_DEFER is not all";
  ASSERT_EQ(cudaMemsetAsync(a_, 13, kBytes, cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, cudaStreamPerThread), cudaSuccess);
  std::thread other([&] {
    // Its own default stream: no wait for the memset.
    ASSERT_EQ(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  });
  other.join();
  EXPECT_EQ(FirstByte(b_), 1) << "the copy ran before the memset it did not wait for";
  std::thread waits([&] {
    ASSERT_EQ(cudaStreamWaitEvent(cudaStreamPerThread, event_, 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, cudaStreamPerThread),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  });
  waits.join();
  EXPECT_EQ(FirstByte(b_), 13) << "after the event";
}

TEST_F(DeferredTest, WithDeferAllTheLegacyStreamWaitsForEveryThread) {
  if (DeferModeNow() != DeferMode::kAll) GTEST_SKIP() << "CUDA_EMU_DEFER is not all";
  std::thread other(
      [&] { ASSERT_EQ(cudaMemsetAsync(a_, 14, kBytes, cudaStreamPerThread), cudaSuccess); });
  other.join();
  EXPECT_EQ(FirstByte(a_), 14);  // cudaMemcpy: the legacy stream
}

}  // namespace
}  // namespace cuda_emu
