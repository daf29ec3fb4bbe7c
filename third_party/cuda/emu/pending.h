// Work that an emulated stream holds unfinished after it was issued: what the
// emulated NCCL (nccl.cc) queues for a collective until every rank has made
// it. Everything else the emulation runs is done when issued (runtime.cc), so
// this is how a stream can be "busy" at all: an event recorded on a stream
// after pending work is not ready (cudaEventQuery says cudaErrorNotReady,
// cudaEventSynchronize waits) until that work finishes; a stream made to wait
// for such an event (cudaStreamWaitEvent) inherits the work; synchronizing
// a stream or the device waits for it.
//
// A kernel, asynchronous copy or memset or cuBLASLt matmul issued on a stream
// with pending work first waits on the host until that work has finished
// (WaitForStream), so it runs after it as on a GPU (where the host would not
// wait).
#ifndef THIRD_PARTY_CUDA_EMU_PENDING_H_
#define THIRD_PARTY_CUDA_EMU_PENDING_H_

#include <cuda_runtime.h>

#include <condition_variable>
#include <memory>
#include <mutex>

namespace cuda_emu {

class PendingWork {
 public:
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
  void Wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
};

// `work` is queued on `stream` (cudaStreamPerThread: the calling thread's).
void QueuePending(cudaStream_t stream, std::shared_ptr<PendingWork> work);

// Waits until the work pending on `stream` has finished.
void WaitForStream(cudaStream_t stream);

// The number of emulated devices: CUDA_EMU_DEVICES (1 to 8) when set, else 1.
int DeviceCount();

}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_PENDING_H_
