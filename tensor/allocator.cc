// CPU allocator and Storage.
#include "tensor/allocator.h"

#include <cstdlib>
#include <new>

#include "tensor/cuda_backend.h"

namespace tensor {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* Allocate(int64_t bytes) override {
    constexpr int64_t kAlign = 64;
    const int64_t rounded = ((bytes + kAlign - 1) / kAlign) * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void Deallocate(void* ptr, int64_t) override { std::free(ptr); }
};

}  // namespace

Allocator& AllocatorFor(Device device) {
  if (device.is_cuda()) return cuda::DeviceAllocator(device.index);
  static CpuAllocator* const cpu = new CpuAllocator();
  return *cpu;
}

std::shared_ptr<Storage> Storage::Allocate(int64_t nbytes, Device device) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = AllocatorFor(device).Allocate(nbytes);
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
    AllocatorFor(device_).Deallocate(data_, nbytes_);
    ledger_->RecordFree(device_, category_, nbytes_);
  } else if (release_) {
    release_();
  }
}

}  // namespace tensor
