// FSDP cpu_offload's uploads (offload_uploads.h): the values arrive for the
// reader that waits for the upload's ready stream, which comes after the
// thread's queued work; neither the copy nor the thread's later work waits
// for the other; slots are reused once released and only then. On a GPU or the emulation
// (--config=cuda / cuda_emu); skips without one. The ordering cases show
// only with CUDA_EMU_DEFER=all (//:gpu_stream_order_tests), where a reader
// that skips its wait reads the old bytes.
#include "dist/offload_uploads.h"

#include <cstdlib>
#include <optional>
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

// An upload's values as its reader sees them: the thread's stream waits for
// the upload's ready stream (as the all-gather does), then copies them.
std::vector<float> ReadAfterReady(const OffloadUploads::Upload& up) {
  tensor::cuda::EventHandle ready = tensor::cuda::CreateEvent(0);
  tensor::cuda::RecordEvent(ready, up.ready_stream, 0);
  tensor::cuda::StreamWaitEvent(/*stream=*/nullptr, ready, 0);
  tensor::cuda::DestroyEvent(ready, 0);
  return up.values.Clone().To(Device::Cpu()).To(Dtype::kF32).ToVector<float>();
}

// A value no earlier fill of a cached block could have left there.
float FreshValue() {
  return 1000.0f + static_cast<float>(absl::ToUnixMicros(absl::Now()) % 100000);
}

TEST(OffloadUploadsTest, AReaderAfterTheReadyStreamSeesEachUploadsValues) {
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
      EXPECT_EQ(ReadAfterReady(up), shard.To(dtype).To(Dtype::kF32).ToVector<float>());
      uploads.Release(up.slot);
    }
    EXPECT_EQ(uploads.slots(), 1);
  }
}

// The ordering cases, which show only under CUDA_EMU_DEFER=all (skipped
// elsewhere): one f32 slot of 64 values, whose block no queued work uses.
class OffloadUploadsOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (!DeferAll()) GTEST_SKIP() << "needs the emulation with CUDA_EMU_DEFER=all";
    uploads_.emplace(0);
    uploads_->Reserve(Dtype::kF32, 64, 1);
    tensor::cuda::SynchronizeStream(nullptr, 0);  // the slot's block is free
  }
  std::optional<OffloadUploads> uploads_;
};

// The copy runs on the uploads' stream: waiting for it does not run the
// kernels this thread queued before it (CUDA_EMU_DEFER=all defers them until
// something waits for them; a copy on the thread's stream would run them).
TEST_F(OffloadUploadsOrderTest, AnUploadDoesNotWaitForTheThreadsQueuedWork) {
  OffloadUploads& uploads = *uploads_;
  const float value = FreshValue();
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
  EXPECT_EQ(ReadAfterReady(up), shard.ToVector<float>());
  EXPECT_EQ(static_cast<const float*>(queued.raw_data())[0], value);
  uploads.Release(up.slot);
}

// The thread's kernels queued after an upload (a prefetch's overlap) do not
// wait for its copy: synchronizing the thread's stream runs them, not the
// copy (CUDA_EMU_DEFER=all; a wait of the thread's stream for the upload
// would run it).
TEST_F(OffloadUploadsOrderTest, TheThreadsLaterWorkDoesNotWaitForTheUpload) {
  OffloadUploads& uploads = *uploads_;
  const Tensor shard = PinnedRamp(64, FreshValue());
  const OffloadUploads::Upload up = uploads.TryStart(shard, Dtype::kF32).value();
  const float value = FreshValue() + 0.5f;
  Tensor later = Tensor::Full({64}, value, Dtype::kF32, Device::Cuda(0));
  tensor::cuda::SynchronizeStream(nullptr, 0);
  EXPECT_EQ(static_cast<const float*>(later.raw_data())[0], value);
  const float* landed = static_cast<const float*>(up.values.raw_data());
  EXPECT_NE(landed[0], shard.ToVector<float>()[0])
      << "the copy ran with the thread's stream: its later work waited for the upload";
  tensor::cuda::SynchronizeStream(up.ready_stream, 0);
  EXPECT_EQ(std::vector<float>(landed, landed + 64), shard.ToVector<float>());
  uploads.Release(up.slot);
}

// The ready stream comes after the work the thread queued before the upload
// (the earlier users of the all-gather's output block): synchronizing it runs
// that work (CUDA_EMU_DEFER=all).
TEST_F(OffloadUploadsOrderTest, TheReadyStreamWaitsForTheThreadsEarlierWork) {
  OffloadUploads& uploads = *uploads_;
  const float value = FreshValue();
  Tensor earlier = Tensor::Full({64}, value, Dtype::kF32, Device::Cuda(0));  // deferred
  const OffloadUploads::Upload up = uploads.TryStart(PinnedRamp(64, 1.0f), Dtype::kF32).value();
  EXPECT_NE(static_cast<const float*>(earlier.raw_data())[0], value);
  tensor::cuda::SynchronizeStream(up.ready_stream, 0);
  EXPECT_EQ(static_cast<const float*>(earlier.raw_data())[0], value)
      << "the ready stream does not wait for the thread's earlier work";
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
    EXPECT_EQ(ReadAfterReady(up), shard.ToVector<float>()) << "round " << round;
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
  EXPECT_EQ(ReadAfterReady(up_b), b.ToVector<float>());
  EXPECT_EQ(ReadAfterReady(up_c), c.ToVector<float>());
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
