// The emulation's counters (counters.h): which calls count as launches, host
// synchronizations, allocations and copies.
#include "third_party/cuda/emu/counters.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "third_party/cuda/emu/emu_test_kernels.h"

namespace cuda_emu {
namespace {

// The host syncs a call adds.
template <typename Fn>
int64_t SyncsOf(Fn&& fn) {
  const Counters before = ReadCounters();
  fn();
  return (ReadCounters() - before).host_syncs;
}

TEST(CountersTest, ClassifiesCallsAsTheRuntimeDocumentsThem) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing queued from here on
  const Counters start = ReadCounters();
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 64 * sizeof(float)), cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 64 * sizeof(float), 0), cudaSuccess);
  float pageable[64] = {};
  const size_t bytes = sizeof(pageable);
  Counters c = ReadCounters() - start;
  EXPECT_EQ(c.device_allocs, 1);
  EXPECT_EQ(c.pinned_allocs, 1);
  EXPECT_EQ(c.host_syncs, 0);

  auto queue_work = [&] {  // a device memset queues and never waits
    EXPECT_EQ(SyncsOf([&] { cudaMemsetAsync(device, 0, bytes, cudaStreamPerThread); }), 0);
  };

  // Host -> device: a synchronous copy waits for the queued work, an
  // asynchronous one from pinned memory does not; with nothing queued a
  // synchronous copy has nothing to wait for.
  const Counters copies = ReadCounters();
  queue_work();
  EXPECT_EQ(SyncsOf([&] { cudaMemcpy(device, pageable, bytes, cudaMemcpyHostToDevice); }), 1);
  EXPECT_EQ(SyncsOf([&] { cudaMemcpy(device, pageable, bytes, cudaMemcpyHostToDevice); }), 0);
  queue_work();
  EXPECT_EQ(SyncsOf([&] {
              cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread);
            }),
            0);
  EXPECT_EQ(SyncsOf([&] { cudaStreamSynchronize(cudaStreamPerThread); }), 1);
  EXPECT_EQ(SyncsOf([&] { cudaStreamSynchronize(cudaStreamPerThread); }), 0);

  // Device -> host: asynchronous into pinned memory only; into pageable
  // memory even cudaMemcpyAsync returns when the copy is done.
  queue_work();
  EXPECT_EQ(SyncsOf([&] {
              cudaMemcpyAsync(pinned, device, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread);
            }),
            0);
  EXPECT_EQ(SyncsOf([&] {
              cudaMemcpyAsync(pageable, device, bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread);
            }),
            1);
  queue_work();
  EXPECT_EQ(SyncsOf([&] { cudaMemcpy(pageable, device, bytes, cudaMemcpyDeviceToHost); }), 1);
  c = ReadCounters() - copies;
  EXPECT_EQ(c.copies_to_device, 3);
  EXPECT_EQ(c.copies_to_host, 3);

  // Device -> device copies queue; synchronizations and cudaFree wait for them.
  EXPECT_EQ(SyncsOf([&] {
              cudaMemcpy(device + 32, device, 32 * sizeof(float), cudaMemcpyDeviceToDevice);
            }),
            0);
  EXPECT_EQ(SyncsOf([&] { cudaDeviceSynchronize(); }), 1);
  queue_work();
  EXPECT_EQ(SyncsOf([&] { cudaFree(device); }), 1);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ((ReadCounters() - start).device_frees, 1);
}

TEST(CountersTest, CountsKernelLaunches) {
  const Counters before = ReadCounters();
  const std::vector<float> out = cuda_emu_test::ReverseThroughSharedMemory(std::vector<float>(768));
  const Counters c = ReadCounters() - before;
  EXPECT_EQ(out.size(), 768u);
  EXPECT_EQ(c.kernel_launches, 1);
  EXPECT_NE(c.ToString().find("kernel launches 1"), std::string::npos) << c.ToString();
}

// Memsets, synchronous or not, count apart from the launches (an empty one
// does nothing and is not counted).
TEST(CountersTest, CountsMemsets) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 64 * sizeof(float)), cudaSuccess);
  const Counters before = ReadCounters();
  ASSERT_EQ(cudaMemset(device, 0, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 0, 16 * sizeof(float), nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 0, 0, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Counters c = ReadCounters() - before;
  EXPECT_EQ(c.memsets, 2) << c.ToString();
  EXPECT_EQ(c.kernel_launches, 0) << c.ToString();
  EXPECT_NE(c.ToString().find("memsets 2"), std::string::npos) << c.ToString();
  ASSERT_EQ(cudaFree(device), cudaSuccess);
}

// CUDA_EMU_LAUNCH_CENSUS=1 lists the launches per kernel at exit (in a fresh
// process: the environment is read at the first launch).
TEST(CountersDeathTest, LaunchCensusListsKernelsByNameAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("CUDA_EMU_LAUNCH_CENSUS", "1", 1);
        for (int i = 0; i < 3; ++i) {
          cuda_emu_test::ReverseThroughSharedMemory(std::vector<float>(256));
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "launch census: 3 launches\n +3 ReverseKernel\n");
}

// Only the call after the warm-up is counted: an allocation made by the
// first call alone (a cache filling) does not show.
TEST(CountersTest, CountSteadyCallCountsTheCallAfterTheWarmUp) {
  float* cached = nullptr;
  int calls = 0;
  const Counters c = CountSteadyCall([&] {
    if (cached == nullptr) {
      ASSERT_EQ(cudaMalloc(&cached, 16 * sizeof(float)), cudaSuccess);
    }
    ASSERT_EQ(cudaMemset(cached, 0, 16 * sizeof(float)), cudaSuccess);
    ++calls;
  });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(c.device_allocs, 0) << c.ToString();
  ASSERT_EQ(cudaFree(cached), cudaSuccess);
  // Without warm-up the first call is the one counted.
  float* fresh = nullptr;
  const Counters first = CountSteadyCall(
      [&] { ASSERT_EQ(cudaMalloc(&fresh, 16 * sizeof(float)), cudaSuccess); }, /*warmup=*/0);
  EXPECT_EQ(first.device_allocs, 1) << first.ToString();
  ASSERT_EQ(cudaFree(fresh), cudaSuccess);
}

}  // namespace
}  // namespace cuda_emu
