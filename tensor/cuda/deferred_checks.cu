// Deferred checks of the CUDA backend seam (tensor/cuda_backend.h): a check's
// words, written by a kernel, copied to page-locked memory on the thread's
// stream behind an event, and read by the host once the event has passed
// (after a wait the host made anyway), so a check costs the GPU a launch or
// two and the host no wait of its own.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/backend_errors.cuh"
#include "tensor/cuda/thread_device_slot.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"

namespace tensor {
namespace cuda {
namespace {

using backend::Check;

// At this many unread checks (a program that queues checks and never waits for
// the GPU), the next one waits for the oldest and reads every check that has
// arrived by then (a host wait every few dozen checks): the queue stays
// bounded.
constexpr size_t kMaxPending = 64;
constexpr int64_t kBlockBytes = kMaxCheckWords * sizeof(int64_t);

// This thread's unread checks on one device, in queuing order (the order their
// copies run in, on the one stream). Events and page-locked blocks are reused.
class DeferredChecks {
 public:
  DeferredChecks(int device, Allocator& pinned) : device_(device), pinned_(pinned) {}
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;
  // At the thread's exit: what is left is read (waiting for it) and a failure
  // printed, since nothing can throw it any more. Errors of the runtime are
  // ignored (at process exit it may be gone).
  ~DeferredChecks() {
    if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
    for (Pending& p : pending_) {
      if (cudaEventSynchronize(p.event) == cudaSuccess) {
        try {
          const std::string message = p.describe(p.words);
          if (!message.empty()) {
            std::fprintf(stderr, "[%s] %s (a check on cuda:%d that no later wait reported)\n",
                         p.op, message.c_str(), device_);
          }
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[%s] describing a failed check: %s\n", p.op, e.what());
        }
      } else {
        cudaGetLastError();
      }
      Recycle(p);
    }
    for (int64_t* block : free_blocks_) pinned_.Deallocate(block, kBlockBytes);
    for (cudaEvent_t e : free_events_) {
      if (cudaEventDestroy(e) != cudaSuccess) cudaGetLastError();
    }
  }

  void Add(const char* op, const void* words, int n_words,
           std::function<std::string(const int64_t*)> describe) {
    if (pending_.size() >= kMaxPending) {
      Check(cudaEventSynchronize(pending_.front().event), "cudaEventSynchronize (deferred checks)");
      Raise(/*wait=*/false);
    }
    if (free_events_.empty()) {
      cudaEvent_t e = nullptr;
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      free_events_.push_back(e);
    }
    if (free_blocks_.empty()) {
      free_blocks_.push_back(static_cast<int64_t*>(pinned_.Allocate(kBlockBytes)));
    }
    Pending p{free_events_.back(), free_blocks_.back(), op, std::move(describe)};
    free_events_.pop_back();
    free_blocks_.pop_back();
    cudaError_t err = cudaMemcpyAsync(p.words, words, n_words * sizeof(int64_t),
                                      cudaMemcpyDeviceToHost, cudaStreamPerThread);
    if (err == cudaSuccess) err = cudaEventRecord(p.event, cudaStreamPerThread);
    if (err != cudaSuccess) {
      // The copy may be queued: the stream finishes before the block is reused.
      if (cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) cudaGetLastError();
      Recycle(p);
      Check(err, "queuing a deferred check's copy");
    }
    pending_.push_back(std::move(p));
  }

  void Raise(bool wait) {
    while (!pending_.empty()) {
      Pending& front = pending_.front();
      if (wait) {
        Check(cudaEventSynchronize(front.event), "cudaEventSynchronize (deferred checks)");
      } else {
        const cudaError_t done = cudaEventQuery(front.event);
        if (done == cudaErrorNotReady) {
          backend::ClearNotReady();
          return;
        }
        Check(done, "cudaEventQuery (deferred checks)");
      }
      Pending p = std::move(front);
      pending_.pop_front();
      int64_t words[kMaxCheckWords];
      std::memcpy(words, p.words, sizeof(words));
      Recycle(p);  // first: describe may throw
      const std::string message = p.describe(words);
      if (!message.empty()) ThrowOpError(p.op, message);
    }
  }

 private:
  struct Pending {
    cudaEvent_t event;
    int64_t* words;  // kMaxCheckWords, page-locked
    const char* op;
    std::function<std::string(const int64_t*)> describe;
  };

  void Recycle(const Pending& p) {
    free_events_.push_back(p.event);
    free_blocks_.push_back(p.words);
  }

  const int device_;
  Allocator& pinned_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<int64_t*> free_blocks_;
};

// This thread's checks on `device`; with !make, null where it never queued one.
DeferredChecks* ThisThreadsChecks(int device, bool make) {
  if (!make) {
    return ThreadDeviceSlot<DeferredChecks>(device,
                                            [] { return std::unique_ptr<DeferredChecks>(); });
  }
  Allocator* pinned = PinnedHostAllocator();
  if (pinned == nullptr) ThrowOpError("cuda", "no CUDA device for a deferred check");
  return ThreadDeviceSlot<DeferredChecks>(
      device, [device, pinned] { return std::make_unique<DeferredChecks>(device, *pinned); });
}

}  // namespace

void DeferCheck(const char* op, int device, const void* words, int n_words,
                std::function<std::string(const int64_t* words)> describe) {
  if (n_words < 1 || n_words > kMaxCheckWords) {
    ThrowOpError(op, "a deferred check has 1 to ", kMaxCheckWords, " words; got ", n_words);
  }
  Check(cudaSetDevice(device), "cudaSetDevice");
  ThisThreadsChecks(device, /*make=*/true)->Add(op, words, n_words, std::move(describe));
}

void RaiseDeferredChecks(int device, bool wait) {
  DeferredChecks* checks = ThisThreadsChecks(device, /*make=*/false);
  if (checks == nullptr) return;
  Check(cudaSetDevice(device), "cudaSetDevice");
  checks->Raise(wait);
}

}  // namespace cuda
}  // namespace tensor
