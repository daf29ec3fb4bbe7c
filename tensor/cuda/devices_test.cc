// Copies between two GPUs (Tensor::To, CopyFrom): after the work queued
// before them on both devices, by any thread, and before the work queued after
// them on either (a copy on the legacy stream between two devices, the CUDA
// programming guide's "Peer-to-Peer Memory Copy"). Needs 2 devices; on the
// emulation (the BUILD file gives it 2, and CUDA_EMU_DEFER=all, so each
// stream's work waits until something waits for it), a copy out of that
// order reads bytes nobody wrote yet.
#include <cstdint>
#include <future>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/ops/elementwise.h"
#include "tensor/tensor.h"

namespace tensor {
namespace {

constexpr int64_t kN = 4096;

// A value no earlier fill of a cached block could have left there.
float FreshValue() {
  static int calls = 0;
  return 1000.0f + static_cast<float>(absl::ToUnixMicros(absl::Now()) % 100000) + 0.25f * ++calls;
}

std::vector<float> Filled(float value) { return std::vector<float>(kN, value); }

TEST(CudaDevicesTest, ACopyWaitsForTheSourcesKernels) {
  SKIP_WITHOUT_GPUS(2);
  for (const auto& [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) {
    const float value = FreshValue();
    Tensor a = Tensor::Full({kN}, value, Dtype::kF32, Device::Cuda(from));  // queued on `from`
    Tensor b = a.To(Device::Cuda(to));
    EXPECT_EQ(b.device(), Device::Cuda(to));
    EXPECT_EQ(b.ToVector<float>(), Filled(value)) << "cuda:" << from << " -> cuda:" << to;
  }
}

TEST(CudaDevicesTest, TheDestinationsKernelsWaitForTheCopy) {
  SKIP_WITHOUT_GPUS(2);
  const float value = FreshValue();
  Tensor a = Tensor::Full({kN}, value, Dtype::kF32, Device::Cuda(0));
  Tensor b = a.To(Device::Cuda(1));
  Tensor doubled = Scale(b, 2.0);  // a kernel on cuda:1
  EXPECT_EQ(doubled.ToVector<float>(), Filled(2 * value));
  // CopyFrom into a tensor that lives on the destination already.
  Tensor c = Tensor::Full({kN}, 0.0, Dtype::kF32, Device::Cuda(1));
  c.CopyFrom(Tensor::Full({kN}, value + 1, Dtype::kF32, Device::Cuda(0)));
  EXPECT_EQ(Scale(c, 2.0).ToVector<float>(), Filled(2 * (value + 1)));
}

// The source written by another thread's stream (its rank, a data loader):
// the copy waits for it too (two events on the calling thread's streams, as
// PyTorch orders its copies between GPUs, would not).
TEST(CudaDevicesTest, ACopyWaitsForAnotherThreadsKernels) {
  SKIP_WITHOUT_GPUS(2);
  const float value = FreshValue();
  Tensor a;
  std::promise<void> written, copied;
  // The writer lives on until the copy is made (a thread's exit drains its
  // streams): its fill is still queued (deferred on the emulation).
  std::thread writer([&] {
    a = Tensor::Full({kN}, value, Dtype::kF32, Device::Cuda(0));
    written.set_value();
    copied.get_future().wait();
  });
  written.get_future().wait();
  Tensor b = a.To(Device::Cuda(1));
  std::vector<float> got = b.ToVector<float>();
  copied.set_value();
  writer.join();
  EXPECT_EQ(got, Filled(value));
}

// The source's block, freed after the copy, goes back to cuda:0's cache and
// to the next tensor of its size there: that tensor's fill must come after
// the copy has read the block.
TEST(CudaDevicesTest, TheSourcesBlockIsReusedOnlyAfterTheCopyReadIt) {
  SKIP_WITHOUT_GPUS(2);
  const float first = FreshValue();
  const float second = first + 1;
  Tensor b;
  const void* block = nullptr;
  {
    Tensor a = Tensor::Full({kN}, first, Dtype::kF32, Device::Cuda(0));
    block = a.raw_data();
    b = a.To(Device::Cuda(1));
  }
  Tensor reused = Tensor::Full({kN}, second, Dtype::kF32, Device::Cuda(0));
  ASSERT_EQ(reused.raw_data(), block) << "the allocator did not hand the block out again";
  EXPECT_EQ(reused.ToVector<float>(), Filled(second));  // cuda:0's work has run
  EXPECT_EQ(b.ToVector<float>(), Filled(first));
}

}  // namespace
}  // namespace tensor
