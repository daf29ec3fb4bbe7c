// FSDP cpu_offload's uploads (offload_uploads.h): the values arrive for the
// thread's next work, the copy waits for none of the thread's queued work,
// slots are reused once released and only then. On a GPU or the emulation
// (--config=cuda / cuda_emu); skips without one. The ordering cases show
// only with CUDA_EMU_DEFER=all (//:gpu_stream_order_tests), where a reader
// that skips its wait reads the old bytes.
#include "dist/offload_uploads.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace dist {
namespace internal {
namespace {

using tensor::Device;
using tensor::Dtype;
using tensor::Tensor;

bool DeferAll() {
  const char* defer = std::getenv("CUDA_EMU_DEFER");
  return tensor::cuda::DeviceName(0).rfind("cuda_emu", 0) == 0 && defer != nullptr &&
         std::string(defer) == "all";
}

// n page-locked f32 values first, first + 1, ...
Tensor PinnedRamp(int64_t n, float first) {
  Tensor t = Tensor::EmptyPinned({n}, Dtype::kF32);
  float* p = static_cast<float*>(t.raw_data());
  for (int64_t i = 0; i < n; ++i) p[i] = first + static_cast<float>(i);
  return t;
}

// `values` as the thread's stream sees them: copied there, then read.
std::vector<float> ReadOnThreadsStream(const Tensor& values) {
  return values.Clone().To(Device::Cpu()).To(Dtype::kF32).ToVector<float>();
}

TEST(OffloadUploadsTest, TheThreadsStreamSeesEachUploadsValues) {
  SKIP_WITHOUT_GPU();
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(dtype));
    OffloadUploads uploads(0);
    uploads.Reserve(dtype, 64, 1);
    // Two uploads into the one slot: a read that skipped its wait would see
    // the first one's values (or the block's old bytes).
    for (float first : {1.0f, 100.0f}) {
      const Tensor shard = PinnedRamp(48, first);
      const OffloadUploads::Upload up = uploads.TryStart(shard, dtype).value();
      EXPECT_EQ(up.slot, 0);
      EXPECT_EQ(up.values.dtype(), dtype);
      EXPECT_EQ(up.values.numel(), 48);
      EXPECT_EQ(ReadOnThreadsStream(up.values), shard.To(dtype).To(Dtype::kF32).ToVector<float>());
      uploads.Release(up.slot);
    }
    EXPECT_EQ(uploads.slots(), 1);
  }
}

// The copy runs on the uploads' stream: waiting for it does not run the
// kernels this thread queued before it (CUDA_EMU_DEFER=all defers them until
// something waits for them; a copy on the thread's stream would run them).
TEST(OffloadUploadsTest, AnUploadDoesNotWaitForTheThreadsQueuedWork) {
  SKIP_WITHOUT_GPU();
  if (!DeferAll()) GTEST_SKIP() << "needs the emulation with CUDA_EMU_DEFER=all";
  OffloadUploads uploads(0);
  uploads.Reserve(Dtype::kF32, 64, 1);
  tensor::cuda::SynchronizeStream(nullptr, 0);  // the slot's block is free
  const float value = 1000.0f + static_cast<float>(absl::ToUnixMicros(absl::Now()) % 100000);
  Tensor queued = Tensor::Full({64}, value, Dtype::kF32, Device::Cuda(0));  // deferred
  const Tensor shard = PinnedRamp(64, 1.0f);
  const OffloadUploads::Upload up = uploads.TryStart(shard, Dtype::kF32).value();
  uploads.WaitForReads();
  // The emulation's device memory is the host's: read where the copy landed.
  const float* landed = static_cast<const float*>(up.values.raw_data());
  EXPECT_EQ(std::vector<float>(landed, landed + 64), shard.ToVector<float>())
      << "the copy has not run";
  EXPECT_NE(static_cast<const float*>(queued.raw_data())[0], value)
      << "the thread's queued fill ran: the upload waited for it";
  EXPECT_EQ(ReadOnThreadsStream(up.values), shard.ToVector<float>());
  EXPECT_EQ(static_cast<const float*>(queued.raw_data())[0], value);
  uploads.Release(up.slot);
}

// A slot's device block comes from the thread's cache, where a kernel the
// thread queued may still write it: the upload lands after that kernel.
TEST(OffloadUploadsTest, AnUploadLandsAfterTheThreadsLastUseOfTheSlotsBlock) {
  SKIP_WITHOUT_GPU();
  for (int round = 0; round < 3; ++round) {  // whatever the cache held before
    {
      // Queued (deferred under CUDA_EMU_DEFER=all), then freed to the cache.
      const Tensor earlier = Tensor::Full({64}, -7.0, Dtype::kF32, Device::Cuda(0));
    }
    OffloadUploads uploads(0);
    uploads.Reserve(Dtype::kF32, 64, 1);  // the same block, from the cache
    const Tensor shard = PinnedRamp(64, 1.0f);
    const OffloadUploads::Upload up = uploads.TryStart(shard, Dtype::kF32).value();
    uploads.WaitForReads();  // the copy runs now (the fill, deferred, would run after it)
    EXPECT_EQ(ReadOnThreadsStream(up.values), shard.ToVector<float>()) << "round " << round;
    uploads.Release(up.slot);
  }
}

TEST(OffloadUploadsTest, ASlotIsReusedOnlyOnceReleased) {
  SKIP_WITHOUT_GPU();
  OffloadUploads uploads(0);
  uploads.Reserve(Dtype::kF32, 32, 2);
  const Tensor a = PinnedRamp(32, 1.0f), b = PinnedRamp(20, 50.0f), c = PinnedRamp(32, 90.0f);
  const OffloadUploads::Upload up_a = uploads.TryStart(a, Dtype::kF32).value();
  const OffloadUploads::Upload up_b = uploads.TryStart(b, Dtype::kF32).value();
  EXPECT_EQ(up_a.slot, 0);
  EXPECT_EQ(up_b.slot, 1);
  EXPECT_EQ(uploads.busy(), 2);
  // None free: the caller copies the shard itself; no slot is made.
  EXPECT_FALSE(uploads.TryStart(c, Dtype::kF32).has_value());
  uploads.Release(up_a.slot);
  const OffloadUploads::Upload up_c = uploads.TryStart(c, Dtype::kF32).value();
  EXPECT_EQ(up_c.slot, 0);
  EXPECT_EQ(ReadOnThreadsStream(up_b.values), b.ToVector<float>());
  EXPECT_EQ(ReadOnThreadsStream(up_c.values), c.ToVector<float>());
  uploads.Release(up_b.slot);
  // Another dtype, or a shard larger than the slots: none of theirs.
  EXPECT_FALSE(uploads.TryStart(a, Dtype::kBF16).has_value());
  EXPECT_FALSE(uploads.TryStart(PinnedRamp(33, 3.0f), Dtype::kF32).has_value());
  EXPECT_EQ(uploads.slots(), 2);
  EXPECT_EQ(uploads.busy(), 1);
  EXPECT_THROW(uploads.Release(up_b.slot), tensor::OpError);  // released already
}

TEST(OffloadUploadsTest, AShardOutsidePageLockedMemoryIsRefused) {
  SKIP_WITHOUT_GPU();
  OffloadUploads uploads(0);
  const Tensor pageable = Tensor::Zeros({8});
  try {
    uploads.TryStart(pageable, Dtype::kF32);
    ADD_FAILURE() << "no error";
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("page-locked host memory"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace internal
}  // namespace dist
