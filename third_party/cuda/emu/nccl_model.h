// The emulated NCCL's state (nccl.cc), shared with its model of launch order
// across communicators (nccl_order.cc). Private to //third_party/cuda/emu:nccl.
// Every function here expects Mu() held.
#ifndef THIRD_PARTY_CUDA_EMU_NCCL_MODEL_H_
#define THIRD_PARTY_CUDA_EMU_NCCL_MODEL_H_

#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "third_party/cuda/emu/pending.h"

namespace cuda_emu_nccl {

// One rank's part in one numbered call.
struct Part {
  const void* send = nullptr;
  void* recv = nullptr;
  std::shared_ptr<cuda_emu::PendingWork> work;
  ncclComm_t comm = nullptr;
  int color = 0, key = 0;  // splits (recv is then the new communicator)
};

struct Call {
  // What every rank must agree on.
  int kind = 0;  // 0 all_reduce, 1 reduce_scatter, 2 all_gather, 3 broadcast, 4 split
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  std::vector<Part> parts;  // by rank; work == nullptr until the rank came
  int arrived = 0;
  bool failed = false;  // a member aborted: the others finish without a result
};

// The ranks of one unique id (or of one color of a split).
struct Clique {
  int size = 0;
  std::vector<ncclComm_t> members;  // by rank; nullptr until joined / after destroy
  int joined = 0;
  std::map<int64_t, Call> calls;  // by number, until done
};

// One lock for every clique and communicator: the emulation favors clarity.
std::mutex& Mu();
std::condition_variable& Cv();

// Sets `comm`'s asynchronous error, unless it has one.
void SetError(ncclComm_t comm, ncclResult_t error, const std::string& message);

// Runs call `number` of `clique`, whose ranks all came (unless it failed),
// finishes every rank's pending work and drops the call (nccl.cc). The
// caller then runs CompleteUnblocked for the calls that waited for it.
void CompleteCall(Clique& clique, int64_t number);

// ---- Launch order (nccl_order.cc) ----
// Records that comm's rank launched its call `number` (a collective) on its
// device, after checking it against the other communicators' launches there:
// two devices that launched two unfinished calls in opposite orders fail
// both communicators (false then, and nothing is recorded).
bool RecordLaunch(ncclComm_t comm, const Call& call, int64_t number);
// Whether call `number` of `clique` (launched by every rank) must wait, on
// one of its ranks' devices, for an unfinished call of another communicator
// launched there before it.
bool Blocked(const Clique& clique, int64_t number);
// Fails the communicators of a cycle of calls each waiting for the next,
// through `clique`'s call `number` just launched; true when there was one.
// A call waits for the unfinished calls of other communicators launched
// before it on its devices, and, on the device of a rank that has not
// launched it yet, for every unfinished call of another communicator
// launched there already.
bool FailDeadlock(const Clique& clique, int64_t number);
// Completes the calls whose ranks all came and that no longer wait (after a
// call finished, a communicator failed or left), until none is left.
void CompleteUnblocked();
// Drops the launches of `clique` (call `number`, or every call when number
// is negative) on `device` (every device when negative).
void ForgetLaunches(const Clique* clique, int64_t number, int device);

}  // namespace cuda_emu_nccl

// The handle the API hands out.
struct ncclComm {
  std::shared_ptr<cuda_emu_nccl::Clique> clique;  // null while a split is in progress
  int rank = -1;
  int size = 0;
  int device = 0;
  // The emulated process this communicator belongs to: a fresh one at init
  // (ranks are threads standing for processes), its parent's for a split.
  // NCCL's thread safety binds the communicators of one process and device.
  int64_t process = 0;
  bool blocking = true;  // its config's (errors of a non-blocking one are kept)
  int64_t next_call = 0;
  ncclResult_t error = ncclSuccess;  // asynchronous error
  std::string last_error;
  // This rank's pending collectives (to finish on abort, to wait for on finalize).
  std::vector<std::shared_ptr<cuda_emu::PendingWork>> outstanding;
  // This rank's part in the last ncclCommSplit of this communicator: as in
  // NCCL, the parent is in progress until every rank has made the split, even
  // for a rank that takes no part in a new communicator (NCCL_SPLIT_NOCOLOR).
  std::shared_ptr<cuda_emu::PendingWork> split;
};

#endif  // THIRD_PARTY_CUDA_EMU_NCCL_MODEL_H_
