// The order in which one rank's calls on a family of nccl groups (a group and
// every group split from it) reach NCCL.
//
// Each group has its own worker thread (dist/nccl_worker.h), which enqueues
// its calls in issue order; without more, calls issued on two groups of a
// family one after the other could be enqueued in either order, and in
// different orders on different ranks. NCCL requires the calls of
// communicators that share devices to be launched in the same order on every
// rank: a kernel waiting for a peer can keep the GPU from running the kernel
// that peer waits for (NCCL's "Using multiple NCCL communicators
// concurrently"), as PyTorch gets by enqueuing on the issuing thread.
//
// LaunchOrder hands each call a ticket when it is issued (Take, in issue
// order); a worker starts a call only on its turn, once every earlier ticket
// has been passed: its call fully enqueued, or failed, or dropped. Groups
// made by separate CreateNcclProcessGroup calls are separate families, not
// ordered against each other (PyTorch orders every group by its issuing
// thread), unless made with NcclGroupOptions::launch_order_with: split them
// from one group, or pass that, when one rank uses several.
//
// A family also makes its NCCL calls one thread at a time (NcclCalls): NCCL
// is not thread-safe across communicators of one device ("Thread Safety" in
// its user guide), and each group's worker polls its communicator
// (ncclCommGetAsyncError) while another's may enqueue. Polls only try it
// (taken: not ready yet), and other calls wait for it a bounded time, so
// that a call that hangs holding it (a destroy behind a kernel waiting for a
// peer) does not keep the other groups' watchdogs from their timeouts and
// aborts. ncclCommAbort does not take it: an abort must not wait behind the
// call it ends (a hang NCCL's abort is for).
#ifndef DIST_NCCL_LAUNCH_ORDER_H_
#define DIST_NCCL_LAUNCH_ORDER_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>

namespace dist {
namespace nccl {

class LaunchOrder {
 public:
  LaunchOrder() = default;
  LaunchOrder(const LaunchOrder&) = delete;
  LaunchOrder& operator=(const LaunchOrder&) = delete;

  // The next ticket (0, 1, 2, ...).
  int64_t Take();
  // Whether every ticket before `ticket` has been passed.
  bool IsTurn(int64_t ticket) const;
  // Blocks until IsTurn(ticket).
  void WaitForTurn(int64_t ticket) const;
  // Marks a taken ticket passed (in any order; each once).
  void Pass(int64_t ticket);
  // Tickets taken so far.
  int64_t taken() const;

  // Held around each NCCL call on the family's communicators (the
  // communicators are non-blocking: a call returns at once, unless it hangs).
  std::timed_mutex& NcclCalls() const { return nccl_calls_; }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int64_t taken_ = 0;             // Guarded by mu_.
  int64_t turn_ = 0;              // The lowest ticket not passed. Guarded by mu_.
  std::set<int64_t> passed_ahead_;  // Passed tickets above turn_. Guarded by mu_.
  mutable std::timed_mutex nccl_calls_;
};

}  // namespace nccl
}  // namespace dist

#endif  // DIST_NCCL_LAUNCH_ORDER_H_
