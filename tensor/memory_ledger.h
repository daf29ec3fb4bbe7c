// The memory ledger: exact current and peak bytes per device and per category.
//
// Every tensor allocation is charged to one ledger under one category and
// credited back when the storage is freed. The ledger is how the project shows
// where memory goes (DDP vs ZeRO vs FSDP): parameters, gradients, optimizer
// state, activations, communication buffers, temporaries.
//
// Which ledger and category an allocation goes to is chosen by the allocating
// thread: ScopedLedger (e.g. one ledger per rank when ranks are threads of one
// process) and ScopedMemoryCategory. Without them: the process ledger and
// kTemporaries.
#ifndef TENSOR_MEMORY_LEDGER_H_
#define TENSOR_MEMORY_LEDGER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "tensor/device.h"

namespace tensor {

enum class MemoryCategory : uint8_t {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kCommunication,
  kTemporaries,
};
inline constexpr int kNumMemoryCategories = 6;
absl::string_view MemoryCategoryName(MemoryCategory category);

// "512 B", "12.00 KiB", "1.50 GiB": binary units, two decimals from KiB on.
std::string FormatBytes(int64_t bytes);

struct MemoryStats {
  int64_t current = 0;
  int64_t peak = 0;
};

class MemoryLedger {
 public:
  // Devices tracked: the CPU and cuda:0 .. cuda:kMaxCudaDevices-1.
  static constexpr int kMaxCudaDevices = 16;

  MemoryLedger() = default;
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  void RecordAlloc(Device device, MemoryCategory category, int64_t bytes);
  void RecordFree(Device device, MemoryCategory category, int64_t bytes);

  // Bytes of one category on a device (current and the peak of that category alone).
  MemoryStats Stats(Device device, MemoryCategory category) const;
  // All categories of a device together; the peak is the peak of the sum.
  MemoryStats Total(Device device) const;
  // Peaks restart from the current values.
  void ResetPeaks();
  void ResetPeaks(Device device);

  // A table of current and peak bytes (MiB) by category, for devices with any use.
  std::string Summary() const;
  // One line of JSON: {"cpu":{"parameters":{"current":..,"peak":..},..,"total":{..}},..}
  std::string ToJson() const;

  // The ledger every thread charges unless a ScopedLedger says otherwise.
  static MemoryLedger& Process();
  // The ledger of the calling thread.
  static MemoryLedger& Current();

 private:
  struct Counter {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
    void Add(int64_t bytes);
    void ResetPeak() { peak.store(current.load()); }
    MemoryStats Read() const { return {current.load(), peak.load()}; }
  };
  struct DeviceCounters {
    std::array<Counter, kNumMemoryCategories> by_category;
    Counter total;
  };
  static constexpr int kNumSlots = 1 + kMaxCudaDevices;
  static int Slot(Device device);

  std::array<DeviceCounters, kNumSlots> slots_;
};

// Makes the calling thread charge `ledger` until destroyed (restores the previous one).
class ScopedLedger {
 public:
  explicit ScopedLedger(MemoryLedger* ledger);
  ~ScopedLedger();
  ScopedLedger(const ScopedLedger&) = delete;
  ScopedLedger& operator=(const ScopedLedger&) = delete;

 private:
  MemoryLedger* previous_;
};

// Makes the calling thread's allocations count as `category` until destroyed.
class ScopedMemoryCategory {
 public:
  explicit ScopedMemoryCategory(MemoryCategory category);
  ~ScopedMemoryCategory();
  ScopedMemoryCategory(const ScopedMemoryCategory&) = delete;
  ScopedMemoryCategory& operator=(const ScopedMemoryCategory&) = delete;

 private:
  MemoryCategory previous_;
};

// The calling thread's current category.
MemoryCategory CurrentMemoryCategory();

}  // namespace tensor

#endif  // TENSOR_MEMORY_LEDGER_H_
