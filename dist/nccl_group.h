// The `nccl` engine: ranks as processes or threads, one CUDA device per rank,
// collectives over NCCL. Built with --config=cuda only.
//
// Rendezvous goes through a dist::Store every rank reaches (HashStore for
// ranks as threads, FileStore across processes or hosts): rank 0 creates the
// NCCL unique id and sets it under "<prefix>/unique_id", the others wait for
// it; then each rank initializes its communicator (non-blocking, so init has
// the group's timeout as well and fails naming the ranks that never arrived).
// Use a fresh prefix (or store directory) per run: a stale id in the store
// would make init time out, and an earlier run's departures fail calls; a
// rank whose place under the prefix an earlier group claimed (the ranks that
// group had) fails at once (FailedPrecondition, dist/launch_layout.h).
//
// Each group has its own communicator, a communication stream
// (cudaStreamNonBlocking) and a worker thread. A collective is ordered after
// the work the caller queued so far on its compute stream (the issuing
// thread's per-thread default stream, where the tensor kernels run, unless
// set with options or SetNcclComputeStream): an event recorded
// there when the call is issued is waited for on the communication stream.
// The worker enqueues the NCCL kernel, records a completion event and polls
// it; Work::Wait() returns once the collective has finished on the device, so
// its results may then be read from any stream. A group and the groups split
// from it (HYBRID_SHARD's world, shard and replica groups) enqueue one rank's
// calls in the order they were issued, across their workers
// (dist/nccl_launch_order.h): NCCL needs the kernels of communicators that
// share GPUs launched in the same order on every rank.
//
// Dtypes f32, f16, bf16, i32, i64, u8 go to NCCL as they are (f16 and bf16
// are reduced by NCCL in their own precision, as in PyTorch; max and min of
// NaN follow NCCL). avg is ncclAvg; barrier is a one-element all-reduce.
// Tensors must be contiguous and on the group's device; reduce-scatter and
// all-gather accept NCCL's in-place forms (output = chunk rank of the input,
// input = chunk rank of the output). A call whose tensors are all on the CPU
// (small host values: flags, lengths, the list check of NewSubgroup) is
// staged through the device and runs synchronously: the returned Work is
// already complete. A call mixing devices, or on another GPU, fails:
//   "[all_gather] rank 0 of 2: the input tensor is on cpu; the nccl group of rank 0 uses cuda:0"
//
// Timeouts: each call's timeout counts from when it became this rank's oldest
// unfinished call. When it expires, the rank sets its count of issued calls
// under "<prefix>/seq/<rank>", reads the other ranks' (waiting up to
// report_wait for ranks whose own timeout comes later), aborts the
// communicator and fails the call with DeadlineExceeded:
//   "[all_reduce] rank 1 of 4 timed out after 2.0 s waiting for ranks 2, 3 (call #4 ...)"
// naming the ranks that had not issued the call or sent no report. An error
// NCCL reports (a peer's process died: ncclRemoteError) fails the call too.
// After either, the group is unusable: every later call fails at once with
// that error. A rank whose group breaks, or is destroyed (its work ended, or
// failed outside the group), says so in the store; a peer whose call has
// been unfinished for peer_check_interval (1 s) looks there every interval,
// and fails (Aborted) a call that rank will never make, instead of waiting
// for its timeout (a rank that timed out says so after its report_wait):
//   "[all_reduce] rank 0 of 2: rank 1 will never make this call (call #1 of this rank; rank 1
//   stopped before its call #1: its group was destroyed after issuing 1 call (...))"
// The store must outlive the group and the groups split from it.
//
// Unlike the threads and gloo engines, calls are not compared across ranks
// before they run (that would cost a host round trip per call). An invalid
// call is not issued: in a group of one it fails at once and the group stays
// usable; in a larger group this rank cannot know whether its peers refused
// it too, and its next call would pair with theirs, so once its earlier
// calls have finished the call fails and breaks the group (later calls fail
// naming it; peers that made the call fail about a second later naming this
// rank and the refusal, see below). Calls that
// do not match across ranks are NCCL's undefined behaviour (usually a hang,
// caught by the timeout).
//
// Split / NewSubgroup use ncclCommSplit (NCCL >= 2.18); the new group's
// keys live under "<prefix>/split<n>/color<c>", and its errors say "rank r
// of n in group world/split<n>/color<c>" (as the gloo and threads engines
// label subgroups), naming its peers by their ranks in it and in the world
// group ("rank 0 (world 1)": each member sets its world rank in the store,
// "<prefix>/world/<rank>", when the split makes the group).
#ifndef DIST_NCCL_GROUP_H_
#define DIST_NCCL_GROUP_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist/process_group.h"
#include "dist/store.h"

namespace dist {

struct NcclGroupOptions {
  // Namespaces the keys in the store (e.g. a run id).
  std::string prefix = "nccl";
  // The timeout of the rendezvous and communicator init, and of calls
  // without their own.
  absl::Duration timeout = DefaultCollectiveTimeout();
  // How long a rank whose call timed out waits for the other ranks' progress
  // reports before naming the ranks it waited for.
  absl::Duration report_wait = absl::Seconds(5);
  // The caller's compute stream (a cudaStream_t on the group's device);
  // nullptr: the issuing thread's per-thread default stream.
  void* compute_stream = nullptr;
  // This rank's place on its node (LOCAL_RANK, LOCAL_WORLD_SIZE): with a
  // local_world_size, the nodes' launches are compared through the store
  // before the unique id is exchanged (dist/launch_layout.h): nodes launched
  // with different --nnodes or --nproc_per_node all fail at once naming the
  // layouts, instead of timing out in communicator init or pairing with the
  // wrong peer. 0: not checked.
  int local_rank = 0;
  int local_world_size = 0;
  // How long a call may be unfinished before this rank looks in the store
  // for peers gone before it (a group broken or destroyed), and then how
  // often; each look reads one key while none has gone. Must be > 0;
  // InfiniteDuration: never (peers then wait for the timeout).
  absl::Duration peer_check_interval = absl::Seconds(1);
  // An nccl group of this rank whose launch order the new group shares:
  // this rank's calls on both (and on the groups split from either) reach
  // NCCL in the order they were issued, as a group and its splits always do
  // (PyTorch orders every group by its issuing thread). Without it, groups
  // made by separate calls are not ordered against each other, and calls
  // issued on them one after another may be enqueued in different orders on
  // different ranks: NCCL kernels of communicators sharing GPUs can then
  // deadlock. nullptr: an order of its own. InvalidArgument when not an
  // nccl group, or one on another device (another rank's). It need not
  // outlive the new group.
  ProcessGroup* launch_order_with = nullptr;
};

// Joins the group of `size` ranks as rank `rank`, on CUDA device
// `device_index` (one rank per device: NCCL refuses two ranks of a group on
// one device), which it leaves the calling thread's current device (also
// when a later step fails). Blocks until every rank has joined or
// options.timeout passes (DeadlineExceeded naming the missing ranks). `store`
// must outlive the group.
//
// The first call in a process sets NCCL_RUNTIME_CONNECT=0 unless the
// environment or NCCL's configuration files set it (dist/nccl_env.h): NCCL's
// buffers are allocated at init, while the GPU's memory is free.
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateNcclProcessGroup(
    int rank, int size, int device_index, Store& store, const NcclGroupOptions& options = {});

// Sets the stream (a cudaStream_t on the group's device; nullptr: the
// issuing thread's per-thread default stream) whose queued work later
// collectives of `group` wait for. Call it from the thread that issues the
// collectives. InvalidArgument when `group` is not an nccl group.
absl::Status SetNcclComputeStream(ProcessGroup& group, void* stream);

// The communication stream (a cudaStream_t) of an nccl group, e.g. to make
// another stream wait for it.
absl::StatusOr<void*> NcclCommunicationStream(ProcessGroup& group);

namespace internal {

// For tests: the lock under which `group`, the groups split from it and those
// sharing its launch order make their NCCL calls (nccl::LaunchOrder::NcclCalls),
// to hold it as another group's hung call would; it lives as long as the
// pointer (or the last of those groups). InvalidArgument when `group` is not
// an nccl group.
absl::StatusOr<std::shared_ptr<std::timed_mutex>> NcclCallsLockForTesting(ProcessGroup& group);

}  // namespace internal

}  // namespace dist

#endif  // DIST_NCCL_GROUP_H_
