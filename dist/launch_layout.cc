// CheckLaunchLayout (launch_layout.h): the nodes' layouts through the store.
#include "dist/launch_layout.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "dist/host_name.h"
#include "dist/proc_stat.h"

namespace dist::internal {
namespace {

// "ranks 0-3 run 4 per node in a world of 8" (one node's layout).
std::string Node(int first, int count, int world) {
  const std::string ranks = count == 1 ? absl::StrCat("rank ", first)
                                       : absl::StrCat("ranks ", first, "-", first + count - 1);
  return absl::StrCat(ranks, " run", count == 1 ? "s " : " ", count, " per node in a world of ",
                      world);
}

std::string Key(const std::string& prefix, int first) {
  return absl::StrCat(prefix, "/layout/first", first);
}
std::string MismatchKey(const std::string& prefix) {
  return absl::StrCat(prefix, "/layout/mismatch");
}

// How every "launched differently" message ends.
constexpr char kSameLaunch[] =
    ". Every node's launch must give the same --nnodes and --nproc_per_node";

// Parses a node's layout, "<world size>,<ranks on the node>": false when it
// is not one (a key of another program).
bool ParseNode(const std::string& value, int* world, int* count) {
  const std::vector<std::string> parts = absl::StrSplit(value, ',');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], world) &&
         absl::SimpleAtoi(parts[1], count) && *count >= 1;
}

// The verdict of `who`, which found the nodes launched differently, as every
// rank reports it: written once under the mismatch key (another rank may
// have written its own first, which the others then report).
absl::Status LaunchedDifferently(LayoutStore& store, const std::string& prefix,
                                 const std::string& message) {
  try {
    if (!store.Present(MismatchKey(prefix))) store.Set(MismatchKey(prefix), message);
  } catch (const std::exception&) {  // another rank wrote it first
  }
  return absl::InvalidArgumentError(absl::StrCat("[rendezvous] ", message));
}

// A key under the layout's prefix that holds no layout.
absl::Status NotALayout(const std::string& prefix, const std::string& key,
                        const std::string& who) {
  return absl::InvalidArgumentError(
      absl::StrCat("[rendezvous] ", who, ": the store holds no launch layout at ", key,
                   " (a key of another program under prefix \"", prefix, "\")"));
}

// CheckNoLayoutMismatch's checks. `scan_node`: also for a node that starts
// inside this rank's, which the walk steps over (a process whose claim of a
// rank failed still publishes its node's layout): its verdict is written for
// the others. (While the walk waits, only a node's local rank 0 looks, each
// poll: the other ranks of the node see its verdict.)
absl::Status CheckVerdicts(LayoutStore& store, const std::string& prefix, const LaunchLayout& me,
                           const std::string& who, bool scan_node) {
  if (me.local_world_size <= 0) return absl::OkStatus();
  try {
    if (store.Present(MismatchKey(prefix))) {  // another rank's verdict
      return absl::InvalidArgumentError(
          absl::StrCat("[rendezvous] ", who, ": ", store.Get(MismatchKey(prefix))));
    }
    if (store.Present(Key(prefix, me.size))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "[rendezvous] ", who, ": the nodes were launched differently: a node starts at rank ",
          me.size, ", this rank's world size", kSameLaunch));
    }
    const int first = me.rank - me.local_rank;
    for (int f = first + 1; scan_node && f < first + me.local_world_size; ++f) {
      if (!store.Present(Key(prefix, f))) continue;
      int world = 0, count = 0;
      if (!ParseNode(store.Get(Key(prefix, f)), &world, &count)) {
        return NotALayout(prefix, Key(prefix, f), who);
      }
      return LaunchedDifferently(
          store, prefix,
          absl::StrCat(who, " found the nodes launched differently: ", Node(f, count, world),
                       ", inside the node where ", Node(first, me.local_world_size, me.size),
                       kSameLaunch));
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[rendezvous] ", who,
                                               ": reading the nodes' launch layout: ", e.what()));
  }
}

// This process, for the claim's value: "host <name> pid <pid>".
std::string ThisProcess() {
  const std::string name = HostName();
  return absl::StrCat("host ", name.empty() ? "?" : name, " pid ", ::getpid());
}

// For a claim's holder ("host <name> pid <pid>") of this host whose process
// has exited: "; pid P on this host has exited: an earlier run of this
// prefix left them (rm -r <where> ...)"; else "".
std::string StaleHolderNote(const std::string& holder, const std::string& where) {
  const std::string name = HostName();
  if (name.empty()) return "";
  absl::string_view rest = holder;
  int64_t pid = 0;
  if (!absl::ConsumePrefix(&rest, absl::StrCat("host ", name, " pid ")) ||
      !absl::SimpleAtoi(rest, &pid) || pid <= 0 || pid > INT_MAX) {
    return "";
  }
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return "";
  return absl::StrCat("; pid ", pid, " on this host has exited: an earlier run of this prefix "
                      "left them",
                      where.empty() ? " (remove them from the store, when no run uses it)"
                                    : absl::StrCat(" (rm -r ", where, " removes them)"));
}

}  // namespace

std::string FailureKey(const std::string& prefix) {
  return absl::StrCat(prefix, "/failed_before_joining");
}

absl::StatusOr<bool> AnnounceFailure(LayoutStore& store, const std::string& prefix, int rank,
                                     int size, const std::string& why) {
  try {
    if (store.Present(absl::StrCat(prefix, "/joined/", rank))) return false;
    // The rank's own key, then the mark the waits look for: ranks that fail
    // at once (a node's, on one missing file) each write a key of their own.
    store.Set(absl::StrCat(FailureKey(prefix), "/", rank),
              absl::StrCat(absl::ToUnixMillis(absl::Now()), " rank ", rank, " (", ThisProcess(),
                           ") failed before joining: ", why));
    store.SetIfAbsent(FailureKey(prefix), "1");  // Gloo's stores refuse to set a key twice
    return true;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[rendezvous] rank ", rank, " of ", size,
                                               ": telling the others of its failure: ", e.what()));
  }
}

absl::Status CheckPeerFailure(LayoutStore& store, const std::string& prefix, int size,
                              const std::string& who) {
  if (!store.Present(FailureKey(prefix))) return absl::OkStatus();
  std::string said = "a rank failed before joining (the store names none)";
  for (int r = 0; r < size; ++r) {  // the lowest rank that said why
    const std::string key = absl::StrCat(FailureKey(prefix), "/", r);
    if (store.Present(key)) {
      said = store.Get(key);
      break;
    }
  }
  // "<unix ms> <what>": said before this process started (more than 5 s
  // before: the nodes' launches and clocks differ by a little), it may be an
  // earlier run's, left under the same prefix.
  int64_t millis = 0;
  std::string note;
  if (const size_t space = said.find(' ');
      space != std::string::npos && absl::SimpleAtoi(said.substr(0, space), &millis)) {
    said.erase(0, space + 1);
    const std::optional<absl::Time> started = ProcessStartTime(0);
    const absl::Time at = absl::FromUnixMillis(millis);
    if (started && at < *started - absl::Seconds(5)) {
      note = absl::StrFormat(
          "; said %.0f s before this process started: if an earlier run left it under the "
          "prefix \"%s\", give each run its own --rdzv_id (RUN_ID)",
          absl::ToDoubleSeconds(*started - at), prefix);
    }
  }
  return absl::AbortedError(absl::StrCat("[rendezvous] ", who, ": ", said, note));
}

absl::Status ClaimRank(LayoutStore& store, const std::string& prefix, int rank,
                       const std::string& who) {
  const std::string key = absl::StrCat(prefix, "/joined/", rank);
  std::string holder;
  try {
    if (store.SetIfAbsent(key, ThisProcess())) return absl::OkStatus();
    // The winner of a race may not have written its value yet.
    holder = store.Present(key) ? store.Get(key) : "another process";
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("[rendezvous] ", who, ": claiming rank ", rank, " in the store: ", e.what()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "[rendezvous] ", who, ": the store already holds rank ", rank, "'s keys under prefix \"",
      prefix, "\" (", holder, " joined as rank ", rank,
      "): a group of an earlier run, or another process started as this rank, used it, and its "
      "keys would be read as this group's", StaleHolderNote(holder, store.Where()),
      ". Give each run a prefix of its own (//tools:launch --rdzv_id, torchrun's --rdzv-id, "
      "the engine's prefix option) or a fresh rendezvous directory"));
}

absl::Status ClaimAndCheckLayout(LayoutStore& store, const std::string& prefix,
                                 const LaunchLayout& me, absl::Time deadline,
                                 const std::string& who) {
  const absl::Status claim = ClaimRank(store, prefix, me.rank, who);
  if (claim.ok()) return CheckLaunchLayout(store, prefix, me, deadline, who);
  if (absl::IsUnavailable(claim)) return claim;
  const absl::Status layout = CheckLaunchLayout(store, prefix, me, absl::Now(), who);
  if (layout.ok() || absl::IsDeadlineExceeded(layout)) return claim;
  return absl::FailedPreconditionError(absl::StrCat(
      claim.message(), " (and the launch layout check failed: ", layout.message(), ")"));
}

void DistLayoutStore::Set(const std::string& key, const std::string& value) {
  const absl::Status s = store_.Set(key, value);
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

bool DistLayoutStore::SetIfAbsent(const std::string& key, const std::string& value) {
  // dist::Store's Set overwrites; its Add is atomic: the first adder wins.
  const absl::StatusOr<int64_t> n = store_.Add(absl::StrCat(key, "/claims"), 1);
  if (!n.ok()) throw std::runtime_error(n.status().ToString());
  if (*n != 1) return false;
  Set(key, value);
  return true;
}

std::string DistLayoutStore::Get(const std::string& key) {
  absl::StatusOr<std::string> v = store_.Get(key);
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return *std::move(v);
}

bool DistLayoutStore::Present(const std::string& key) {
  absl::StatusOr<bool> set = store_.Check({key});
  if (!set.ok()) throw std::runtime_error(set.status().ToString());
  return *set;
}

absl::Status CheckNoLayoutMismatch(LayoutStore& store, const std::string& prefix,
                                   const LaunchLayout& me, const std::string& who) {
  return CheckVerdicts(store, prefix, me, who, /*scan_node=*/true);
}

absl::Status CheckLaunchLayout(LayoutStore& store, const std::string& prefix,
                               const LaunchLayout& me, absl::Time deadline,
                               const std::string& who) {
  if (me.local_world_size <= 0) return absl::OkStatus();
  auto key = [&](int first) { return Key(prefix, first); };
  const int first = me.rank - me.local_rank;  // this rank's node
  const std::string mine = absl::StrCat(me.size, ",", me.local_world_size);
  try {
    // (Set already: an earlier run's key, which the walk reads as any.)
    if (me.local_rank == 0 && !store.Present(key(first))) store.Set(key(first), mine);
    std::vector<std::string> nodes;  // the walk so far
    bool differ = false;
    int r = 0;
    while (r < me.size && !differ) {
      // Node r's layout, or another rank's verdict or failure, by the deadline.
      while (!store.Present(key(r))) {
        if (absl::Status failed = CheckPeerFailure(store, prefix, me.size, who); !failed.ok()) {
          return failed;
        }
        if (absl::Status found = CheckVerdicts(store, prefix, me, who, me.local_rank == 0);
            !found.ok()) {
          return found;
        }
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "[rendezvous] ", who, ": the node whose first rank is ", r,
              " did not arrive in time (its launcher has not started its local rank 0, or uses "
              "another rendezvous endpoint or id)",
              nodes.empty() ? "" : absl::StrCat("; so far ", absl::StrJoin(nodes, ", "))));
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
      int world = 0, count = 0;
      if (!ParseNode(store.Get(key(r)), &world, &count)) return NotALayout(prefix, key(r), who);
      nodes.push_back(Node(r, count, world));
      // A different world, or a node that steps over this rank's.
      differ = world != me.size || (r < first && r + count > first);
      r += count;
    }
    if (!differ && r == me.size) return CheckNoLayoutMismatch(store, prefix, me, who);
    return LaunchedDifferently(
        store, prefix,
        absl::StrCat(who, " found the nodes launched differently: ", absl::StrJoin(nodes, ", "),
                     "; this rank's node: ", Node(first, me.local_world_size, me.size),
                     kSameLaunch));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[rendezvous] ", who,
                                               ": reading the nodes' launch layout: ", e.what()));
  }
}

}  // namespace dist::internal
