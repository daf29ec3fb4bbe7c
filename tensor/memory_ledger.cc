// Memory ledger: lock-free counters, thread-local ledger and category.
#include "tensor/memory_ledger.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace tensor {
namespace {

thread_local MemoryLedger* tls_ledger = nullptr;
thread_local MemoryCategory tls_category = MemoryCategory::kTemporaries;

Device SlotDevice(int slot) {
  return slot == 0 ? Device::Cpu() : Device::Cuda(slot - 1);
}

std::string StatsJson(MemoryStats s) {
  return absl::StrCat("{\"current\":", s.current, ",\"peak\":", s.peak, "}");
}

}  // namespace

absl::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kCommunication: return "communication";
    case MemoryCategory::kTemporaries: return "temporaries";
  }
  return "?";
}

void MemoryLedger::Counter::Add(int64_t bytes) {
  const int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

int MemoryLedger::Slot(Device device) {
  if (device.is_cpu()) return 0;
  CHECK(device.index >= 0 && device.index < kMaxCudaDevices)
      << "memory ledger tracks cuda:0..cuda:" << kMaxCudaDevices - 1 << ", got "
      << device.ToString();
  return 1 + device.index;
}

void MemoryLedger::RecordAlloc(Device device, MemoryCategory category, int64_t bytes) {
  DeviceCounters& d = slots_[Slot(device)];
  d.by_category[static_cast<int>(category)].Add(bytes);
  d.total.Add(bytes);
}

void MemoryLedger::RecordFree(Device device, MemoryCategory category, int64_t bytes) {
  DeviceCounters& d = slots_[Slot(device)];
  d.by_category[static_cast<int>(category)].current.fetch_sub(bytes, std::memory_order_relaxed);
  d.total.current.fetch_sub(bytes, std::memory_order_relaxed);
}

MemoryStats MemoryLedger::Stats(Device device, MemoryCategory category) const {
  return slots_[Slot(device)].by_category[static_cast<int>(category)].Read();
}

MemoryStats MemoryLedger::Total(Device device) const { return slots_[Slot(device)].total.Read(); }

void MemoryLedger::ResetPeaks(Device device) {
  DeviceCounters& d = slots_[Slot(device)];
  for (Counter& c : d.by_category) c.ResetPeak();
  d.total.ResetPeak();
}

void MemoryLedger::ResetPeaks() {
  for (int slot = 0; slot < kNumSlots; ++slot) ResetPeaks(SlotDevice(slot));
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024 && bytes > -1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while ((value >= 1024.0 || value <= -1024.0) && unit + 1 < 6) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

std::string MemoryLedger::Summary() const {
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string out = absl::StrFormat("%-8s %-16s %12s %12s\n", "device", "category",
                                    "current MiB", "peak MiB");
  for (int slot = 0; slot < kNumSlots; ++slot) {
    const DeviceCounters& d = slots_[slot];
    const MemoryStats total = d.total.Read();
    if (total.peak == 0 && slot != 0) continue;
    const std::string dev = SlotDevice(slot).ToString();
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      const MemoryStats s = d.by_category[c].Read();
      absl::StrAppendFormat(&out, "%-8s %-16s %12.3f %12.3f\n", dev,
                            MemoryCategoryName(static_cast<MemoryCategory>(c)),
                            s.current / kMiB, s.peak / kMiB);
    }
    absl::StrAppendFormat(&out, "%-8s %-16s %12.3f %12.3f\n", dev, "total",
                          total.current / kMiB, total.peak / kMiB);
  }
  return out;
}

std::string MemoryLedger::ToJson() const {
  std::string out = "{";
  bool first_device = true;
  for (int slot = 0; slot < kNumSlots; ++slot) {
    const DeviceCounters& d = slots_[slot];
    const MemoryStats total = d.total.Read();
    if (total.peak == 0 && slot != 0) continue;
    absl::StrAppend(&out, first_device ? "" : ",", "\"", SlotDevice(slot).ToString(), "\":{");
    first_device = false;
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      absl::StrAppend(&out, "\"", MemoryCategoryName(static_cast<MemoryCategory>(c)),
                      "\":", StatsJson(d.by_category[c].Read()), ",");
    }
    absl::StrAppend(&out, "\"total\":", StatsJson(total), "}");
  }
  return out + "}";
}

MemoryLedger& MemoryLedger::Process() {
  static MemoryLedger* const ledger = new MemoryLedger();  // never destroyed: storages may outlive main
  return *ledger;
}

MemoryLedger& MemoryLedger::Current() { return tls_ledger ? *tls_ledger : Process(); }

ScopedLedger::ScopedLedger(MemoryLedger* ledger) : previous_(tls_ledger) { tls_ledger = ledger; }
ScopedLedger::~ScopedLedger() { tls_ledger = previous_; }

ScopedMemoryCategory::ScopedMemoryCategory(MemoryCategory category) : previous_(tls_category) {
  tls_category = category;
}
ScopedMemoryCategory::~ScopedMemoryCategory() { tls_category = previous_; }

MemoryCategory CurrentMemoryCategory() { return tls_category; }

}  // namespace tensor
