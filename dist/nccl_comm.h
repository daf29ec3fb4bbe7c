// The `nccl` engine's CUDA and NCCL pieces below the group (private to
// //dist:nccl_group): error statuses of CUDA and NCCL calls, the family's
// NCCL call lock, dtype and op mapping, bounded aborts, and Comm, a
// communicator with its stream and barrier buffer and how it is finalized,
// destroyed or aborted. nccl_group.cc builds the process group on them.
#ifndef DIST_NCCL_COMM_H_
#define DIST_NCCL_COMM_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dist/nccl_launch_order.h"
#include "dist/nccl_worker.h"
#include "dist/process_group.h"
#include "tensor/dtype.h"

namespace dist {
namespace nccl {

// A failed CUDA call as InternalError "<what> failed: <CUDA's words>", the
// error cleared from the thread's last error; OK for cudaSuccess.
absl::Status CudaCheck(cudaError_t err, absl::string_view what);

// A failed NCCL call: its words and NCCL's last error for `comm`; a peer that
// exited is Aborted, a system error Unavailable, misuse InvalidArgument.
absl::Status NcclError(ncclResult_t result, absl::string_view what, ncclComm_t comm);

// Prefixes `status` with "[op] rank r of n: " (nccl::Who, with `label`).
absl::Status Prefixed(const absl::Status& status, absl::string_view op, int rank, int size,
                      absl::string_view label = "");

using CallsLock = std::unique_lock<std::timed_mutex>;

// The family's NCCL call lock (nccl::LaunchOrder::NcclCalls) for a call that
// is not a poll, within `bound`; past it an error: another group's call has
// held it that long (it hangs: its group's watchdog aborts it, unlocked).
absl::StatusOr<CallsLock> LockCalls(std::timed_mutex& calls, absl::Duration bound,
                                    absl::string_view what);

// Whether `comm` has finished its background work (init, split, enqueue,
// finalize); an error when NCCL reports one (e.g. a peer died). `calls`: its
// family's lock, only tried: held by another call, `comm` reads as not ready
// yet (and `*busy`, when given, is set: nothing was asked of NCCL), and the
// caller's deadline goes on running.
absl::StatusOr<bool> CommReady(ncclComm_t comm, std::timed_mutex& calls, bool* busy = nullptr);

// A query's "not ready" (cudaEventQuery, cudaStreamQuery) may be left as the
// thread's last error (PyTorch clears it after its event queries), which a
// later check of cudaGetLastError would report: cleared when it is the error
// pending.
void ClearNotReady();

// Makes `device` current on this thread for its lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

ncclDataType_t NcclType(tensor::Dtype dtype);
ncclRedOp_t NcclOp(ReduceOp op);
// nullptr: the issuing thread's per-thread default stream, where the tensor
// kernels run (tensor/cuda/common.cuh).
cudaStream_t AsStream(void* stream);

// How long an abort outside the worker (CallWorker::RunAbort bounds its own)
// may take: NCCL's abort may hang (NVIDIA/nccl#863; before NCCL 2.19 an
// intra-node collective, which a local peer that is gone never joins).
constexpr absl::Duration kAbortWait = absl::Seconds(30);

// Aborts `comm` on cuda:`device` on a thread of its own (nccl::RunWithin):
// false, saying so on stderr with `what`, when the abort did not return
// within kAbortWait; it goes on running then, and what the communicator uses
// must stay allocated (the process should exit).
bool AbortWithin(ncclComm_t comm, int device, const char* what);

// A communicator with its stream and barrier buffer. The group destroys it
// after its worker thread has stopped, and after the worker's abort returned
// (an abandoned one is never destroyed: CommDeleter); its own abort, after a
// finalize that did not complete, is bounded as well (~Comm).
struct Comm {
  int device = 0;
  ncclComm_t comm = nullptr;  // nullptr once aborted
  // The groups it orders its launches with, whose NCCL calls it makes one
  // thread at a time (NcclCalls).
  std::shared_ptr<nccl::LaunchOrder> family;
  std::timed_mutex& calls() const { return family->NcclCalls(); }
  cudaStream_t stream = nullptr;
  float* barrier = nullptr;  // (1): the operand of barrier()
  absl::Duration finalize_timeout;

  // Aborts the communicator: kernels waiting for peers exit. Then waits (up
  // to `drain`) for this communicator's stream to drain, since the worker
  // releases the calls' buffers next: an aborted kernel still writing one
  // would otherwise corrupt the tensor the allocator hands it to. `drain` is
  // the caller's value: the group may change finalize_timeout meanwhile.
  void Abort(absl::Duration drain);

  // Set when the abort did not return in time (CallWorkerOptions::abandon):
  // the abort's thread may still use this communicator, and the kernels the
  // calls' buffers, so CommDeleter leaves both allocated.
  std::atomic<bool> abandoned{false};
  std::vector<std::shared_ptr<nccl::PendingCall>> kept_calls;

  ~Comm();

 private:
  // ncclCommFinalize, its completion and ncclCommDestroy, each waiting up to
  // finalize_timeout (for the family's lock, or for the finalize): "" once
  // ncclCommDestroy was called (its failure is only said on stderr: the
  // communicator is gone either way), else what failed, the communicator
  // left for an abort.
  std::string FinalizeAndDestroy();
};

// Deletes a Comm unless it was abandoned (the process should exit then).
struct CommDeleter {
  void operator()(Comm* comm) const {
    if (!comm->abandoned.load()) delete comm;
  }
};
using CommPtr = std::unique_ptr<Comm, CommDeleter>;

// Wraps an initialized communicator of `family`: a non-blocking stream and
// the barrier buffer on `device` (current on this thread).
absl::StatusOr<CommPtr> MakeComm(ncclComm_t nccl_comm, int device,
                                 absl::Duration finalize_timeout,
                                 std::shared_ptr<nccl::LaunchOrder> family);

}  // namespace nccl
}  // namespace dist

#endif  // DIST_NCCL_COMM_H_
