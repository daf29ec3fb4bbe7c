// FSDP cpu_offload's uploads on a stream of their own (offload_uploads.h).
#include "dist/offload_uploads.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "tensor/error.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace internal {

namespace cuda = tensor::cuda;

OffloadUploads::OffloadUploads(int device) : device_(device) {
  try {
    stream_ = cuda::CreateStream(device);
    ready_ = cuda::CreateStream(device);
    uploaded_ = cuda::CreateEvent(device);
    issued_ = cuda::CreateEvent(device);
  } catch (...) {
    Destroy();
    throw;
  }
}

void OffloadUploads::Destroy() {
  if (issued_ != nullptr) cuda::DestroyEvent(issued_, device_);
  if (uploaded_ != nullptr) cuda::DestroyEvent(uploaded_, device_);
  if (ready_ != nullptr) cuda::DestroyStream(ready_, device_);
  if (stream_ != nullptr) cuda::DestroyStream(stream_, device_);
  issued_ = uploaded_ = ready_ = stream_ = nullptr;
}

OffloadUploads::~OffloadUploads() {
  try {
    cuda::SynchronizeStream(stream_, device_);  // the copies have read their sources
    Destroy();
  } catch (const std::exception& e) {  // a device that failed: nothing to do but say so
    std::fprintf(stderr, "fsdp: offload uploads of cuda:%d: %s\n", device_, e.what());
  }
}

void OffloadUploads::Reserve(tensor::Dtype dtype, int64_t numel, int count) {
  OP_CHECK(numel >= 0 && count >= 0, "fsdp", "offload uploads: bad reservation of ", count,
           " slots of ", numel, " values");
  tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
  for (int i = 0; i < count; ++i) {
    Slot slot;
    slot.dtype = dtype;
    slot.device = tensor::Tensor::Empty({numel}, dtype, tensor::Device::Cuda(device_));
    if (dtype != tensor::Dtype::kF32) slot.host = tensor::Tensor::EmptyPinned({numel}, dtype);
    slots_.push_back(std::move(slot));
  }
  // The blocks came from this thread's cache: kernels the thread queued may
  // still use them. The upload stream writes them only after those kernels.
  cuda::RecordEvent(uploaded_, nullptr, device_);
  cuda::StreamWaitEvent(stream_, uploaded_, device_);
}

std::optional<OffloadUploads::Upload> OffloadUploads::TryStart(const tensor::Tensor& shard,
                                                               tensor::Dtype dtype) {
  OP_CHECK(shard.device().is_cpu() && shard.is_contiguous() &&
               shard.dtype() == tensor::Dtype::kF32 && cuda::IsPinnedHost(shard.raw_data()),
           "fsdp", "offload upload: the shard must be contiguous f32 in page-locked host memory");
  const int64_t n = shard.numel();
  const auto free = std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) {
    return !s.busy && s.dtype == dtype && s.device.numel() >= n;
  });
  if (free == slots_.end()) return std::nullopt;
  Slot& s = *free;
  // Busy from here on: a failure below leaves the slot to a copy that may
  // have been queued.
  s.busy = true;
  const void* source = shard.raw_data();
  if (dtype != shard.dtype()) {
    // Free: the last upload from it was read by a reader that has finished.
    tensor::Tensor cast = s.host.Narrow(0, 0, n);
    cast.CopyFrom(shard);  // on the host, f32 -> dtype
    source = cast.raw_data();
  }
  tensor::Tensor values = s.device.Narrow(0, 0, n);
  cuda::CopyToDeviceOnStream(values.raw_data(), source, values.nbytes(), device_, stream_);
  // The reader's ready stream: after the copy and after the thread's work so
  // far. The thread's stream itself waits for nothing.
  cuda::RecordEvent(uploaded_, stream_, device_);
  cuda::RecordEvent(issued_, /*stream=*/nullptr, device_);
  cuda::StreamWaitEvent(ready_, uploaded_, device_);
  cuda::StreamWaitEvent(ready_, issued_, device_);
  return Upload{static_cast<int>(free - slots_.begin()), values, ready_};
}

void OffloadUploads::Release(int slot) {
  OP_CHECK(slot >= 0 && slot < slots() && slots_[slot].busy, "fsdp",
           "offload uploads: release of slot ", slot, ", which is not in use");
  slots_[slot].busy = false;
}

void OffloadUploads::WaitForReads() { cuda::SynchronizeStream(stream_, device_); }

int OffloadUploads::busy() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; }));
}

}  // namespace internal
}  // namespace dist
