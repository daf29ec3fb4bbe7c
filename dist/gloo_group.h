// The `gloo` engine: ranks as processes (on one host or several), CPU
// collectives over Gloo's TCP transport.
//
// Ranks rendezvous through a key-value store: Gloo's FileStore on a directory
// every rank can reach (a shared filesystem, or a temp dir on one host), or a
// Redis server ("redis://host:port", Gloo's RedisStore). Each rank then opens a
// TCP connection to every other rank (full mesh) from `hostname`/`iface`.
//
// Each group has a communication worker thread that runs the rank's calls in
// issue order (collectives are asynchronous, as with the threads engine).
// Before its data moves, every call exchanges a small descriptor (op, dtype,
// sizes, root, validity) with all ranks, so calls that do not match, or that
// are invalid on some rank, fail on every rank with a message naming the ranks
// and what each called (the group stays usable).
//
// Dtypes: f32, i32, i64, u8 are reduced natively by Gloo (with this engine's
// reduction functions: max/min propagate NaN); f16 and bf16 are staged
// through f32 (reduced in f32, rounded once). Reduce-scatter is an all-reduce
// of a copy of the input followed by a copy of this rank's chunk (Gloo has no
// generic reduce-scatter for custom types): it moves the whole input, about
// twice the bytes of a true reduce-scatter.
//
// SIGPIPE: joining a group ignores it (unless the program handles it), so a
// write to a peer that exited fails the call instead of killing the process.
//
// Timeouts: every call runs with its timeout (descriptor exchange + data);
// when it expires, or when a peer's connection breaks (process exited), the
// call fails ("[all_reduce] rank 1 of 2 timed out after 2.0 s waiting for
// ranks 0 ...", DeadlineExceeded, or Aborted for a lost peer) and the group is
// unusable: every later call fails at once with that error.
//
// Split/NewSubgroup build a new Gloo context over a PrefixStore of the same
// store (keys "<prefix>/split<n>/color<c>/...").
#ifndef DIST_GLOO_GROUP_H_
#define DIST_GLOO_GROUP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist/process_group.h"

namespace dist {

struct GlooGroupOptions {
  // "redis://host:port", or a directory (optionally "file://<dir>") for
  // Gloo's FileStore; the directory is created if missing. Use a fresh
  // directory (or `prefix`) per run: an earlier run's keys would confuse the
  // rendezvous, so a rank whose place under the prefix an earlier group
  // claimed (the ranks that group had) fails at once (FailedPrecondition,
  // launch_layout.h).
  std::string store;
  // Namespaces the keys in the store (e.g. a run id).
  std::string prefix = "gloo";
  // The address this rank listens on and announces: hostname or IP. Empty
  // with `iface` set: that interface's address.
  std::string hostname = "127.0.0.1";
  std::string iface;
  // The timeout of the rendezvous and of calls without their own.
  absl::Duration timeout = DefaultCollectiveTimeout();
  // This rank's place on its node as the launcher said (LOCAL_RANK,
  // LOCAL_WORLD_SIZE; 0: not known). When known, the nodes' layouts are
  // compared before connecting (dist/launch_layout.h): nodes launched with
  // different --nnodes or --nproc_per_node fail at once naming the
  // disagreement, not at the timeout naming keys.
  int local_rank = 0;
  int local_world_size = 0;
  // The store is a folder of this run's alone (the train binaries' default
  // one): a claim an exited process left there is said with the `rm -r`
  // that clears it.
  bool run_folder = false;
};

// Joins the group of `size` ranks as rank `rank`. Blocks until every rank has
// joined (or options.timeout passes: DeadlineExceeded / Unavailable naming
// this rank and the store).
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateGlooProcessGroup(
    int rank, int size, const GlooGroupOptions& options);

// For rank `rank` of `size` that failed before it joined
// (CreateGlooProcessGroup was never reached: a flag's value, its data, its
// device): says so in the store `options` name (the folder made if
// missing), so that the ranks waiting for it in their rendezvous fail at
// once, naming it and `why`, instead of at their timeout
// (dist/launch_layout.h). Returns whether it was said: false when this rank
// joined (its peers learn of its failure from the group). Errors name the
// store.
absl::StatusOr<bool> AnnounceGlooFailure(int rank, int size, const GlooGroupOptions& options,
                                         const std::string& why);

// For a gloo group over a folder store, once no rank will use the store
// again (after a barrier of a run that ended well): removes the key files
// this process wrote into it (its groups and those split from them share
// one store), so that when every rank does, a shared folder keeps nothing of
// the run (as torch's FileStore removes its file when the last user closes
// it). Returns how many were removed; 0 for a Redis store or a group of
// another engine. InternalError naming the first file that could not be
// removed (the others are removed all the same).
absl::StatusOr<int> RemoveOwnFolderStoreKeys(ProcessGroup& group);

}  // namespace dist

#endif  // DIST_GLOO_GROUP_H_
