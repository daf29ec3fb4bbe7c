// AllocatorFor and Storage. The CPU allocator itself is in tensor/cpu_allocator.h.
#include "tensor/allocator.h"

#include "tensor/cpu_allocator.h"
#include "tensor/cuda_backend.h"

namespace tensor {

Allocator& AllocatorFor(Device device) {
  if (device.is_cuda()) return cuda::DeviceAllocator(device.index);
  return ProcessCpuAllocator();
}

std::shared_ptr<Storage> Storage::Allocate(int64_t nbytes, Device device) {
  return Allocate(nbytes, device, AllocatorFor(device));
}

std::shared_ptr<Storage> Storage::Allocate(int64_t nbytes, Device device, Allocator& allocator) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = allocator.Allocate(nbytes);
  s->allocator_ = &allocator;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->category_ = CurrentMemoryCategory();
  s->ledger_ = &MemoryLedger::Current();
  s->ledger_->RecordAlloc(device, s->category_, nbytes);
  return s;
}

std::shared_ptr<Storage> Storage::Wrap(void* data, int64_t nbytes, Device device,
                                       std::function<void()> release) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->release_ = std::move(release);
  return s;
}

Storage::~Storage() {
  if (ledger_ != nullptr) {
    allocator_->Deallocate(data_, nbytes_);
    ledger_->RecordFree(device_, category_, nbytes_);
  } else if (release_) {
    release_();
  }
}

}  // namespace tensor
