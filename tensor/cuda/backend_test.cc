// CUDA backend: allocation charged to the ledger, round trips host <-> device,
// running out of device memory, and the caching allocator's per-thread pools (a freed block goes back to the
// thread that allocated it; concurrent rank threads never share a block).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace tensor {
namespace {

TEST(CudaBackendTest, RoundTripAndLedger) {
  ASSERT_TRUE(cuda::Built());
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  Tensor host = Tensor::FromVector(values, {2, 3});
  Tensor dev = host.To(Device::Cuda(0));
  EXPECT_EQ(dev.device(), Device::Cuda(0));
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).current, 24);
  EXPECT_EQ(dev.To(Device::Cpu()).ToVector<float>(), values);
  dev = Tensor();
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).current, 0);
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).peak, 24);
}

// Page-locked host tensors: CPU tensors whose memory the GPU copies from and
// to directly; charged to the ledger as CPU memory; freed blocks reused.
TEST(CudaBackendTest, PinnedHostTensors) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  Tensor pinned = Tensor::EmptyPinned({1000}, Dtype::kF32);
  EXPECT_TRUE(pinned.device().is_cpu());
  EXPECT_TRUE(cuda::IsPinnedHost(pinned.raw_data()));
  EXPECT_FALSE(cuda::IsPinnedHost(Tensor::Empty({1000}).raw_data()));
  EXPECT_GE(ledger.Total(Device::Cpu()).current, 4000);
  std::vector<float> values(1000);
  for (int i = 0; i < 1000; ++i) values[i] = 0.5f * i;
  pinned.CopyFrom(Tensor::FromVector(values, {1000}));
  Tensor dev = pinned.To(Device::Cuda(0));
  Tensor back = Tensor::EmptyPinned({1000}, Dtype::kF32);
  back.CopyFrom(dev);
  EXPECT_EQ(back.ToVector<float>(), values);
  const void* first = pinned.raw_data();
  pinned = Tensor();
  EXPECT_EQ(Tensor::EmptyPinned({1000}, Dtype::kF32).raw_data(), first) << "a cached block";
}

// ToQueued: the copy to the GPU is queued on the thread's stream and its
// staging block is held until the copy has run, so the source may change at
// once and the next upload cannot take the block early (under
// CUDA_EMU_DEFER=all the emulation runs the copies only when the results are
// read: a block released at the call would hand the first copy the second's
// bytes). Charged to the ledger on the GPU only.
TEST(CudaBackendTest, QueuedUploadsKeepTheirBytes) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  const Device gpu = Device::Cuda(0);
  std::vector<int64_t> a(300), b(300);
  for (int i = 0; i < 300; ++i) {
    a[i] = i;
    b[i] = 1000 + i;
  }
  Tensor host = Tensor::FromData<int64_t>(a, {10, 30});  // (10, 30)
  Tensor first = host.ToQueued(gpu);
  host.CopyFrom(Tensor::FromData<int64_t>(b, {10, 30}));  // the source changes at once
  Tensor second = host.ToQueued(gpu);
  host = Tensor();
  // A strided source (a transposed view) arrives in its logical order.
  Tensor third = Tensor::FromData<int64_t>(a, {10, 30}).Transpose(0, 1).ToQueued(gpu);  // (30, 10)
  EXPECT_EQ(first.device(), gpu);
  EXPECT_EQ(ledger.Total(gpu).current, 3 * 300 * 8);
  EXPECT_EQ(ledger.Total(Device::Cpu()).current, 0) << "the staging blocks are not charged";
  EXPECT_EQ(first.To(Device::Cpu()).ToVector<int64_t>(), a);
  EXPECT_EQ(second.To(Device::Cpu()).ToVector<int64_t>(), b);
  std::vector<int64_t> transposed(300);
  for (int i = 0; i < 30; ++i) {
    for (int j = 0; j < 10; ++j) transposed[i * 10 + j] = a[j * 30 + i];
  }
  EXPECT_EQ(third.shape(), Shape({30, 10}));
  EXPECT_EQ(third.To(Device::Cpu()).ToVector<int64_t>(), transposed);
  // Many uploads in a row (their blocks given back as their copies run:
  // //models/mingpt:gpu_step_counts_test pins that a steady step takes no new
  // page-locked block).
  for (int i = 0; i < 20; ++i) {
    Tensor again = Tensor::FromData<int64_t>(b, {10, 30}).ToQueued(gpu);
    EXPECT_EQ(again.To(Device::Cpu()).ToVector<int64_t>(), b);
  }
  // Not a CPU -> GPU copy: To's result.
  Tensor cpu = Tensor::FromData<int64_t>(a, {300});
  EXPECT_TRUE(cpu.ToQueued(Device::Cpu()).SharesStorageWith(cpu));
  EXPECT_EQ(first.ToQueued(Device::Cpu()).ToVector<int64_t>(), a);
  EXPECT_EQ(Tensor::Empty({0, 3}, Dtype::kI64).ToQueued(gpu).numel(), 0);
}

// CopyToHostOnStream on a stream of its own waits for that stream only, not
// for the kernels queued on the thread's stream (a blocking copy waits for
// them: FSDP's offloaded gradients come back this way while the backward's
// kernels run). Seen on the emulation under CUDA_EMU_DEFER=all, where the
// thread's queued work runs only when something waits for it, and where
// device memory can be read from the host to see that it has not run.
TEST(CudaBackendTest, ACopyToTheHostOnItsOwnStreamDoesNotWaitForTheThreadsStream) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  const char* defer = std::getenv("CUDA_EMU_DEFER");
  if (cuda::DeviceName(0).rfind("cuda_emu", 0) != 0 || defer == nullptr ||
      std::string(defer) != "all") {
    GTEST_SKIP() << "needs the emulation with CUDA_EMU_DEFER=all";
  }
  const Device gpu = Device::Cuda(0);
  Tensor ready = Tensor::Full({64}, 1.0, Dtype::kF32, gpu);
  cuda::SynchronizeStream(nullptr, 0);  // `ready` is written
  // A value no earlier fill of a cached block could have left there.
  const float value = 1000.0f + static_cast<float>(absl::ToUnixMicros(absl::Now()) % 100000);
  Tensor queued = Tensor::Full({64}, value, Dtype::kF32, gpu);  // deferred on the thread's stream
  Tensor host = Tensor::EmptyPinned({64}, Dtype::kF32);
  cuda::StreamHandle stream = cuda::CreateStream(0);
  cuda::CopyToHostOnStream(host.raw_data(), ready.raw_data(), ready.nbytes(), 0, stream);
  cuda::SynchronizeStream(stream, 0);
  EXPECT_EQ(host.ToVector<float>(), std::vector<float>(64, 1.0f));
  EXPECT_NE(static_cast<const float*>(queued.raw_data())[0], value)
      << "the thread's queued fill ran: the copy waited for it";
  // A blocking copy does wait for it.
  host.CopyFrom(ready);
  EXPECT_EQ(static_cast<const float*>(queued.raw_data())[0], value);
  cuda::DestroyStream(stream, 0);
}

// A CUDA call that failed (and threw) leaves no error behind for the next
// kernel launch's check on the thread, whose caller handled the first.
TEST(CudaBackendTest, AFailedCallLeavesNoErrorForTheNextLaunch) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  EXPECT_THROW(cuda::CopyOnStream(nullptr, nullptr, 4, 0, nullptr), OpError);
  const Tensor t = Tensor::Full({8}, 2.0, Dtype::kF32, Device::Cuda(0));
  EXPECT_EQ(t.ToVector<float>(), std::vector<float>(8, 2.0f));
}

TEST(CudaBackendTest, MissingDeviceIsAClearError) {
  const int n = cuda::DeviceCount();
  EXPECT_THROW(Tensor::Empty({4}, Dtype::kF32, Device::Cuda(n)), std::exception);
}

// A request the device cannot hold throws an OutOfMemoryError (a
// std::bad_alloc) naming the device, the size and category, and what the
// device and the caching allocator hold; later allocations still work.
TEST(CudaBackendTest, OutOfMemoryNamesTheDeviceAndWhatItHolds) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  MemoryLedger ledger;
  ScopedLedger use(&ledger);
  const Tensor small = Tensor::Empty({256}, Dtype::kF32, Device::Cuda(0));  // 1 KiB
  try {
    Tensor huge = Tensor::Empty({int64_t{1} << 50}, Dtype::kF32, Device::Cuda(0));  // 4 PiB
    ADD_FAILURE() << "4 PiB were allocated";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    std::printf("%s\n", message.c_str());
    EXPECT_EQ(message.rfind("[memory] out of memory on cuda:0: 4.00 PiB of temporaries asked for; "
                            "cuda:0 has ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find(" free of "), std::string::npos) << message;
    EXPECT_NE(message.find("caching allocator holding "), std::string::npos) << message;
    EXPECT_NE(message.find("the request rounds to 4.00 PiB); this thread's ledger holds 1.00 KiB "
                           "there (parameters 0 B"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(ledger.Total(Device::Cuda(0)).current, 1024);
  const Tensor after = Tensor::Zeros({4}, Dtype::kF32).To(Device::Cuda(0));
  EXPECT_EQ(after.To(Device::Cpu()).ToVector<float>(), std::vector<float>(4, 0.0f));
}

// SetDeviceMemoryLimit: past the cap a request releases the cache and then
// throws OutOfMemoryError naming the limit, as a smaller device would; under
// it requests succeed (a freed block is reused within it), and -1 lifts it.
TEST(CudaBackendTest, AMemoryLimitMakesASmallerDevice) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  EXPECT_EQ(cuda::DeviceMemoryLimit(0), -1);
  struct Lift {  // whatever fails below, the later tests run uncapped
    ~Lift() { cuda::SetDeviceMemoryLimit(0, -1); }
  } lift;
  EXPECT_THROW(cuda::SetDeviceMemoryLimit(0, -2), OpError);
  {
    const Tensor t = Tensor::Empty({1 << 20}, Dtype::kF32, Device::Cuda(0));  // 4 MiB
  }
  const int64_t cached = cuda::DeviceReservedBytes(0);
  EXPECT_GE(cuda::ReleaseCachedDeviceMemory(0), 4 << 20);  // the block freed above, at least
  EXPECT_LE(cuda::DeviceReservedBytes(0), cached - (4 << 20));
  const int64_t before = cuda::DeviceReservedBytes(0);  // live blocks only
  cuda::SetDeviceMemoryLimit(0, before + (16 << 20));  // room for 16 MiB more
  EXPECT_EQ(cuda::DeviceMemoryLimit(0), before + (16 << 20));
  {
    const Tensor fits = Tensor::Empty({int64_t{3} << 20}, Dtype::kF32, Device::Cuda(0));  // 12 MiB
    try {
      Tensor past = Tensor::Empty({int64_t{2} << 20}, Dtype::kF32, Device::Cuda(0));  // 8 MiB
      ADD_FAILURE() << "8 MiB more were allocated past the limit";
    } catch (const OutOfMemoryError& e) {
      EXPECT_NE(std::string(e.what()).find("which would take this process past its limit of "),
                std::string::npos)
          << e.what();
    }
    EXPECT_LE(cuda::DeviceReservedBytes(0), before + (16 << 20));
  }
  {
    // The 12 MiB block is free again: reused within the limit.
    const Tensor again = Tensor::Full({int64_t{3} << 20}, 2.0f).To(Device::Cuda(0));
    EXPECT_EQ(again.Narrow(0, 0, 2).To(Device::Cpu()).ToVector<float>(),
              std::vector<float>(2, 2.0f));
  }
  // 16 MiB of another size fit only once the cached 12 MiB block is released.
  const Tensor other = Tensor::Empty({int64_t{4} << 20}, Dtype::kF32, Device::Cuda(0));
  EXPECT_LE(cuda::DeviceReservedBytes(0), before + (16 << 20));
  cuda::SetDeviceMemoryLimit(0, -1);
  const Tensor lifted = Tensor::Empty({int64_t{6} << 20}, Dtype::kF32, Device::Cuda(0));  // 24 MiB
  EXPECT_EQ(cuda::DeviceMemoryLimit(0), -1);
}

TEST(CudaBackendTest, FreedBlockReturnsToTheAllocatingThread) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Allocator& alloc = cuda::DeviceAllocator(0);
  const int64_t bytes = 3 << 20;  // 4 MiB rounded
  void* mine = alloc.Allocate(bytes);
  void* theirs = nullptr;
  std::thread other([&] {
    alloc.Deallocate(mine, bytes);   // freed here: back to the main thread's pool
    theirs = alloc.Allocate(bytes);  // never `mine`: main's stream may still use it
  });
  other.join();
  EXPECT_NE(theirs, mine);
  void* again = alloc.Allocate(bytes);
  EXPECT_EQ(again, mine);  // reused from the main thread's own pool
  alloc.Deallocate(again, bytes);
  alloc.Deallocate(theirs, bytes);
}

// Two threads each run chains of asynchronous copy kernels on their own
// stream, dropping every intermediate at once (its block is reused by the
// next step while the kernels that read it may still be queued).
TEST(CudaBackendTest, ConcurrentThreadsReuseBlocksSafely) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  constexpr int kThreads = 2, kIters = 50, kSteps = 8;
  constexpr int64_t kRows = 256, kCols = 384;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < kIters; ++it) {
        std::vector<float> values(kRows * kCols);
        for (size_t i = 0; i < values.size(); ++i) {
          values[i] = static_cast<float>((t * 7919 + it * 104729 + int64_t(i)) % 65536);
        }
        Tensor x = Tensor::FromVector(values, {kRows, kCols}).To(Device::Cuda(0));
        for (int s = 0; s < kSteps; ++s) x = x.Transpose(0, 1).Contiguous();  // even: same layout
        if (x.ToVector<float>() != values) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace tensor
