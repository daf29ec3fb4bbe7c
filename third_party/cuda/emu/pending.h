// Work that an emulated stream holds unfinished after it was issued:
// - what the emulated NCCL (nccl.cc) queues for a collective until every rank
//   has made it;
// - deferred work (runtime.cc): kernels, asynchronous device copies and
//   memsets issued on a stream the program created (a communication stream)
//   do not run when issued, but when something waits for them: a
//   synchronization of the stream, of an event recorded after them, or of the
//   device, work queued on a stream made to wait for such an event, a query
//   of such an event or stream (the GPU makes progress), or the destruction
//   of the stream. So work that reads what a created stream writes without
//   waiting for it reads the old bytes, as it may on a GPU, instead of the
//   emulation's in-order result, and a missing cudaStreamWaitEvent fails the
//   tests that a GPU would fail only sometimes. The threads' default streams
//   run what they are given at once, unless CUDA_EMU_DEFER=all (DeferMode).
// An event recorded on a stream after pending work is not ready
// (cudaEventQuery says cudaErrorNotReady, or runs deferred work) until that
// work finishes; a stream made to wait for such an event
// (cudaStreamWaitEvent) inherits the work; synchronizing a stream or the
// device waits for it.
//
// A kernel, asynchronous copy or memset or cuBLASLt matmul issued on a stream
// with pending work first waits on the host until that work has finished
// (WaitForStream), so it runs after it as on a GPU (where the host would not
// wait).
#ifndef THIRD_PARTY_CUDA_EMU_PENDING_H_
#define THIRD_PARTY_CUDA_EMU_PENDING_H_

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace cuda_emu {

class PendingWork {
 public:
  // Work that somebody else finishes (Finish).
  PendingWork() = default;
  // Deferred work: `run` runs on the first thread that waits for it, after
  // the work in `after` (what was unfinished on its stream when it was
  // issued).
  PendingWork(std::function<void()> run, std::vector<std::shared_ptr<PendingWork>> after)
      : deferred_(true), run_(std::move(run)), after_(std::move(after)) {}
  PendingWork(const PendingWork&) = delete;
  PendingWork& operator=(const PendingWork&) = delete;

  // Marks the work finished and wakes the threads waiting for it.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  bool deferred() const { return deferred_; }
  // Until the work has finished: deferred work not yet started runs here
  // (what it waits for first); otherwise waits.
  void Wait() {
    std::function<void()> run;
    std::vector<std::shared_ptr<PendingWork>> after;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (deferred_ && !started_) {
        started_ = true;
        run = std::move(run_);
        after = std::move(after_);
      }
    }
    if (run) {
      for (const auto& w : after) w->Wait();
      run();
      Finish();
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  const bool deferred_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool started_ = false;                             // guarded by mu_
  std::function<void()> run_;                        // guarded by mu_
  std::vector<std::shared_ptr<PendingWork>> after_;  // guarded by mu_
};

// `work` is queued on `stream` (cudaStreamPerThread: the calling thread's).
void QueuePending(cudaStream_t stream, std::shared_ptr<PendingWork> work);

// Waits until the work pending on `stream` has finished (running deferred
// work).
void WaitForStream(cudaStream_t stream);

// Which streams defer their work: CUDA_EMU_DEFER=created (the default: the
// streams the program created), all (the threads' default streams too; the
// legacy default stream's synchronous copies and memsets then first run what
// every thread deferred on the current device, as a device's legacy stream
// waits for its blocking streams), none (everything runs when issued).
enum class DeferMode { kNone, kCreated, kAll };
DeferMode DeferModeNow();

// Whether kernels run: CUDA_EMU_KERNELS=run (the default) or skip. Skipped,
// a launch (a kernel, a cuBLASLt matmul, the CUB sort) is checked, counted
// and queued in its stream's order but computes nothing; copies and memsets
// still run up to kSkipBytesAbove bytes (flags, token ids, the loss); larger
// ones, device work too (zeroing gradients, gathers), are queued and skipped.
// What is left of a training step is the host's work: the framework's own
// time per step, the floor below which no GPU can take the step without CUDA
// graphs. Results are garbage.
bool KernelsRun();
constexpr size_t kSkipBytesAbove = 4096;
// Whether a copy or memset of n bytes involving device memory moves them.
inline bool MovesBytes(size_t n) { return n <= kSkipBytesAbove || KernelsRun(); }

// Whether work issued on `stream` is deferred (never on the legacy stream).
bool DefersWork(cudaStream_t stream);

// Runs the deferred work queued on `stream` that has not started (and what it
// waits for); other pending work is left as it is.
void RunDeferredOn(cudaStream_t stream);

// Host work standing for device work on `stream` (the emulated CUB sort):
// deferred where the stream defers, else run now after the stream's work.
void RunOnStream(cudaStream_t stream, std::function<void()> run);

// Queues `run` on `stream` as deferred work (after what is unfinished there),
// to run with the issuing thread's current device.
void Defer(cudaStream_t stream, std::function<void()> run);

// The number of emulated devices: CUDA_EMU_DEVICES (1 to 8) when set, else 1.
int DeviceCount();

}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_PENDING_H_
