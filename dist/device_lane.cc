// The threads engine's communication stream and events (dist/device_lane.h).
#include "dist/device_lane.h"

#include <exception>

namespace dist {
namespace internal {

namespace cuda = tensor::cuda;

DeviceLane::~DeviceLane() {
  const int dev = device();
  if (dev < 0) return;
  if (stream_ != nullptr) {
    try {
      Drain();
    } catch (const std::exception&) {
      // A failed device: nothing left to wait for.
    }
  }
  for (EventHandle e : all_) cuda::DestroyEvent(e, dev);
  cuda::DestroyEvent(done_, dev);
  cuda::DestroyEvent(drained_, dev);
  cuda::DestroyStream(stream_, dev);
}

DeviceLane::EventHandle DeviceLane::MarkIssued(int device, StreamHandle stream) {
  EventHandle event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_ < 0) device_ = device;
    if (device_ != device) return nullptr;
    if (!free_.empty()) {
      event = free_.back();
      free_.pop_back();
    }
  }
  if (event == nullptr) {
    event = cuda::CreateEvent(device);
    std::lock_guard<std::mutex> lock(mu_);
    all_.push_back(event);
  }
  try {
    cuda::RecordEvent(event, stream, device);
  } catch (...) {
    Recycle(event);
    throw;
  }
  return event;
}

void DeviceLane::Recycle(EventHandle event) {
  if (event == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(event);
}

int DeviceLane::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

DeviceLane::StreamHandle DeviceLane::stream() {
  if (stream_ == nullptr) stream_ = cuda::CreateStream(device());
  return stream_;
}

void DeviceLane::WaitFor(absl::Span<const EventHandle> events) {
  for (EventHandle e : events) {
    if (e != nullptr) cuda::StreamWaitEvent(stream(), e, device());
  }
}

DeviceLane::EventHandle DeviceLane::MarkShareDone() {
  if (done_ == nullptr) done_ = cuda::CreateEvent(device());
  cuda::RecordEvent(done_, stream(), device());
  return done_;
}

void DeviceLane::Drain() {
  if (drained_ == nullptr) drained_ = cuda::CreateEvent(device());
  cuda::RecordEvent(drained_, stream(), device());
  cuda::SynchronizeEvent(drained_, device());
}

}  // namespace internal
}  // namespace dist
