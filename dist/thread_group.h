// The `threads` engine: N ranks as threads of one process over shared memory.
//
// A ThreadWorld (owned by the caller; there is no global state) holds one
// ProcessGroup handle and one MemoryLedger per rank. Collectives rendezvous
// through state shared by the handles of a group: each rank publishes its
// buffer pointers, then every rank does its share of the work directly on the
// peers' buffers (all_reduce and reduce_scatter: rank r reduces chunk r of
// every input; all_gather: rank r reads every peer's input) — in parallel
// across ranks and with no intermediate copies. Waiting is a mutex/condvar
// barrier with the call's timeout.
//
// Tensors in CUDA memory (ranks sharing one GPU, FSDP over device memory) are
// staged through host buffers: correct, ordered after the kernels queued
// before the call, and slow (two PCIe copies per call); the nccl engine is
// the fast path on GPUs.
//
// Each handle has a communication worker thread that runs the rank's calls in
// order, so compute overlaps communication (as a CUDA stream would). The
// worker charges the rank's ledger under kCommunication for the buffers it
// allocates (staging copies of non-contiguous tensors).
//
// A peer whose thread has finished (RunRanks, or MarkRankFinished) or whose
// handle was destroyed makes the calls waiting for it fail at once with
// kAborted ("peer left") instead of waiting for the timeout.
//
// Typical use:
//   absl::Status s = dist::RunRanks(4, [](int rank, dist::ProcessGroup& pg) {
//     tensor::Tensor x = ...;
//     return pg.AllReduceSync(x);
//   });
#ifndef DIST_THREAD_GROUP_H_
#define DIST_THREAD_GROUP_H_

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dist/process_group.h"
#include "tensor/memory_ledger.h"

namespace dist {

namespace internal {
struct WorldState;
class ThreadProcessGroup;
}  // namespace internal

struct ThreadWorldOptions {
  // The timeout of every rank's world group (and of the groups split from it).
  absl::Duration timeout = DefaultCollectiveTimeout();
};

class ThreadWorld {
 public:
  explicit ThreadWorld(int size, ThreadWorldOptions options = {});
  // Finishes the calls still queued on the world handles (peers that are gone
  // make them fail fast). Groups split from the world must be destroyed
  // before it (CHECKed: their workers charge its ledgers). Tensors allocated by the ranks should be
  // freed first: a ledger that still holds bytes is kept alive (leaked, with a warning) so that
  // freeing those tensors later stays safe.
  ~ThreadWorld();
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return size_; }
  // Rank `rank`'s handle of the world group. Issue its calls from one thread
  // at a time (normally the rank's own thread).
  ProcessGroup& group(int rank);
  // Rank `rank`'s memory ledger: its thread (under RunRanks) and its
  // communication workers charge it.
  tensor::MemoryLedger& ledger(int rank);

  // Declares that rank `rank`'s thread is done (its function returned
  // `status`): once its queued calls have run, peers waiting for it in a
  // collective fail at once. RunRanks calls this; call it when driving the
  // ranks with threads of your own.
  void MarkRankFinished(int rank, const absl::Status& status);
  // Clears the finished marks (RunRanks does this when it starts).
  void ResetFinished();
  // Blocks until every world handle has run all the calls queued on it.
  void WaitIdle();

 private:
  const int size_;
  std::shared_ptr<internal::WorldState> state_;
  std::vector<std::unique_ptr<tensor::MemoryLedger>> ledgers_;
  std::vector<std::unique_ptr<internal::ThreadProcessGroup>> groups_;
};

// fn(rank, group) -> absl::Status, as RunRanks calls it.
using RankFn = std::function<absl::Status(int rank, ProcessGroup& group)>;

namespace internal {
absl::Status RunRanksImpl(ThreadWorld& world, const RankFn& fn);

template <typename Fn>
RankFn ToRankFn(Fn fn) {
  return [fn = std::move(fn)](int rank, ProcessGroup& group) -> absl::Status {
    if constexpr (std::is_void_v<std::invoke_result_t<const Fn&, int, ProcessGroup&>>) {
      fn(rank, group);
      return absl::OkStatus();
    } else {
      return fn(rank, group);
    }
  };
}
}  // namespace internal

// Runs fn(rank, world.group(rank)) on world.size() threads at once, each
// charging world.ledger(rank), and joins them (and the calls they left
// queued). fn returns absl::Status or void (gtest ASSERTs work inside);
// exceptions are caught. Returns OK, or the first rank's error as
// "rank 2: <message>" (with its code), followed by the other failed ranks'.
// fn is called concurrently, so it must be safe to call from many threads.
template <typename Fn>
absl::Status RunRanks(ThreadWorld& world, Fn&& fn) {
  return internal::RunRanksImpl(world, internal::ToRankFn(std::forward<Fn>(fn)));
}

// The same over a fresh ThreadWorld of `size` ranks (destroyed on return).
template <typename Fn>
absl::Status RunRanks(int size, Fn&& fn, ThreadWorldOptions options = {}) {
  ThreadWorld world(size, options);
  return RunRanks(world, std::forward<Fn>(fn));
}

}  // namespace dist

#endif  // DIST_THREAD_GROUP_H_
