// The host side of the `nccl` engine's calls (dist/nccl_group.h), free of
// CUDA so that it is tested without a GPU:
//   - PollUntil: polls a predicate until it holds, fails, or a deadline
//     passes, with an injectable clock;
//   - CallWorker: one thread per group that starts the rank's calls in issue
//     order and watches them finish. A call is a PendingCall (the engine
//     supplies it: enqueue NCCL kernels, query a CUDA event); the worker
//     counts each call's timeout from when it became the oldest unfinished
//     call, and on a timeout publishes this rank's progress to the store to
//     name the ranks it waited for (dist/nccl_rendezvous.h), aborts the
//     communicator (a callback) and fails that call and every later one: the
//     group is then unusable, as with the other engines. A call that fails
//     to start, or that this rank refuses (CallWorker::Refuse), breaks the
//     group the same way, so that its later calls cannot pair with a peer's
//     earlier one. A rank whose group breaks, or whose worker is destroyed,
//     publishes its departure (PublishGone); a call still unfinished after
//     peer_check_interval looks for one every interval, and a peer gone
//     before that call fails it at once, naming the peer and why;
//     With a LaunchOrder shared by a family of groups, each call starts only
//     once the family's calls issued before it have been enqueued
//     (dist/nccl_launch_order.h);
//   - RunWithin: a call on a thread of its own, waited for up to a limit
//     (NCCL's aborts, which may hang);
//   - CheckNcclTensors: the device, layout and aliasing rules of NCCL calls.
#ifndef DIST_NCCL_WORKER_H_
#define DIST_NCCL_WORKER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dist/nccl_launch_order.h"
#include "dist/nccl_rendezvous.h"
#include "dist/process_group.h"
#include "dist/store.h"
#include "dist/work.h"
#include "tensor/device.h"

namespace dist {
namespace nccl {

// Time as the worker sees it; tests substitute a fake one.
struct Clock {
  std::function<absl::Time()> now = [] { return absl::Now(); };
  std::function<void(absl::Duration)> sleep = [](absl::Duration d) { absl::SleepFor(d); };
};

// Calls poll() until it returns true (then true), an error (returned), or
// `deadline` has passed with poll() still false (then false). poll() is
// called at least once, and once more at or after the deadline before giving
// up. Sleeps between polls, from 1 us doubling up to max_sleep, never past
// the deadline.
absl::StatusOr<bool> PollUntil(absl::FunctionRef<absl::StatusOr<bool>()> poll, absl::Time deadline,
                               const Clock& clock = Clock(),
                               absl::Duration max_sleep = absl::Microseconds(100));

// Runs fn() on a thread of its own and waits up to `limit` for it to return:
// true when it did; false when it did not, the thread then left running
// (detached, with its own copy of fn: what fn uses must outlive it). With no
// thread to spare, runs fn() on this one, unbounded (true). For calls that
// may hang, as NCCL's abort may (NVIDIA/nccl#863: a peer gone mid-call).
bool RunWithin(std::function<void()> fn, absl::Duration limit);

// One call as the worker drives it. The worker calls these on its thread, in
// this order: Start once, Enqueued until true, Finished until true. After the
// first failure of the group none is called again.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  // Starts the call (enqueues its work). An error fails it.
  virtual absl::Status Start() = 0;
  // Whether the work of Start() is fully enqueued, so that the next call may
  // start (NCCL's non-blocking communicators may finish enqueuing in the
  // background). Counted against the call's timeout.
  virtual absl::StatusOr<bool> Enqueued() { return true; }
  // Whether the call has finished; an error fails it.
  virtual absl::StatusOr<bool> Finished() = 0;
  // True for calls that may only start once every earlier call has finished
  // (communicator management such as a split).
  virtual bool NeedsIdle() const { return false; }
  // False for calls that reach no NCCL communicator (a refusal): they take
  // no turn in the family's launch order.
  virtual bool Launches() const { return true; }
};

struct CallWorkerOptions {
  int rank = 0;
  int size = 1;
  std::string label;  // a subgroup's, as errors name it (nccl::Who); "" for the world group
  // Where ranks report their progress when a call times out (keys
  // "<prefix>/seq/<rank>"); without one, a timeout names every other rank.
  // Must outlive the worker.
  Store* store = nullptr;
  std::string prefix = "nccl";
  // How long a rank whose call timed out waits for the other ranks' reports.
  absl::Duration report_wait = absl::Seconds(5);
  // Runs first on the worker thread, and on the abort's (e.g. selects the
  // CUDA device).
  std::function<void()> on_thread_start;
  // Runs once, at the group's first failure, before the calls are failed
  // (aborts the communicator so that stuck kernels exit), on a thread of its
  // own that the worker waits for up to abort_timeout.
  std::function<void()> abort;
  // NCCL's abort may itself hang (a peer's process gone mid-call). Past
  // abort_timeout the calls fail anyway, their errors saying so, and their
  // PendingCalls (with the buffers the kernels may still write) go to
  // `abandon`, on the worker thread, to be kept for good: the engine must also
  // leave its communicator allocated, since the abort still uses it, and the
  // process should exit. Without `abandon` they are released.
  absl::Duration abort_timeout = absl::Seconds(60);
  // How long a call may be unfinished before its worker looks in the store
  // for peers gone before it, and then how often (one store read while none
  // has gone). InfiniteDuration: never.
  absl::Duration peer_check_interval = absl::Seconds(1);
  std::function<void(std::vector<std::shared_ptr<PendingCall>>)> abandon;
  // Shared by a group and the groups split from it: a call starts only on its
  // turn in the family's issue order (taken at Submit). Null: this worker's
  // own order only.
  std::shared_ptr<LaunchOrder> launch_order;
  Clock clock;
  // The longest sleep between two polls of an unfinished call.
  absl::Duration max_poll_sleep = absl::Microseconds(100);
};

class CallWorker {
 public:
  explicit CallWorker(CallWorkerOptions options);
  // Publishes this rank's departure (first unrun call: submitted(); under
  // the lock, so that a Break racing with it publishes a lower number after
  // it), then lets every submitted call finish (each one completes or fails
  // within its timeout), then stops the thread.
  ~CallWorker();
  CallWorker(const CallWorker&) = delete;
  CallWorker& operator=(const CallWorker&) = delete;

  // Queues `call` as this rank's next call (numbered submitted() before it).
  // On a broken worker the call is not started and its work fails at once
  // with BrokenError(op).
  WorkPtr Submit(std::string op, absl::Duration timeout, std::shared_ptr<PendingCall> call);

  // This rank's next call, refused before it reached NCCL (bad arguments, no
  // memory to stage it): `error`, already prefixed with the op and rank. In a
  // group of one the work fails at once with `error` and the group stays
  // usable; in a broken one it fails at once with BrokenError (naming
  // `error` too). In a
  // larger group the peers will issue the call that this rank never makes,
  // and this rank's next call would pair with it: once every earlier call has
  // finished, the refusal publishes this rank's count of issued calls (so a
  // peer's timeout names it) and breaks the group, whose later calls then
  // fail with BrokenError; the departure it publishes fails the peers' call
  // at their next peer check.
  WorkPtr Refuse(std::string op, absl::Duration timeout, absl::Status error);

  // The number of calls submitted so far.
  int64_t submitted() const;
  // OK while the group is usable; else the error that broke it.
  absl::Status broken() const;
  // "[<op>] rank 1 of 4: the group is unusable after an earlier failure: <broken()>"
  // (a subgroup's "rank 1 of 4 in group <label>"), with broken()'s code.
  absl::Status BrokenError(absl::string_view op) const;

 private:
  struct Item {
    std::string op;
    absl::Duration timeout;
    int64_t number = 0;
    int64_t ticket = -1;  // In options_.launch_order, until passed.
    std::shared_ptr<PendingCall> call;
    std::shared_ptr<CompletionWork> work;
  };

  void Loop();
  // Passes `item`'s ticket, if it holds one: the family's next call may start.
  void PassTurn(Item& item);
  // Starts `item` and waits until it is enqueued; false when it failed.
  bool StartItem(Item& item);
  // Breaks the group with `error` (the failure of `failed`): aborts, then
  // fails `failed` with `error` (plus a word on the abort when it did not
  // return) and every other call in flight or queued with BrokenError.
  void Break(Item& failed, const absl::Status& error);
  // Runs options_.abort on a thread of its own; false when it has not
  // returned within abort_timeout (the thread is then left running).
  bool RunAbort();
  absl::Status TimeoutError(const Item& item);
  // Whether this worker publishes its departures and reads its peers'.
  bool TracksPeers() const { return options_.store != nullptr && options_.size > 1; }
  bool ChecksPeers() const {
    return TracksPeers() && options_.peer_check_interval != absl::InfiniteDuration();
  }
  // PeerGoneError when a peer published its departure before `item`'s call
  // (FindGonePeer); else OK. Needs the store: runs only when ChecksPeers.
  // Worker thread only.
  absl::Status PeerGone(const Item& item);
  absl::Status CallError(const Item& item, const absl::Status& status) const;
  absl::Status BrokenErrorLocked(absl::string_view op) const;

  const CallWorkerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;      // Submitted, not started. Guarded by mu_.
  int64_t submitted_ = 0;       // Guarded by mu_.
  absl::Status broken_;         // Guarded by mu_.
  bool stop_ = false;           // Guarded by mu_.
  std::deque<Item> in_flight_;  // Started, unfinished, oldest first. Worker thread only.
  GoneCache gone_;              // The peers' departures read so far. Worker thread only.
  std::thread thread_;          // Last: starts after the members above exist.
};

// The NCCL rules for the tensors of `call` (whose generic checks passed) on a
// group whose rank `rank` of `size` uses `device`: every tensor on `device`
// and contiguous; an output that overlaps the input only in the in-place
// forms NCCL supports (reduce_scatter: output is chunk `rank` of the input;
// all_gather: input is chunk `rank` of the output). InvalidArgument naming
// the op: "[all_gather] rank 0 of 2: the input tensor is on cpu; the nccl
// group of rank 0 uses cuda:0" (a subgroup: "rank 0 of 2 in group <label>").
absl::Status CheckNcclTensors(const CollectiveCall& call, tensor::Device device, int rank,
                              int size, absl::string_view label = "");

}  // namespace nccl
}  // namespace dist

#endif  // DIST_NCCL_WORKER_H_
