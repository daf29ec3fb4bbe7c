// The store side of the `nccl` engine: unique id exchange, arrival marks,
// progress reports and the messages that name missing ranks.
#include "dist/nccl_rendezvous.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dist/launch_layout.h"
#include "dist/rank_names.h"

namespace dist {
namespace nccl {
namespace {

// "ranks 2, 3"; with `world_ranks` (by rank) " (world 6, ?)" after them.
std::string NameRanks(const std::vector<int>& ranks, const std::vector<int>& world_ranks = {}) {
  return internal::NameRanks(ranks, world_ranks);
}

std::string InitDir(absl::string_view prefix) { return absl::StrCat(prefix, "/init"); }
std::string SeqDir(absl::string_view prefix) { return absl::StrCat(prefix, "/seq"); }
std::string GoneDir(absl::string_view prefix) { return absl::StrCat(prefix, "/gone"); }
std::string GoneCountKey(absl::string_view prefix) { return absl::StrCat(prefix, "/gone_count"); }

// What PeerGoneError says of the peer, and how FindGonePeer tells a
// departure caused by another's from one on its own.
constexpr absl::string_view kNeverMakes = " will never make this call";

bool IsHex(absl::string_view text) {
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::Status PeerFailure(internal::LayoutStore& store, absl::string_view prefix, int size,
                         const std::string& who) {
  try {
    return internal::CheckPeerFailure(store, std::string(prefix), size, who);
  } catch (const std::exception&) {
    return absl::OkStatus();  // the wait's own reads report the store's errors
  }
}

absl::StatusOr<bool> AnnounceFailure(Store& store, absl::string_view prefix, int rank, int size,
                                     const std::string& why) {
  internal::DistLayoutStore layout(store);
  return internal::AnnounceFailure(layout, std::string(prefix), rank, size, why);
}

std::string Who(int rank, int size, absl::string_view label) {
  return internal::GroupWho(rank, size, label);
}

std::string UniqueIdKey(absl::string_view prefix) { return absl::StrCat(prefix, "/unique_id"); }

std::string RankKey(absl::string_view dir, int rank) { return absl::StrCat(dir, "/", rank); }

absl::StatusOr<std::string> ExchangeUniqueId(
    Store& store, absl::string_view prefix, int rank, int size, size_t id_bytes,
    absl::FunctionRef<absl::StatusOr<std::string>()> create, absl::Duration timeout) {
  const std::string key = UniqueIdKey(prefix);
  const std::string head = absl::StrCat("[nccl_init] ", Who(rank, size));
  if (rank == 0) {
    absl::StatusOr<std::string> id = create();
    if (!id.ok()) {
      return absl::Status(id.status().code(), absl::StrCat(head,
                                                           ": could not create the NCCL "
                                                           "unique id: ",
                                                           id.status().message()));
    }
    if (id->size() != id_bytes) {
      return absl::InternalError(absl::StrCat(head, ": the NCCL unique id has ", id->size(),
                                              " bytes, expected ", id_bytes));
    }
    if (absl::Status s = store.Set(key, absl::BytesToHexString(*id)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(head,
                                                 ": could not publish the NCCL unique id "
                                                 "at key ",
                                                 key, ": ", s.message()));
    }
    return id;
  }
  // Waited for in slices: a rank's announced failure (launch_layout.h) ends
  // the wait at once. (Under a launcher the layout walk sees rank 0's
  // failure first: this is for groups made without the layout check.)
  internal::DistLayoutStore layout(store);
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::string> hex;
  while (true) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    hex = store.Get(key, std::min(left, absl::Milliseconds(50)));
    if (hex.ok() || !absl::IsDeadlineExceeded(hex.status()) || left == absl::ZeroDuration()) {
      break;
    }
    if (absl::Status failed = PeerFailure(layout, prefix, size, Who(rank, size));
        !failed.ok()) {
      return failed;
    }
  }
  if (!hex.ok()) {
    if (absl::IsDeadlineExceeded(hex.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          head, " timed out after ", internal::FormatSeconds(timeout),
          " waiting for rank 0 (no NCCL unique id at key ", key,
          " in the store: rank 0 has not started, failed, or uses another store or prefix)"));
    }
    return absl::Status(hex.status().code(),
                        absl::StrCat(head, ": could not read the NCCL unique id at key ", key, ": ",
                                     hex.status().message()));
  }
  if (hex->size() != 2 * id_bytes || !IsHex(*hex)) {
    return absl::InvalidArgumentError(absl::StrCat(
        head, ": key ", key, " holds ", hex->size(), " characters, not the ", 2 * id_bytes,
        " hex digits of a NCCL unique id (a stale or foreign key? use a fresh prefix per run)"));
  }
  return absl::HexStringToBytes(*hex);
}

absl::Status PublishCount(Store& store, absl::string_view dir, int rank, int64_t count) {
  return store.Set(RankKey(dir, rank), absl::StrCat(count));
}

absl::Status PublishIssued(Store& store, absl::string_view prefix, int rank, int64_t issued) {
  return PublishCount(store, SeqDir(prefix), rank, issued);
}

RankCounts ReadCounts(Store& store, absl::string_view dir, int size, absl::Duration wait) {
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(RankKey(dir, r));
  // Waits for all; on a timeout the keys that are there are read below.
  store.Wait(keys, wait).IgnoreError();
  RankCounts counts(size);
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> value = store.Get(keys[r], absl::ZeroDuration());
    int64_t count = 0;
    if (value.ok() && absl::SimpleAtoi(*value, &count)) counts[r] = count;
  }
  return counts;
}

std::vector<int> MissingRanks(const RankCounts& counts, int64_t needed, int rank) {
  std::vector<int> missing;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    if (r == rank) continue;
    if (!counts[r].has_value() || *counts[r] < needed) missing.push_back(r);
  }
  return missing;
}

absl::Status MarkInitArrival(Store& store, absl::string_view prefix, int rank) {
  return PublishCount(store, InitDir(prefix), rank, 1);
}

absl::Status InitTimeoutError(Store& store, absl::string_view prefix, int rank, int size,
                              absl::Duration timeout, absl::string_view detail) {
  const RankCounts arrived = ReadCounts(store, InitDir(prefix), size, absl::ZeroDuration());
  const std::vector<int> missing = MissingRanks(arrived, 1, rank);
  std::string message = absl::StrCat("[nccl_init] ", Who(rank, size), " timed out after ",
                                     internal::FormatSeconds(timeout), " waiting for ");
  if (missing.empty()) {
    absl::StrAppend(&message, "the communicator to connect (every rank reached communicator init",
                    " under prefix \"", prefix, "\": the ranks cannot reach each other)");
  } else {
    absl::StrAppend(&message, NameRanks(missing), " (",
                    missing.size() == 1 ? "it never reached" : "they never reached",
                    " communicator init under prefix \"", prefix,
                    "\": exited, hung earlier, or use another store, prefix or world size)");
  }
  if (!detail.empty()) absl::StrAppend(&message, "; ", detail);
  return absl::DeadlineExceededError(message);
}

ProgressReport ReportProgress(Store* store, absl::string_view prefix, int rank, int size,
                              int64_t call, int64_t issued, absl::Duration wait) {
  ProgressReport report;
  report.counts.assign(size, std::nullopt);
  report.counts[rank] = issued;
  if (store == nullptr) {
    for (int r = 0; r < size; ++r) {
      if (r != rank) report.missing.push_back(r);
    }
    report.have_store = false;
    return report;
  }
  const std::string dir = SeqDir(prefix);
  report.publish_error = PublishCount(*store, dir, rank, issued);
  report.counts = ReadCounts(*store, dir, size, wait);
  report.counts[rank] = issued;
  report.missing = MissingRanks(report.counts, call + 1, rank);
  return report;
}

std::string WorldRankKey(absl::string_view prefix, int rank) {
  return absl::StrCat(prefix, "/world/", rank);
}

std::vector<int> ReadWorldRanks(Store& store, absl::string_view prefix, int size,
                                const std::vector<int>& ranks, absl::Duration wait) {
  std::vector<int> world(size, -1);
  std::vector<std::string> keys;
  for (int r : ranks) {
    if (r >= 0 && r < size) keys.push_back(WorldRankKey(prefix, r));
  }
  // Waits for all at once; on a timeout the keys that are there are read.
  store.Wait(keys, wait).IgnoreError();
  for (int r : ranks) {
    if (r < 0 || r >= size) continue;
    absl::StatusOr<std::string> value = store.Get(WorldRankKey(prefix, r), absl::ZeroDuration());
    int w = -1;
    if (value.ok() && absl::SimpleAtoi(*value, &w) && w >= 0) world[r] = w;
  }
  return world;
}

absl::Status CallTimeoutError(absl::string_view op, int rank, int size, absl::Duration timeout,
                              int64_t call, const ProgressReport& report, absl::Duration wait,
                              absl::string_view label) {
  std::string message = absl::StrCat("[", op, "] ", Who(rank, size, label), " timed out after ",
                                     internal::FormatSeconds(timeout), " waiting for ");
  if (report.missing.empty() && size == 1) {
    absl::StrAppend(&message, "the call to finish (call #", call,
                    ": the device never finished it)");
  } else if (report.missing.empty()) {
    absl::StrAppend(&message, "the call to finish (call #", call,
                    "; every rank had issued it: a peer may have aborted the group, or the "
                    "transport is stuck)");
  } else if (!report.have_store) {
    absl::StrAppend(&message, NameRanks(report.missing, report.world_ranks), " (call #", call,
                    " of this rank; no store to learn which of them had not issued it)");
  } else {
    std::vector<std::string> why;
    std::vector<int> silent;
    for (int r : report.missing) {
      if (report.counts.size() > static_cast<size_t>(r) && report.counts[r].has_value()) {
        const int64_t n = *report.counts[r];
        why.push_back(absl::StrCat("rank ", r, " had issued ", n, n == 1 ? " call" : " calls"));
      } else {
        silent.push_back(r);
      }
    }
    if (!silent.empty()) {
      why.push_back(absl::StrCat(NameRanks(silent), " sent no report within ",
                                 internal::FormatSeconds(wait),
                                 ": exited, hung, or busy outside this group"));
    }
    absl::StrAppend(&message, NameRanks(report.missing, report.world_ranks), " (call #", call,
                    " of this rank; ", absl::StrJoin(why, "; "), ")");
  }
  if (!report.publish_error.ok()) {
    absl::StrAppend(
        &message, " [could not report this rank's progress: ", report.publish_error.message(), "]");
  }
  return absl::DeadlineExceededError(message);
}

absl::Status PublishGone(Store& store, absl::string_view prefix, int rank, int64_t first_unrun,
                         absl::string_view reason) {
  // "<first_unrun> <reason>": the number first, the reason may hold anything.
  absl::Status s =
      store.Set(RankKey(GoneDir(prefix), rank), absl::StrCat(first_unrun, " ", reason));
  if (!s.ok()) return s;
  return store.Add(GoneCountKey(prefix), 1).status();
}

std::optional<GonePeer> FindGonePeer(Store& store, absl::string_view prefix, int rank, int size,
                                     int64_t call, GoneCache& cache) {
  // Read, not Add(key, 0), which writes (a file store rewrites the file).
  const std::string count_key = GoneCountKey(prefix);
  int64_t count = 0;
  absl::StatusOr<std::string> text = store.Get(count_key, absl::ZeroDuration());
  if (!text.ok() || !absl::SimpleAtoi(*text, &count)) count = 0;
  if (count > cache.count_seen) {
    const std::string dir = GoneDir(prefix);
    std::vector<GonePeer> peers;
    bool complete = true;  // every departure counted was read
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::string key = RankKey(dir, r);
      absl::StatusOr<bool> there = store.Check({key});
      if (!there.ok()) complete = false;
      if (!there.ok() || !*there) continue;
      absl::StatusOr<std::string> value = store.Get(key, absl::ZeroDuration());
      const std::pair<absl::string_view, absl::string_view> parts =
          value.ok() ? absl::StrSplit(*value, absl::MaxSplits(' ', 1))
                     : std::pair<absl::string_view, absl::string_view>();
      GonePeer peer;
      peer.rank = r;
      if (!value.ok() || !absl::SimpleAtoi(parts.first, &peer.first_unrun)) {
        complete = false;  // read again at the next check
        continue;
      }
      peer.reason = std::string(parts.second);
      peers.push_back(std::move(peer));
    }
    // Peers read before and not now (a failed read) stay known.
    for (const GonePeer& known : cache.peers) {
      const bool read = std::any_of(peers.begin(), peers.end(),
                                    [&](const GonePeer& p) { return p.rank == known.rank; });
      if (!read) peers.push_back(known);
    }
    cache.peers = std::move(peers);
    if (complete) cache.count_seen = count;
  }
  // The peer that stopped on its own rather than because another had gone
  // (whose reason is such a message itself), then the lowest rank.
  auto cascade = [](const GonePeer& p) { return absl::StrContains(p.reason, kNeverMakes); };
  std::optional<GonePeer> found;
  for (const GonePeer& peer : cache.peers) {
    if (peer.first_unrun > call) continue;
    if (!found.has_value() ||
        std::make_pair(cascade(peer), peer.rank) < std::make_pair(cascade(*found), found->rank)) {
      found = peer;
    }
  }
  return found;
}

absl::Status PeerGoneError(absl::string_view op, int rank, int size, int64_t call,
                           const GonePeer& peer, absl::string_view label,
                           const std::vector<int>& world_ranks) {
  return absl::AbortedError(absl::StrCat(
      "[", op, "] ", Who(rank, size, label), ": ", NameRanks({peer.rank}, world_ranks),
      kNeverMakes, " (call #", call,
      " of this rank; rank ", peer.rank, " stopped before its call #", peer.first_unrun, ": ",
      peer.reason, ")"));
}

}  // namespace nccl
}  // namespace dist
