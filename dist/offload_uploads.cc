// FSDP cpu_offload's uploads on a stream of their own (offload_uploads.h).
#include "dist/offload_uploads.h"

#include <algorithm>

#include "tensor/error.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace internal {

namespace cuda = tensor::cuda;

OffloadUploads::OffloadUploads(int device) : device_(device) {
  stream_ = cuda::CreateStream(device);
  uploaded_ = cuda::CreateEvent(device);
}

OffloadUploads::~OffloadUploads() {
  cuda::SynchronizeStream(stream_, device_);
  cuda::DestroyEvent(uploaded_, device_);
  cuda::DestroyStream(stream_, device_);
}

void OffloadUploads::Reserve(tensor::Dtype dtype, int64_t numel, int count) {
  OP_CHECK(numel >= 0 && count >= 0, "fsdp", "offload uploads: bad reservation of ", count,
           " slots of ", numel, " values");
  int64_t& size = slot_numel_[dtype];
  size = std::max(size, numel);
  for (int i = 0; i < count; ++i) AddSlot(dtype, size);
}

int OffloadUploads::AddSlot(tensor::Dtype dtype, int64_t numel) {
  tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
  Slot slot;
  slot.dtype = dtype;
  slot.device = tensor::Tensor::Empty({numel}, dtype, tensor::Device::Cuda(device_));
  if (dtype != tensor::Dtype::kF32) slot.host = tensor::Tensor::EmptyPinned({numel}, dtype);
  // The block came from this thread's cache: kernels the thread queued may
  // still use it. The upload stream writes it only after them.
  cuda::EventHandle allocated = cuda::CreateEvent(device_);
  cuda::RecordEvent(allocated, nullptr, device_);
  cuda::StreamWaitEvent(stream_, allocated, device_);
  cuda::DestroyEvent(allocated, device_);
  slots_.push_back(std::move(slot));
  return static_cast<int>(slots_.size()) - 1;
}

OffloadUploads::Upload OffloadUploads::Start(const tensor::Tensor& shard, tensor::Dtype dtype) {
  OP_CHECK(shard.device().is_cpu() && shard.is_contiguous() &&
               shard.dtype() == tensor::Dtype::kF32 && cuda::IsPinnedHost(shard.raw_data()),
           "fsdp", "offload upload: the shard must be contiguous f32 in page-locked host memory");
  const int64_t n = shard.numel();
  int slot = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.busy && s.dtype == dtype && s.device.numel() >= n) {
      slot = static_cast<int>(i);
      break;
    }
  }
  if (slot < 0) slot = AddSlot(dtype, std::max(n, slot_numel_[dtype]));
  Slot& s = slots_[slot];
  const void* source = shard.raw_data();
  if (dtype != shard.dtype()) {
    // Free: the last upload from it was read by a reader that has finished.
    tensor::Tensor cast = s.host.Narrow(0, 0, n);
    cast.CopyFrom(shard);  // on the host, f32 -> dtype
    source = cast.raw_data();
  }
  tensor::Tensor values = s.device.Narrow(0, 0, n);
  cuda::CopyToDeviceOnStream(values.raw_data(), source, values.nbytes(), device_, stream_);
  cuda::RecordEvent(uploaded_, stream_, device_);
  cuda::StreamWaitEvent(nullptr, uploaded_, device_);  // the thread's next work sees them
  s.busy = true;
  return Upload{slot, values};
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
