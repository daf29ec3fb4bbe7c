// The rendezvous of the `threads` engine (dist/thread_group.h): the state
// the handles of a group share (one lock and condition variable a world),
// and one rank's side of a collective's round: publishing its call, waiting
// until every member has made the same call (or the timeout passes, a member
// is gone for good, or the group is aborted), checking that the calls match,
// waiting until all have staged their buffers, then until all are done. The
// data movement of a round is thread_group.cc's. Private to :thread_group.
#ifndef DIST_THREAD_RENDEZVOUS_H_
#define DIST_THREAD_RENDEZVOUS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dist/process_group.h"
#include "tensor/cuda_backend.h"
#include "tensor/device.h"

namespace dist {
namespace internal {

// What every group of a world shares: one lock and condition variable for all
// rendezvous state, and which ranks' threads have finished.
struct WorldState {
  explicit WorldState(int size) : finished(size, false), finish_status(size) {}
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> finished;               // by world rank; guarded by mu
  std::vector<absl::Status> finish_status;  // by world rank; guarded by mu
  int live_handles = 0;                     // guarded by mu
};

// One rank's call as its peers see it during a round. Lives on the stack of
// the rank's worker until every member has left the round's compute phase.
struct Arrival {
  bool is_split = false;
  const CollectiveCall* call = nullptr;  // when !is_split
  int color = -1;                        // split
  int key = 0;                           // split
  const void* in = nullptr;              // contiguous buffers (staged when needed)
  void* out = nullptr;
  // Where in / out were at arrival: the host, or a GPU (the device path:
  // see Execute). Fixed once published: every rank decides the round's path
  // from it (StageOnHost may then move in / out to host buffers).
  tensor::Device device = tensor::Device::Cpu();
  tensor::cuda::EventHandle issued = nullptr;  // device path: the issuing stream's mark
  tensor::cuda::EventHandle done = nullptr;    // device path: the end of this rank's share
  absl::Status error;                          // this rank's arguments are invalid
  absl::Status failed;  // staging or device work failed on this rank (set before leaving)
};

struct GroupState;

// The state of one collective call (the seq-th of the group) while its
// members pass through it.
struct Round {
  std::vector<const Arrival*> arrivals;  // by group rank; null until arrived
  int num_arrived = 0;
  int num_staged = 0;  // calls mixing devices: ranks whose buffers are on the host now
  int num_done = 0;
  int num_left = 0;    // ranks whose before_leave has run
  int num_exited = 0;  // ranks that returned from Leave
  std::map<int, std::shared_ptr<GroupState>> splits;  // by color (split rounds)
  // Collectives, by group rank, published by each rank as it finishes its
  // share (Leave): read after every rank has, when a peer's Arrival may
  // already be gone (a peer that left returns and destroys it).
  std::vector<tensor::cuda::EventHandle> share_done;  // device path: the end of its share
  std::vector<absl::Status> failed;                   // its staging or device work failed
};

// What the handles of one group share. Guarded by world->mu.
struct GroupState {
  GroupState(std::shared_ptr<WorldState> w, std::vector<int> ranks, std::string name)
      : world(std::move(w)),
        world_ranks(std::move(ranks)),
        label(std::move(name)),
        pending(world_ranks.size(), 0),
        closed(world_ranks.size(), false) {}
  int size() const { return static_cast<int>(world_ranks.size()); }

  const std::shared_ptr<WorldState> world;
  const std::vector<int> world_ranks;  // group rank -> world rank
  const std::string label;             // "" for the world group
  std::map<int64_t, Round> rounds;     // by call number
  std::vector<int> pending;            // calls queued or running, by group rank
  std::vector<bool> closed;            // the member's handle was destroyed
  absl::Status abort;                  // not OK once a call failed for good
};

// One rank's side of its group's rounds (call seq of every member is round
// seq). Arrive, Staged and Leave take world->mu themselves; the others read
// what is fixed by then (the group's size and label, the published arrivals,
// the failures every rank has set).
class Rendezvous {
 public:
  Rendezvous(std::shared_ptr<GroupState> group, int rank) : group_(std::move(group)), rank_(rank) {}

  // "rank 1 of 4" (+ " in group <label>" in a subgroup), as errors name it.
  std::string Who() const;

  // Publishes `me` as this rank's seq-th call and waits until every member has
  // arrived (filling *arrivals), the timeout passes, a missing member is gone
  // for good, or the group is aborted. Takes world.mu.
  absl::Status Arrive(int64_t seq, const Arrival& me, absl::string_view op, absl::Duration timeout,
                      std::vector<const Arrival*>* arrivals);

  // The error when some member's arguments were invalid or the calls differ;
  // identical on every rank, so no rank needs to abort the group.
  absl::Status CheckArrivals(const std::vector<const Arrival*>& all, absl::string_view op) const;

  // Every rank of round seq calls this once its buffers are staged: runs
  // `publish` under the lock (where a rank sets its Arrival's buffers and
  // failed), then waits until every member has.
  void Staged(int64_t seq, const std::function<void()>& publish);

  // Marks this rank's share of round seq done and waits for the others (no
  // timeout: every member has arrived and only has bounded copies left, and
  // peers may still be reading this rank's buffers). Takes world.mu.
  // `before_leave` runs under the lock once all are done; it must read the
  // peers' results from the Round (`mine`'s done and failed are published
  // there), never through their Arrivals, which a peer that already left has
  // destroyed. No rank returns before every rank's before_leave has run: a
  // rank that returned may destroy what a peer's uses (the event that ends
  // its share, which the peer's stream waits for).
  void Leave(int64_t seq, const std::function<void(Round&)>& before_leave = nullptr,
             const Arrival* mine = nullptr);

  // "[op] rank r of n: rank p failed: <why>" for the first peer p whose
  // staging or device work failed (failed_of(p), read once every rank has set
  // its own), else OK.
  absl::Status PeerFailure(absl::string_view op,
                           absl::FunctionRef<const absl::Status&(int)> failed_of) const;

 private:
  int size() const { return group_->size(); }
  // "ranks 2, 3" (+ " (world ranks 5, 6)" in a subgroup).
  std::string NameRanks(const std::vector<int>& ranks) const;
  // The error of a call on an aborted group. world.mu held.
  absl::Status AbortedError(absl::string_view op) const;

  const std::shared_ptr<GroupState> group_;
  const int rank_;
};

}  // namespace internal
}  // namespace dist

#endif  // DIST_THREAD_RENDEZVOUS_H_
