// The launch layout check of the gloo engine's rendezvous (GlooGroupOptions::
// local_world_size): before ranks connect, every node's local rank 0 sets
// "<prefix>/layout/first<r>" = "<world size>,<ranks on the node>" (r: the
// node's first rank), and every rank walks the nodes from rank 0, each
// node's first rank plus its count giving the next, until the world is
// covered. A node whose world size differs, a walk that overshoots the world
// or steps over this rank's node, is a launch that disagrees (--nnodes,
// --nproc_per_node): the rank that finds it writes the message under
// "<prefix>/layout/mismatch" and every rank fails at once with it, instead of
// timing out on gloo's keys or pairing with the wrong peer. Nodes may have
// different counts (as torchrun allows). A node set up for a smaller world
// whose walk ends before the others' nodes (it sees a node at its world
// size, or the mismatch another rank wrote) fails too, if that shows before
// it has connected (CheckNoLayoutMismatch after connecting); one that
// arrives later is not caught. Private to dist:gloo_group.
#ifndef DIST_GLOO_LAYOUT_H_
#define DIST_GLOO_LAYOUT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"

namespace dist::internal {

struct LaunchLayout {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // 0: not known (no check)
};

// Whether a key is set, without waiting (gloo's Store::wait counts whole
// seconds); throws on store errors.
using KeyPresent = std::function<bool(const std::string& key)>;

// OK when the nodes agree; InvalidArgument naming the disagreement;
// DeadlineExceeded naming the first node (by its first rank) that did not
// arrive by `deadline`; Unavailable when the store fails.
absl::Status CheckLaunchLayout(gloo::rendezvous::Store& store, const KeyPresent& present,
                               const std::string& prefix, const LaunchLayout& me,
                               absl::Time deadline, const std::string& who);

// After connecting: InvalidArgument when a rank has since found the nodes
// launched differently, or a node starts at this rank's world size.
absl::Status CheckNoLayoutMismatch(gloo::rendezvous::Store& store, const KeyPresent& present,
                                   const std::string& prefix, const LaunchLayout& me,
                                   const std::string& who);

}  // namespace dist::internal

#endif  // DIST_GLOO_LAYOUT_H_
