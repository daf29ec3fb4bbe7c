// Streams and events belong to devices (the CUDA programming guide's "Stream
// and Event Behavior"), as the emulation models them: each device has its own
// per-thread default stream, and its legacy stream and cudaDeviceSynchronize
// wait for that device's work only, except that a legacy copy touching
// another device's memory waits for that device's too; a kernel launched on a
// stream of another device, or an event recorded on one, fails; a stream may
// wait for another device's event. Emulation only (2 devices and CUDA_EMU_DEFER=all from the
// BUILD file, so the threads' default streams hold their work too).
#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/fiber.h"
#include "third_party/cuda/emu/pending.h"

namespace cuda_emu {
namespace {

constexpr size_t kBytes = 64;

// The first byte of device memory, read with a synchronous copy on the
// current device's legacy stream.
int FirstByte(const void* device) {
  unsigned char b = 0;
  EXPECT_EQ(cudaMemcpy(&b, device, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  return b;
}

class DevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(DeviceCount(), 2);
    ASSERT_EQ(DeferModeNow(), DeferMode::kAll);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&on0_, kBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(on0_, 1, kBytes), cudaSuccess);
  }
  void TearDown() override {
    cudaSetDevice(0);
    EXPECT_EQ(cudaFree(on0_), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  void* on0_ = nullptr;
};

TEST_F(DevicesTest, EachDeviceHasItsOwnPerThreadStream) {
  ASSERT_EQ(cudaMemsetAsync(on0_, 7, kBytes, cudaStreamPerThread), cudaSuccess);  // cuda:0's
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* on1 = nullptr;
  ASSERT_EQ(cudaMalloc(&on1, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(on1, 2, kBytes), cudaSuccess);  // cuda:1's legacy stream
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);  // cuda:1's: empty
  EXPECT_EQ(FirstByte(on1), 2);
  // The emulation's device memory is the host's: cuda:0's memset has not run.
  EXPECT_EQ(*static_cast<const unsigned char*>(on0_), 1) << "cuda:1's streams ran cuda:0's work";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(FirstByte(on0_), 7);
  EXPECT_EQ(cudaFree(on1), cudaSuccess);
}

// A copy on the legacy stream that reads or writes another device's memory
// waits for that device's earlier work too (the CUDA programming guide,
// "Peer-to-Peer Memory Copy").
TEST_F(DevicesTest, ALegacyCopyBetweenDevicesWaitsForBoth) {
  ASSERT_EQ(cudaMemsetAsync(on0_, 7, kBytes, cudaStreamPerThread), cudaSuccess);  // cuda:0's
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* on1 = nullptr;
  ASSERT_EQ(cudaMalloc(&on1, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(on1, 2, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(on1, 4, 1, cudaStreamPerThread), cudaSuccess);  // cuda:1's
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(FirstByte(on1), 4) << "a copy from cuda:1's memory with cuda:0 current";
  ASSERT_EQ(cudaMemsetAsync(on0_, 9, kBytes, cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(on1, on0_, kBytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(FirstByte(on1), 9);
  EXPECT_EQ(cudaFree(on1), cudaSuccess);
}

TEST_F(DevicesTest, DeviceSynchronizeWaitsForTheCurrentDeviceOnly) {
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(on0_, 9, kBytes, side), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(FirstByte(on0_), 1) << "cuda:1's synchronization ran cuda:0's stream";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(FirstByte(on0_), 9);
  EXPECT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

TEST_F(DevicesTest, AKernelOnAStreamOfAnotherDeviceFails) {
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);  // cuda:0's
  unsigned char* p = static_cast<unsigned char*>(on0_);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  LaunchOnStream(side, dim3(1), dim3(1), 0, [p] { p[0] = 5; }, "Write5");
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  EXPECT_EQ(FirstByte(on0_), 1) << "the refused kernel ran";
  LaunchOnStream(side, dim3(1), dim3(1), 0, [p] { p[0] = 5; }, "Write5");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  EXPECT_EQ(FirstByte(on0_), 5);
  EXPECT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

TEST_F(DevicesTest, AnEventIsRecordedOnlyOnItsDevicesStreams) {
  cudaEvent_t event0 = nullptr, timed0 = nullptr, timed1 = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event0, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&timed0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(timed0, cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(event0, cudaStreamPerThread), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaEventCreate(&timed1), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(timed1, cudaStreamPerThread), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed0, timed1), cudaErrorInvalidResourceHandle)
      << "events of two devices";
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  for (cudaEvent_t e : {event0, timed0, timed1}) EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

// How two devices are ordered: a stream waits for an event of another device.
TEST_F(DevicesTest, AStreamWaitsForAnotherDevicesEvent) {
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(on0_, 3, kBytes, cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, cudaStreamPerThread), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(cudaStreamPerThread, written, 0), cudaSuccess);
  EXPECT_EQ(FirstByte(on0_), 3) << "cuda:1's legacy stream waits for its per-thread stream";
  EXPECT_EQ(cudaEventDestroy(written), cudaSuccess);
}

}  // namespace
}  // namespace cuda_emu
