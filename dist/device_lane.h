// The GPU side of one handle of the threads engine (dist/thread_group.h): a
// communication stream for the handle's collectives on device buffers, and
// the events that order them with the ranks' compute streams.
//
// The protocol of one collective whose ranks' tensors are all on one GPU:
//   1. the issuing thread marks where its stream stands (MarkIssued: an event
//      recorded on its per-thread stream, after the kernels that produce the
//      call's inputs);
//   2. once every rank has arrived, each rank's communication stream waits for
//      every rank's mark (it reads and writes the peers' buffers), queues its
//      share of the work and marks its end (MarkShareDone);
//   3. each rank's stream waits for every peer's end (its buffers are done
//      with) and the worker waits on the host until its stream has finished
//      (Drain), so the Work completes with the results in place: the caller
//      may read them from any stream, or free them.
// The marks of step 1 come from a pool: an event goes back (Recycle) once
// every peer's stream has queued its wait for it.
#ifndef DIST_DEVICE_LANE_H_
#define DIST_DEVICE_LANE_H_

#include <mutex>
#include <vector>

#include "absl/types/span.h"
#include "tensor/cuda_backend.h"

namespace dist {
namespace internal {

class DeviceLane {
 public:
  using EventHandle = tensor::cuda::EventHandle;
  using StreamHandle = tensor::cuda::StreamHandle;

  DeviceLane() = default;
  // Destroys the stream and the events (call once no work uses them).
  ~DeviceLane();
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

  // Issuing thread: an event recorded on `stream` of cuda:`device` (nullptr:
  // the calling thread's stream). The lane serves the device of its first
  // call; for another device the result is nullptr (that call goes through
  // host memory). Throws tensor::OpError when CUDA fails.
  EventHandle MarkIssued(int device, StreamHandle stream = nullptr);
  // An event of MarkIssued that no stream will be asked to wait for again.
  void Recycle(EventHandle event);

  // ---- Worker thread ----
  // The device of the lane (-1 before the first MarkIssued).
  int device() const;
  // The communication stream (created on first use).
  StreamHandle stream();
  // Later work on the stream waits for each event (null ones are skipped).
  void WaitFor(absl::Span<const EventHandle> events);
  // An event recorded on the stream now: the end of the work queued so far.
  EventHandle MarkShareDone();
  // Waits on the host until the work queued on the stream so far has finished.
  void Drain();

 private:
  mutable std::mutex mu_;
  int device_ = -1;                  // guarded by mu_
  std::vector<EventHandle> free_;    // guarded by mu_
  std::vector<EventHandle> all_;     // guarded by mu_: every MarkIssued event, to destroy
  StreamHandle stream_ = nullptr;    // worker thread only
  EventHandle done_ = nullptr;       // worker thread only
  EventHandle drained_ = nullptr;    // worker thread only
};

}  // namespace internal
}  // namespace dist

#endif  // DIST_DEVICE_LANE_H_
