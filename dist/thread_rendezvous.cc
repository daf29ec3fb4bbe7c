// The `threads` engine's rendezvous (thread_rendezvous.h).
#include "dist/thread_rendezvous.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/rank_names.h"
#include "dist/store.h"  // internal::FormatSeconds

namespace dist {
namespace internal {
namespace {

using Clock = std::chrono::steady_clock;

bool SameCall(const Arrival& a, const Arrival& b) {
  if (a.is_split != b.is_split) return false;
  if (a.is_split) return true;
  const CollectiveCall& x = *a.call;
  const CollectiveCall& y = *b.call;
  if (x.kind != y.kind) return false;
  if (x.kind == CollectiveKind::kBarrier) return true;
  if ((x.kind == CollectiveKind::kAllReduce || x.kind == CollectiveKind::kReduceScatter) &&
      x.op != y.op) {
    return false;
  }
  if (x.kind == CollectiveKind::kBroadcast && x.root != y.root) return false;
  if (x.input.dtype() != y.input.dtype() || x.input.numel() != y.input.numel()) return false;
  if (x.output.defined() != y.output.defined()) return false;
  return !x.output.defined() || x.output.numel() == y.output.numel();
}

// DescribeCall's "all_reduce(sum, f32, 10 elements)", or "split(color 1, key 0)".
std::string Describe(const Arrival& a) {
  return a.is_split ? absl::StrCat("split(color ", a.color, ", key ", a.key, ")")
                    : DescribeCall(*a.call);
}

}  // namespace

std::string Rendezvous::Who() const { return internal::GroupWho(rank_, size(), group_->label); }

std::string Rendezvous::NameRanks(const std::vector<int>& ranks) const {
  // The world group's own world ranks go unsaid.
  return internal::NameRanks(ranks, group_->label.empty() ? std::vector<int>{}
                                                          : group_->world_ranks);
}

absl::Status Rendezvous::AbortedError(absl::string_view op) const {
  return absl::Status(
      group_->abort.code(),
      absl::StrCat("[", op, "] ", Who(), ": the group was aborted: ", group_->abort.message()));
}

absl::Status Rendezvous::Arrive(int64_t seq, const Arrival& me, absl::string_view op,
                                absl::Duration timeout, std::vector<const Arrival*>* arrivals) {
  WorldState& world = *group_->world;
  GroupState& g = *group_;
  std::unique_lock<std::mutex> lock(world.mu);
  if (!g.abort.ok()) return AbortedError(op);
  Round& round = g.rounds[seq];
  if (round.arrivals.empty()) round.arrivals.assign(g.size(), nullptr);
  round.arrivals[rank_] = &me;
  ++round.num_arrived;
  world.cv.notify_all();
  // Timeouts beyond a century (and InfiniteDuration) mean: wait forever.
  const bool bounded = timeout < absl::Hours(24 * 365 * 100);
  const Clock::time_point deadline =
      bounded ? Clock::now() + absl::ToChronoNanoseconds(timeout) : Clock::time_point::max();
  while (round.num_arrived < g.size()) {
    if (!g.abort.ok()) return AbortedError(op);
    std::vector<int> missing, gone;
    for (int m = 0; m < g.size(); ++m) {
      if (round.arrivals[m] != nullptr) continue;
      missing.push_back(m);
      const int w = g.world_ranks[m];
      if (g.closed[m] || (world.finished[w] && g.pending[m] == 0)) gone.push_back(m);
    }
    if (!gone.empty()) {
      std::vector<std::string> why;
      for (int m : gone) {
        const int w = g.world_ranks[m];
        if (g.closed[m]) {
          why.push_back(absl::StrCat("rank ", m, " destroyed its handle of the group"));
        } else if (world.finish_status[w].ok()) {
          why.push_back(absl::StrCat("rank ", m, "'s thread finished without making this call"));
        } else {
          why.push_back(absl::StrCat("rank ", m, "'s thread failed (",
                                     world.finish_status[w].ToString(), ")"));
        }
      }
      const std::string reason = absl::StrCat(NameRanks(gone), " will never join ", op, " (call #",
                                              seq, "): ", absl::StrJoin(why, "; "));
      g.abort = absl::AbortedError(absl::StrCat(Who(), " saw that ", reason));
      world.cv.notify_all();
      return absl::AbortedError(absl::StrCat("[", op, "] ", Who(), ": ", reason));
    }
    if (bounded && Clock::now() >= deadline) {
      const std::string waited = absl::StrCat("timed out after ", FormatSeconds(timeout),
                                              " waiting for ", NameRanks(missing));
      g.abort = absl::DeadlineExceededError(
          absl::StrCat(Who(), " ", waited, " in ", op, " (call #", seq, ")"));
      world.cv.notify_all();
      return absl::DeadlineExceededError(absl::StrCat("[", op, "] ", Who(), " ", waited));
    }
    if (bounded) {
      world.cv.wait_until(lock, deadline);
    } else {
      world.cv.wait(lock);
    }
  }
  *arrivals = round.arrivals;
  return absl::OkStatus();
}

absl::Status Rendezvous::CheckArrivals(const std::vector<const Arrival*>& all,
                                       absl::string_view op) const {
  const Arrival& me = *all[rank_];
  if (!me.error.ok()) return me.error;
  for (int r = 0; r < size(); ++r) {
    if (!all[r]->error.ok()) {
      return absl::Status(all[r]->error.code(),
                          absl::StrCat("[", op, "] ", Who(), ": ", NameRanks({r}),
                                       "'s call is invalid: ", all[r]->error.message()));
    }
  }
  bool same = true;
  for (int r = 1; r < size(); ++r) same = same && SameCall(*all[0], *all[r]);
  if (same) return absl::OkStatus();
  std::vector<std::string> calls;
  for (int r = 0; r < size(); ++r)
    calls.push_back(absl::StrCat(NameRanks({r}), ": ", Describe(*all[r])));
  return absl::InvalidArgumentError(absl::StrCat(
      "[", op, "] ", Who(), ": the calls do not match across ranks: ", absl::StrJoin(calls, "; ")));
}

void Rendezvous::Staged(int64_t seq, const std::function<void()>& publish) {
  WorldState& world = *group_->world;
  std::unique_lock<std::mutex> lock(world.mu);
  publish();
  Round& round = group_->rounds[seq];
  ++round.num_staged;
  world.cv.notify_all();
  world.cv.wait(lock, [&] { return round.num_staged == group_->size(); });
}

void Rendezvous::Leave(int64_t seq, const std::function<void(Round&)>& before_leave,
                       const Arrival* mine) {
  WorldState& world = *group_->world;
  std::unique_lock<std::mutex> lock(world.mu);
  Round& round = group_->rounds[seq];
  if (mine != nullptr) {
    if (round.failed.empty()) {
      round.share_done.assign(group_->size(), nullptr);
      round.failed.assign(group_->size(), absl::OkStatus());
    }
    round.share_done[rank_] = mine->done;
    round.failed[rank_] = mine->failed;
  }
  ++round.num_done;
  world.cv.notify_all();
  world.cv.wait(lock, [&] { return round.num_done == group_->size(); });
  if (before_leave) before_leave(round);
  ++round.num_left;
  world.cv.notify_all();
  world.cv.wait(lock, [&] { return round.num_left == group_->size(); });
  if (++round.num_exited == group_->size()) group_->rounds.erase(seq);
}

absl::Status Rendezvous::PeerFailure(absl::string_view op,
                                     absl::FunctionRef<const absl::Status&(int)> failed_of) const {
  for (int r = 0; r < size(); ++r) {
    const absl::Status& failed = failed_of(r);
    if (r != rank_ && !failed.ok()) {
      return absl::Status(failed.code(), absl::StrCat("[", op, "] ", Who(), ": ",
                                                      NameRanks({r}), " failed: ",
                                                      failed.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace dist
