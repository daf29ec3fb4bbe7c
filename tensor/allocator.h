// Device allocators and Storage: the one place tensor memory is obtained and
// released, so that every byte is charged to the memory ledger.
#ifndef TENSOR_ALLOCATOR_H_
#define TENSOR_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "tensor/device.h"
#include "tensor/memory_ledger.h"

namespace tensor {

// What running out of device or host memory throws: a std::bad_alloc (what
// code that only asks "was there no memory?" catches) whose what() says
// where, how much was asked for and what was held:
//   [memory] out of memory on cuda:0: 1.50 GiB of activations asked for;
//   cuda:0 has 0.91 GiB free of 139.80 GiB, ...; this thread's ledger holds
//   137.20 GiB there (parameters 0.46 GiB, ...)
class OutOfMemoryError : public std::bad_alloc {
 public:
  explicit OutOfMemoryError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `bytes` bytes (64-byte aligned on the CPU); throws
  // std::bad_alloc when the device is out of memory (an OutOfMemoryError
  // saying what the device holds, where the allocator knows; Storage::Allocate
  // adds the request's category and the ledger).
  virtual void* Allocate(int64_t bytes) = 0;
  virtual void Deallocate(void* ptr, int64_t bytes) = 0;
};

// The allocator of a device. CUDA devices need a --config=cuda build; without
// it this throws an OpError that says so.
Allocator& AllocatorFor(Device device);

// A block of device memory, charged to a ledger under a category for its lifetime.
class Storage {
 public:
  // Allocates `nbytes` on `device`, charged to the calling thread's ledger and category.
  static std::shared_ptr<Storage> Allocate(int64_t nbytes, Device device);
  // The same from `allocator` (memory of `device`, e.g. page-locked host
  // memory for a CPU tensor), which must outlive the storage.
  static std::shared_ptr<Storage> Allocate(int64_t nbytes, Device device, Allocator& allocator);
  // Wraps memory owned elsewhere (not charged to any ledger); `release` runs at destruction.
  static std::shared_ptr<Storage> Wrap(void* data, int64_t nbytes, Device device,
                                       std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  MemoryCategory category() const { return category_; }
  // The ledger charged, or nullptr for wrapped memory.
  MemoryLedger* ledger() const { return ledger_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
  Device device_;
  MemoryCategory category_ = MemoryCategory::kTemporaries;
  MemoryLedger* ledger_ = nullptr;
  Allocator* allocator_ = nullptr;  // what Allocate took the memory from
  std::function<void()> release_;
};

}  // namespace tensor

#endif  // TENSOR_ALLOCATOR_H_
