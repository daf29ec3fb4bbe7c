// AllocatorFor and Storage. The CPU allocator itself is in tensor/cpu_allocator.h.
#include "tensor/allocator.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/cpu_allocator.h"
#include "tensor/cuda_backend.h"

namespace tensor {
namespace {

// "[memory] out of memory on cuda:0: 1.50 GiB of activations asked for;
// <what the allocator said>; this thread's ledger holds ... there (...)".
std::string OutOfMemoryMessage(int64_t nbytes, Device device, MemoryCategory category,
                               const MemoryLedger& ledger, const std::bad_alloc& e) {
  const bool told = dynamic_cast<const OutOfMemoryError*>(&e) != nullptr;
  std::string message = absl::StrCat("[memory] out of memory on ", device.ToString(), ": ",
                                     FormatBytes(nbytes), " of ", MemoryCategoryName(category),
                                     " asked for; ",
                                     told ? e.what() : "the allocator could not provide it");
  const MemoryStats total = ledger.Total(device);
  absl::StrAppend(&message, "; this thread's ledger holds ", FormatBytes(total.current),
                  " there (");
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    const MemoryCategory cat = static_cast<MemoryCategory>(c);
    absl::StrAppend(&message, c == 0 ? "" : ", ", MemoryCategoryName(cat), " ",
                    FormatBytes(ledger.Stats(device, cat).current));
  }
  absl::StrAppend(&message, "; peak ", FormatBytes(total.peak), ")");
  return message;
}

}  // namespace

Allocator& AllocatorFor(Device device) {
  if (device.is_cuda()) return cuda::DeviceAllocator(device.index);
  return ProcessCpuAllocator();
}

std::shared_ptr<Storage> Storage::Allocate(int64_t nbytes, Device device) {
  return Allocate(nbytes, device, AllocatorFor(device));
}

std::shared_ptr<Storage> Storage::Allocate(int64_t nbytes, Device device, Allocator& allocator) {
  const MemoryCategory category = CurrentMemoryCategory();
  MemoryLedger& ledger = MemoryLedger::Current();
  std::shared_ptr<Storage> s(new Storage());
  try {
    s->data_ = allocator.Allocate(nbytes);
  } catch (const std::bad_alloc& e) {
    throw OutOfMemoryError(OutOfMemoryMessage(nbytes, device, category, ledger, e));
  }
  s->allocator_ = &allocator;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->category_ = category;
  s->ledger_ = &ledger;
  s->ledger_->RecordAlloc(device, category, nbytes);
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
