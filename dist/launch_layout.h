// The launch layout check of the process engines' rendezvous (gloo, nccl):
// before ranks connect, every node's local rank 0 sets
// "<prefix>/layout/first<r>" = "<world size>,<ranks on the node>" (r: the
// node's first rank), and every rank walks the nodes from rank 0, each
// node's first rank plus its count giving the next, until the world is
// covered. A node whose world size differs, a walk that overshoots the world
// or steps over this rank's node, is a launch that disagrees (--nnodes,
// --nproc_per_node): the rank that finds it writes the message under
// "<prefix>/layout/mismatch" and every rank fails at once with it, instead of
// timing out on the engine's keys or pairing with the wrong peer. Nodes may
// have different counts (as torchrun allows). A node set up for a smaller
// world whose walk ends before the others' nodes (it sees a node at its
// world size, or the mismatch another rank wrote) fails too, if that shows
// before it has connected (CheckNoLayoutMismatch after connecting); one that
// arrives later is not caught. A node that starts inside a rank's own node
// (which the walk steps over) is a disagreement too: the node's local rank 0
// looks for one while it waits, and every rank once its walk is done.
//
// Before that, each rank claims its place under the prefix (ClaimRank): a
// store that already holds a rank's claim was used by an earlier group under
// the same prefix (a file store's directory outlives its run), whose keys --
// the NCCL unique id, the peers' addresses, their departures -- this group
// would read as its own: a hang, or a peer reported gone that is not.
//
// A rank that fails before it claims its place (its own setup: a flag's
// value, its data, its device) says why (AnnounceFailure), and every rank
// waiting in the rendezvous (the layout walk here, the engines' waits for
// keys through CheckPeerFailure) fails at once with it instead of waiting
// out its timeout for a rank that will never come: the case a launcher
// cannot see, a node whose workers failed while the other nodes' wait (each
// node's launcher stops only its own workers).
//
// The store is reached through LayoutStore: gloo's store and dist::Store
// each have an adapter (DistLayoutStore here; gloo's in gloo_group.cc).
#ifndef DIST_LAUNCH_LAYOUT_H_
#define DIST_LAUNCH_LAYOUT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dist/store.h"

namespace dist::internal {

struct LaunchLayout {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // 0: not known (no check)
};

// The store operations the checks need; each throws a std::exception on a
// store error.
class LayoutStore {
 public:
  virtual ~LayoutStore() = default;
  // Sets `key` (a key is set once: a second set may throw).
  virtual void Set(const std::string& key, const std::string& value) = 0;
  // Sets `key` unless it is set: true when this call set it. Of processes
  // racing for one key, one wins (dist::Store: by Add; Gloo's stores: Redis's
  // SETNX, the FileStore's check for its file, which leaves a short window).
  virtual bool SetIfAbsent(const std::string& key, const std::string& value) = 0;
  // The value of `key`, which Present said is set.
  virtual std::string Get(const std::string& key) = 0;
  // Whether `key` is set now, without waiting.
  virtual bool Present(const std::string& key) = 0;
  // The store's folder when it holds this run's keys alone (messages may say
  // to remove it); "" otherwise.
  virtual std::string Where() const { return ""; }
};

// A dist::Store as a LayoutStore (its errors thrown as std::runtime_error).
class DistLayoutStore final : public LayoutStore {
 public:
  explicit DistLayoutStore(Store& store) : store_(store) {}
  void Set(const std::string& key, const std::string& value) override;
  bool SetIfAbsent(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key) override;
  bool Present(const std::string& key) override;

 private:
  Store& store_;
};

// Sets "<prefix>/joined/<rank>" to this process ("host <name> pid <pid>").
// FailedPrecondition when it is set already, naming the process that set it
// and what to change; Unavailable when the store fails.
absl::Status ClaimRank(LayoutStore& store, const std::string& prefix, int rank,
                       const std::string& who);

// The engines' first step: ClaimRank, then CheckLaunchLayout. A rank claimed
// before fails with the claim's error (and the layout check's, when that
// fails too), after a layout check that waits for nothing: a node's first
// rank still publishes its layout, so that the ranks of nodes launched
// differently (two of whose ranks may claim one rank) find it.
absl::Status ClaimAndCheckLayout(LayoutStore& store, const std::string& prefix,
                                 const LaunchLayout& me, absl::Time deadline,
                                 const std::string& who);

// Before a rank has claimed its place: sets
// "<prefix>/failed_before_joining/<rank>" to "<unix ms> rank <rank> (host
// <name> pid <pid>) failed before joining: <why>", then the mark the waits
// look for, "<prefix>/failed_before_joining" (each rank a key of its own:
// a node's ranks often fail at once). A rank that claimed its place sets
// nothing: it joined, and the engines tell its peers what happens next.
// Returns whether it set the keys; Unavailable (naming "rank <rank> of
// <size>") when the store fails.
absl::StatusOr<bool> AnnounceFailure(LayoutStore& store, const std::string& prefix, int rank,
                                     int size, const std::string& why);

// Aborted "[rendezvous] <who>: rank 2 (host ... pid ...) failed before
// joining: <why>" when a rank of `size` announced its failure under
// `prefix` (the lowest such rank); OK when none did. When it was said before
// this process started (more than 5 s before), the message adds that an earlier run under the same
// prefix may have left it (give each run its own --rdzv_id), as a claim an
// earlier run left is refused (ClaimRank). Throws std::exception when the
// store fails (as LayoutStore).
absl::Status CheckPeerFailure(LayoutStore& store, const std::string& prefix, int size,
                              const std::string& who);

// The mark AnnounceFailure sets: "<prefix>/failed_before_joining".
std::string FailureKey(const std::string& prefix);

// OK when the nodes agree; InvalidArgument naming the disagreement;
// Aborted when, while it waits, a rank announced its failure
// (CheckPeerFailure); DeadlineExceeded naming the first node (by its first rank) that did not
// arrive by `deadline`; Unavailable when the store fails.
absl::Status CheckLaunchLayout(LayoutStore& store, const std::string& prefix,
                               const LaunchLayout& me, absl::Time deadline,
                               const std::string& who);

// After connecting (and while the walk waits): InvalidArgument when a rank
// has since found the nodes launched differently, a node starts at this
// rank's world size, or one starts inside this rank's node (this rank's
// verdict, then written for the others).
absl::Status CheckNoLayoutMismatch(LayoutStore& store, const std::string& prefix,
                                   const LaunchLayout& me, const std::string& who);

}  // namespace dist::internal

#endif  // DIST_LAUNCH_LAYOUT_H_
