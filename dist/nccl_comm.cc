// The `nccl` engine's CUDA and NCCL pieces below the group: see nccl_comm.h.
#include "dist/nccl_comm.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dist/nccl_rendezvous.h"

namespace dist {
namespace nccl {

using tensor::Dtype;

absl::Status CudaCheck(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  // Handled here (a Status): cleared from the thread's last error, so that
  // the thread's next launch check does not report it again.
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, " failed: ", cudaGetErrorString(err)));
}

absl::Status NcclError(ncclResult_t result, absl::string_view what, ncclComm_t comm) {
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, " (", last, ")");
  switch (result) {
    case ncclRemoteError:
      return absl::AbortedError(absl::StrCat(message, "; a peer exited or its connection broke"));
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Prefixed(const absl::Status& status, absl::string_view op, int rank, int size,
                      absl::string_view label) {
  return absl::Status(status.code(), absl::StrCat("[", op, "] ", nccl::Who(rank, size, label),
                                                  ": ", status.message()));
}

absl::StatusOr<CallsLock> LockCalls(std::timed_mutex& calls, absl::Duration bound,
                                    absl::string_view what) {
  CallsLock lock(calls, std::defer_lock);
  // An infinite (or huge) bound waits as long as it takes: try_lock_for's
  // now() + bound would overflow and give up at once.
  if (bound >= absl::Hours(24 * 365 * 100)) {
    lock.lock();
    return lock;
  }
  if (lock.try_lock_for(absl::ToChronoNanoseconds(bound))) return lock;
  return absl::DeadlineExceededError(
      absl::StrCat(what, ": another NCCL call of the group's family (the groups split from "
                   "one, or sharing its launch order) did not return within ",
                   absl::FormatDuration(bound),
                   " (a call that hangs: the aborts that end one do not take this lock)"));
}

absl::StatusOr<bool> CommReady(ncclComm_t comm, std::timed_mutex& calls, bool* busy) {
  CallsLock lock(calls, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (busy != nullptr) *busy = true;
    return false;
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
  if (result != ncclSuccess) return NcclError(result, "ncclCommGetAsyncError", comm);
  if (state == ncclInProgress) return false;
  if (state != ncclSuccess) return NcclError(state, "NCCL reported an error", comm);
  return true;
}

void ClearNotReady() {
  if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
}

ncclDataType_t NcclType(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32:
      return ncclFloat32;
    case Dtype::kF16:
      return ncclFloat16;
    case Dtype::kBF16:
      return ncclBfloat16;
    case Dtype::kI32:
      return ncclInt32;
    case Dtype::kI64:
      return ncclInt64;
    case Dtype::kU8:
      return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

cudaStream_t AsStream(void* stream) {
  return stream == nullptr ? cudaStreamPerThread : static_cast<cudaStream_t>(stream);
}

bool AbortWithin(ncclComm_t comm, int device, const char* what) {
  auto abort = [comm, device] {
    cudaSetDevice(device);
    ncclCommAbort(comm);
  };
  if (nccl::RunWithin(abort, kAbortWait)) return true;
  std::fprintf(stderr,
               "nccl: %s: the abort of a communicator on cuda:%d did not return within %s; left "
               "running (this process should exit)\n",
               what, device, absl::FormatDuration(kAbortWait).c_str());
  return false;
}

void Comm::Abort(absl::Duration drain) {
  if (comm == nullptr) return;
  DeviceGuard guard(device);
  ncclCommAbort(comm);
  comm = nullptr;
  const absl::StatusOr<bool> idle = nccl::PollUntil(
      [this]() -> absl::StatusOr<bool> {
        const cudaError_t err = cudaStreamQuery(stream);
        if (err == cudaErrorNotReady) {
          ClearNotReady();
          return false;
        }
        cudaGetLastError();  // a sticky error from the aborted kernels is not ours to keep
        return true;
      },
      absl::Now() + drain, nccl::Clock(), absl::Milliseconds(1));
  if (!idle.ok() || !*idle) {
    std::fprintf(stderr,
                 "nccl: the communication stream of cuda:%d is still busy %s after the "
                 "abort\n",
                 device, absl::FormatDuration(drain).c_str());
  }
}

Comm::~Comm() {
  DeviceGuard guard(device);
  if (comm != nullptr) {
    // Finalize (flushes the calls, may wait for the peers) and destroy; abort
    // when that does not finish in time, saying why.
    const std::string why = FinalizeAndDestroy();
    if (!why.empty()) {
      std::fprintf(stderr,
                   "nccl: cuda:%d: aborting the communicator instead of destroying it: %s\n",
                   device, why.c_str());
      if (!AbortWithin(comm, device, "destroying a group")) {
        return;  // the abort may still use the stream and buffer: kept
      }
    }
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (barrier != nullptr) cudaFree(barrier);
}

std::string Comm::FinalizeAndDestroy() {
  {
    absl::StatusOr<CallsLock> lock = LockCalls(calls(), finalize_timeout, "finalize");
    if (!lock.ok()) return std::string(lock.status().message());
    const ncclResult_t result = ncclCommFinalize(comm);
    if (result != ncclSuccess && result != ncclInProgress) {
      return std::string(NcclError(result, "ncclCommFinalize", comm).message());
    }
  }
  bool busy = false;  // the last poll found the lock taken
  absl::StatusOr<bool> done = nccl::PollUntil(
      [&] {
        busy = false;
        return CommReady(comm, calls(), &busy);
      },
      absl::Now() + finalize_timeout, nccl::Clock(), absl::Milliseconds(1));
  if (!done.ok()) return absl::StrCat("finalize: ", done.status().message());
  if (!*done) {
    return busy ? absl::StrCat("finalize: NCCL's state could not be read within ",
                               absl::FormatDuration(finalize_timeout),
                               ": another NCCL call of the group's family held the lock")
                : absl::StrCat("the finalize did not complete within ",
                               absl::FormatDuration(finalize_timeout));
  }
  absl::StatusOr<CallsLock> lock = LockCalls(calls(), finalize_timeout, "destroy");
  if (!lock.ok()) return std::string(lock.status().message());
  const ncclResult_t destroyed = ncclCommDestroy(comm);
  if (destroyed != ncclSuccess) {
    std::fprintf(stderr, "nccl: cuda:%d: ncclCommDestroy: %s\n", device,
                 ncclGetErrorString(destroyed));
  }
  return "";
}

absl::StatusOr<CommPtr> MakeComm(ncclComm_t nccl_comm, int device,
                                 absl::Duration finalize_timeout,
                                 std::shared_ptr<nccl::LaunchOrder> family) {
  CommPtr comm(new Comm());
  comm->device = device;
  comm->comm = nccl_comm;
  comm->family = std::move(family);
  comm->finalize_timeout = finalize_timeout;
  absl::Status s = CudaCheck(cudaStreamCreateWithFlags(&comm->stream, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags");
  if (s.ok()) {
    s = CudaCheck(cudaMalloc(reinterpret_cast<void**>(&comm->barrier), sizeof(float)),
                  "cudaMalloc");
  }
  if (s.ok()) s = CudaCheck(cudaMemset(comm->barrier, 0, sizeof(float)), "cudaMemset");
  if (!s.ok()) {
    comm->Abort(finalize_timeout);
    return s;
  }
  return comm;
}

}  // namespace nccl
}  // namespace dist
