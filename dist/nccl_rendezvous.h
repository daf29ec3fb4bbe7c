// The store side of the `nccl` engine (dist/nccl_group.h), free of CUDA so
// that it is tested without a GPU:
//   - the NCCL unique id: rank 0 creates it and sets it (hex) under
//     "<prefix>/unique_id"; the other ranks wait for it;
//   - arrival marks ("<prefix>/init/<rank>") set by every rank that reaches
//     communicator init, so that an init that times out names the ranks that
//     never came;
//   - progress reports: when a call times out, the rank sets its count of
//     issued calls under "<prefix>/seq/<rank>" and reads the others' (waiting
//     a little for ranks whose own timeout comes later); ranks that had issued
//     fewer calls than the one that timed out, or that sent no report, are the
//     ones it waited for;
//   - the messages of those failures, in the form every engine uses:
//     "[all_reduce] rank 1 of 4 timed out after 2.0 s waiting for ranks 2, 3"
//     (in a subgroup "rank 1 of 4 in group <label> ... waiting for rank 2
//     (world 6)", as the gloo and threads engines name them: each member of a
//     subgroup sets its world rank under "<prefix>/world/<rank>" at the split);
//   - departures: a rank whose group broke, or whose group is being
//     destroyed, sets "<prefix>/gone/<rank>" (the number of its first call
//     that will not run, and why) and counts itself in "<prefix>/gone_count",
//     so that a peer waiting in a call that rank will never make fails at
//     once instead of timing out (as the threads engine's "peer left").
//
// Calls are numbered from 0 in issue order on each rank's group (as in the
// threads engine's messages); a rank's count of issued calls is the number of
// the next one.
#ifndef DIST_NCCL_RENDEZVOUS_H_
#define DIST_NCCL_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dist/launch_layout.h"
#include "dist/store.h"

namespace dist {
namespace nccl {

// "rank 1 of 4"; in a subgroup, labelled as the other engines label theirs
// (`label`: "world/split0/color1", the world group's first split, color 1),
// "rank 1 of 2 in group world/split0/color1". A subgroup's errors name its
// peers by their ranks in it and their world ranks ("rank 0 (world 2)").
std::string Who(int rank, int size, absl::string_view label = "");

// internal::CheckPeerFailure (launch_layout.h) for the waits of the init: the
// Aborted error when a rank announced that it failed before joining; OK
// when none did, or when the store cannot be read (the wait's own reads
// report that).
absl::Status PeerFailure(internal::LayoutStore& store, absl::string_view prefix, int size,
                         const std::string& who);

// For rank `rank` of `size` that failed before it joined
// (CreateNcclProcessGroup was never reached): internal::AnnounceFailure
// (launch_layout.h) in the engine's store, so that its peers' waits end at
// once naming it and `why`. Whether it was said: not when this rank joined.
absl::StatusOr<bool> AnnounceFailure(Store& store, absl::string_view prefix, int rank, int size,
                                     const std::string& why);

// The key of the unique id: "<prefix>/unique_id".
std::string UniqueIdKey(absl::string_view prefix);

// Rank 0 calls create() and sets its bytes under UniqueIdKey(prefix); every
// other rank waits up to `timeout` for that key. Returns the id (id_bytes raw
// bytes) on every rank. Fails with DeadlineExceeded naming rank 0 when the id
// does not come, Aborted at once when a rank announced that it failed before
// joining (PeerFailure), InvalidArgument when the key holds something that is not an
// id of id_bytes bytes (a stale or foreign key: use a fresh prefix per run).
absl::StatusOr<std::string> ExchangeUniqueId(
    Store& store, absl::string_view prefix, int rank, int size, size_t id_bytes,
    absl::FunctionRef<absl::StatusOr<std::string>()> create, absl::Duration timeout);

// Counts per rank read from "<dir>/<rank>" keys; nullopt where a rank set no
// key (or an unreadable one).
using RankCounts = std::vector<std::optional<int64_t>>;

// Sets "<dir>/<rank>" to `count` (decimal).
absl::Status PublishCount(Store& store, absl::string_view dir, int rank, int64_t count);

// Sets this rank's count of issued calls, "<prefix>/seq/<rank>", as a call
// that failed to start does (ReportProgress sets it on a timeout).
absl::Status PublishIssued(Store& store, absl::string_view prefix, int rank, int64_t issued);

// The counts of ranks 0 .. size-1 under "<dir>/", after waiting up to `wait`
// for all of them to be set (returns early once all are). Store errors leave
// the rank's entry empty.
RankCounts ReadCounts(Store& store, absl::string_view dir, int size, absl::Duration wait);

// The ranks other than `rank` whose count is missing or below `needed`, in
// increasing order.
std::vector<int> MissingRanks(const RankCounts& counts, int64_t needed, int rank);

// Marks that `rank` reached communicator init: sets "<prefix>/init/<rank>".
absl::Status MarkInitArrival(Store& store, absl::string_view prefix, int rank);

// The error of an init that timed out on `rank` after `timeout`: reads the
// arrival marks (no waiting) and names the ranks without one:
// "[nccl_init] rank 0 of 2 timed out after 2.0 s waiting for rank 1 (it never
// reached communicator init: ...)". DeadlineExceeded. `detail` (may be empty)
// is appended, e.g. what NCCL said.
absl::Status InitTimeoutError(Store& store, absl::string_view prefix, int rank, int size,
                              absl::Duration timeout, absl::string_view detail);

// What a rank learned when its call number `call` timed out.
struct ProgressReport {
  // The ranks it waited for (see MissingRanks), in increasing order.
  std::vector<int> missing;
  // Every rank's count of issued calls as reported (this rank's included).
  RankCounts counts;
  // Set when this rank could not publish its own count (the peers then
  // cannot tell it was there).
  absl::Status publish_error;
  // False when there was no store: every other rank is named.
  bool have_store = true;
  // In a subgroup: each rank's world rank as its member published it at the
  // split (WorldRankKey; -1: not read), which the error gives after the
  // ranks it waited for; empty in the world group.
  std::vector<int> world_ranks;
};

// "<prefix>/world/<rank>": the world rank of a subgroup's rank, which it sets
// when the split makes the group (errors name peers by it, as the gloo and
// threads engines do).
std::string WorldRankKey(absl::string_view prefix, int rank);

// The world ranks of `ranks` of the subgroup under `prefix`, by rank (size
// entries; -1 for those not there within `wait`, all waited for at once, or
// not asked for).
std::vector<int> ReadWorldRanks(Store& store, absl::string_view prefix, int size,
                                const std::vector<int>& ranks, absl::Duration wait);

// On a timeout of this rank's call number `call` with `issued` calls issued
// so far (issued > call): sets "<prefix>/seq/<rank>" = issued, then reads the
// other ranks' counts, waiting up to `wait` for them, and names the ranks
// whose count is below call + 1 or missing. Without a store (nullptr) every
// other rank is named.
ProgressReport ReportProgress(Store* store, absl::string_view prefix, int rank, int size,
                              int64_t call, int64_t issued, absl::Duration wait);

// "[<op>] rank 1 of 4 timed out after 2.0 s waiting for ranks 2, 3 (call #4
// of this rank; rank 2 had issued 4 calls; rank 3 sent no report within
// 5.0 s: ...)". When no rank is missing (every rank had issued the call):
// "[<op>] rank 1 of 4 timed out after 2.0 s waiting for the call to finish
// (call #4; every rank had issued it: ...)", or for a group of one "...
// (call #4: the device never finished it)". DeadlineExceeded.
// `label`: the group's, as Who takes it; report.world_ranks (a subgroup's)
// add "(world 6, ?)" after the ranks it waited for.
absl::Status CallTimeoutError(absl::string_view op, int rank, int size, absl::Duration timeout,
                              int64_t call, const ProgressReport& report, absl::Duration wait,
                              absl::string_view label = "");

// "<dir>/<rank>".
std::string RankKey(absl::string_view dir, int rank);

// The keys stay in the store (the train binaries remove a run's once it
// ended well: models/common/run_keys.h): a run that reuses the prefix with
// the same store would read them, as it would a stale unique id (use a fresh
// prefix).
//
// Says that `rank` will not run its calls numbered `first_unrun` and later
// (its group broke at that call, or was destroyed after issuing that many),
// with `reason` for the peers' messages. Sets "<prefix>/gone/<rank>" (which
// a later departure with a lower number overwrites) and adds 1 to
// "<prefix>/gone_count".
absl::Status PublishGone(Store& store, absl::string_view prefix, int rank, int64_t first_unrun,
                         absl::string_view reason);

// A peer that published its departure.
struct GonePeer {
  int rank = 0;
  int64_t first_unrun = 0;
  std::string reason;
};

// What a rank has read of its peers' departures (one per group and rank).
struct GoneCache {
  int64_t count_seen = 0;       // "<prefix>/gone_count" when last read in full
  std::vector<GonePeer> peers;  // every departure read (the latest of each rank)
};

// A peer of `rank` (of `size`) gone before this rank's call number `call`
// (first_unrun <= call), or nullopt: one that stopped on its own before one
// that stopped because another had gone ("will never make this call" in its
// reason), then the lowest rank. Reads (never writes) gone_count, and the
// departures (into `cache`) only when it grew; a departure that could not
// be read is read again at the next call. Store errors count as no
// departure.
std::optional<GonePeer> FindGonePeer(Store& store, absl::string_view prefix, int rank, int size,
                                     int64_t call, GoneCache& cache);

// "[<op>] rank 0 of 2: rank 1 will never make this call (call #3 of this rank;
// rank 1 stopped before its call #3: <reason>)". Aborted. `label`: as Who;
// `world_ranks`: a subgroup's (ReadWorldRanks), naming the peer "rank 1
// (world 3)" ("(world ?)" when not read); empty in the world group.
absl::Status PeerGoneError(absl::string_view op, int rank, int size, int64_t call,
                           const GonePeer& peer, absl::string_view label = "",
                           const std::vector<int>& world_ranks = {});

}  // namespace nccl
}  // namespace dist

#endif  // DIST_NCCL_RENDEZVOUS_H_
