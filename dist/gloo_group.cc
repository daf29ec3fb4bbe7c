// The `gloo` engine (see gloo_group.h): a worker thread per group that runs
// each call as staging (its buffers in Gloo's dtypes), a descriptor exchange
// (Gloo all-gather) and the Gloo collective, with the call's timeout.
#include "dist/gloo_group.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gloo/alltoall.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "dist/gloo_ops.h"
#include "dist/gloo_peers.h"
#include "dist/rank_names.h"
#include "dist/redis_keys.h"
#include "dist/launch_layout.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace {

using internal::gloo_ops::AllGatherBytes;
using internal::gloo_ops::Describe;
using internal::gloo_ops::DescribeRemote;
using internal::gloo_ops::Finish;
using internal::gloo_ops::kDescLen;
using internal::gloo_ops::RunData;
using internal::gloo_ops::SameCall;
using internal::gloo_ops::Stage;
using internal::gloo_ops::Staged;
using tensor::Dtype;
using tensor::Tensor;

// At least 1 ms; at most 30 days, so that an infinite timeout stays one:
// gloo multiplies its timeouts (its pairs wait 5 x the timeout to connect),
// and INT64_MAX ms would wrap to an immediate one.
std::chrono::milliseconds ToMillis(absl::Duration d) {
  constexpr int64_t kMaxMillis = int64_t{30} * 24 * 3600 * 1000;
  return std::chrono::milliseconds(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, kMaxMillis));
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

// The store and device shared by a world group and the groups split from it.
// gloo's FileStore with its check() (whether keys are set, no waiting) public.
class CheckableFileStore final : public gloo::rendezvous::FileStore {
 public:
  using FileStore::check;
  using FileStore::FileStore;
};

struct Shared {
  std::shared_ptr<gloo::rendezvous::Store> root_store;
  // Whether root_store holds a key now, without waiting (gloo's wait counts
  // whole seconds); throws on store errors.
  std::function<bool(const std::string& key)> present;
  std::shared_ptr<gloo::transport::Device> device;
  std::string where;  // The store, for messages.
};

// The shared store as the launch layout check's (launch_layout.h).
class GlooLayoutStore final : public internal::LayoutStore {
 public:
  // `run_folder`: the store's folder when it is this run's alone, else "".
  GlooLayoutStore(const Shared& shared, std::string run_folder)
      : shared_(shared), run_folder_(std::move(run_folder)) {}
  void Set(const std::string& key, const std::string& value) override {
    shared_.root_store->set(key, std::vector<char>(value.begin(), value.end()));
  }
  std::string Get(const std::string& key) override {
    const std::vector<char> value = shared_.root_store->get(key);
    return std::string(value.begin(), value.end());
  }
  bool SetIfAbsent(const std::string& key, const std::string& value) override {
    if (Present(key)) return false;
    try {
      Set(key, value);  // Redis: SETNX; the FileStore: refuses a file that exists
      return true;
    } catch (const std::exception&) {
      if (Present(key)) return false;  // set meanwhile
      throw;
    }
  }
  bool Present(const std::string& key) override { return shared_.present(key); }
  std::string Where() const override { return run_folder_; }

 private:
  const Shared& shared_;
  const std::string run_folder_;
};

// Thrown by TimedStore's waits when a rank announced that it failed before
// joining (launch_layout.h): `status` is the Aborted error naming it.
struct PeerFailed : std::runtime_error {
  explicit PeerFailed(absl::Status s) : std::runtime_error(s.ToString()), status(std::move(s)) {}
  absl::Status status;
};

// A store whose reads wait the group's timeout: gloo's connectFullMesh reads
// each lower rank's address with Store::get, which its FileStore bounds by
// its own 30 s default (a rank that came up later than that failed the
// rendezvous early, whatever --timeout_s said; a shorter timeout was not
// honoured there either). Its waits poll (every 20 ms, as the layout walk),
// and end at once when `peer_failure` (when given) says a rank announced its
// failure (internal::CheckPeerFailure's Aborted, thrown as PeerFailed). At the
// deadline gloo's own wait gives its timeout error (gloo's stores count
// whole seconds: up to a second later, as before).
// It keeps what it set (Given): connectFullMesh sets "<prefix>/<rank>" to
// this rank's addresses, one for each peer, where it listened for that peer.
class TimedStore : public gloo::rendezvous::Store {
 public:
  TimedStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout,
             const Shared& shared, std::function<absl::Status()> peer_failure = nullptr)
      : inner_(inner),
        timeout_(timeout),
        shared_(shared),
        peer_failure_(std::move(peer_failure)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
    given_.emplace_back(key, data);
  }
  // The bytes last set at `key` through this store; empty when none were.
  std::vector<char> Given(const std::string& key) const {
    for (auto it = given_.rbegin(); it != given_.rend(); ++it) {
      if (it->first == key) return it->second;
    }
    return {};
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::all_of(keys.begin(), keys.end(), shared_.present)) {
      if (peer_failure_) {
        absl::Status failed = peer_failure_();
        if (!failed.ok()) throw PeerFailed(std::move(failed));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        inner_.wait(keys, std::chrono::milliseconds(1));  // gloo's own timeout error
        return;
      }
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(20)));
    }
  }

 private:
  gloo::rendezvous::Store& inner_;
  const std::chrono::milliseconds timeout_;
  const Shared& shared_;
  const std::function<absl::Status()> peer_failure_;
  std::vector<std::pair<std::string, std::vector<char>>> given_;
};

// Where this rank listened for each peer (by rank; "" for this rank, and
// where `given` is not gloo's layout): from the addresses connectFullMesh set
// at `given`, one gloo tcp::Address per peer in rank order, this rank left
// out. It is one of two addresses a peer's gloo errors may print for this
// rank (the other is the pair's address(), once connected, the socket's own
// end): the peer's pair takes the connected socket's far end, but when this
// rank connected to it before it read this address from the store, that read
// overwrites it.
std::vector<std::string> ListenedAt(const std::vector<char>& given, int rank, int size) {
  std::vector<std::string> at(size);
  if (size < 2 || given.empty() || given.size() % (size - 1) != 0) return at;
  const size_t each = given.size() / (size - 1);
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    const size_t from = static_cast<size_t>(q < rank ? q : q - 1) * each;
    try {
      at[q] = gloo::transport::tcp::Address(
                  std::vector<char>(given.begin() + from, given.begin() + from + each))
                  .str();
    } catch (const std::exception&) {
      return std::vector<std::string>(size);  // not gloo's layout
    }
  }
  return at;
}

// After a rendezvous timed out: "; rank 1 never joined (...)" naming the
// ranks whose claim (internal::ClaimRank's "<prefix>/joined/<r>") is not in
// the store; "" when every rank joined, or for a group split off another
// (whose prefix holds no claims).
std::string NeverJoined(const Shared& shared, const std::string& prefix, int rank, int size) {
  std::vector<int> absent;
  try {
    auto joined = [&](int r) { return shared.present(absl::StrCat(prefix, "/joined/", r)); };
    if (!joined(rank)) return "";
    for (int r = 0; r < size; ++r) {
      if (r != rank && !joined(r)) absent.push_back(r);
    }
  } catch (const std::exception&) {
    return "";  // the store itself failed: gloo's error says enough
  }
  if (absent.empty()) return "";
  return absl::StrCat("; ", absent.size() == 1 ? "rank " : "ranks ", absl::StrJoin(absent, ", "),
                      " never joined (not started, or started with another store or run id: "
                      "--rdzv, RUN_ID)");
}

struct Connected {
  std::shared_ptr<gloo::Context> ctx;
  std::vector<internal::PeerProcess> processes;  // by rank
  // By rank: the addresses this rank's gloo errors may print for it (its end
  // of their connection; where it listened for this rank).
  std::vector<std::vector<std::string>> addresses;
};

// Connects within `budget`; errors name `timeout` (the group's: the budget
// may be what is left of it). With a `layout` store (a world group's), a
// rank's announced failure ends the wait (Aborted).
absl::StatusOr<Connected> Connect(const std::shared_ptr<Shared>& shared, const std::string& prefix,
                                  int rank, int size, absl::Duration budget,
                                  absl::Duration timeout, const std::string& who,
                                  internal::LayoutStore* layout = nullptr) {
  try {
    std::function<absl::Status()> peer_failure;
    if (layout != nullptr) {
      peer_failure = [&] { return internal::CheckPeerFailure(*layout, prefix, size, who); };
    }
    TimedStore timed(*shared->root_store, ToMillis(budget), *shared, std::move(peer_failure));
    gloo::rendezvous::PrefixStore store(prefix, timed);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(ToMillis(budget));
    ctx->connectFullMesh(store, shared->device);
    // A rank's connectFullMesh can return while a peer is still finishing
    // its side of the handshake; a collective over the new connections makes
    // the group exist on every rank before any rank returns it (a rank that
    // then exits fails its peers' next collective, not their rendezvous).
    // It is the all-gather of every rank's host and pid
    // (internal::PeerProcess): one collective, where reading each rank's key
    // from the store cost size() reads per rank.
    const internal::PeerProcess me = internal::ThisProcess();
    Connected connected{ctx, std::vector<internal::PeerProcess>(size),
                        std::vector<std::vector<std::string>>(size)};
    AllGatherBytes(ctx.get(), &me, connected.processes.data(), sizeof(internal::PeerProcess),
                   ToMillis(budget));
    // Then, to each peer, this rank's two addresses that the peer's gloo
    // errors may print for it: its end of their connection, and where it
    // listened for that peer (ListenedAt).
    if (size > 1) {
      constexpr size_t kBytes = internal::kAddressBytes;
      std::vector<char> mine(size * 2 * kBytes, 0), theirs(size * 2 * kBytes, 0);
      const std::vector<std::string> listened =
          ListenedAt(timed.Given(absl::StrCat(prefix, "/", rank)), rank, size);
      for (int q = 0; q < size; ++q) {
        if (q == rank) continue;
        internal::AddressBytes(ctx->getPair(q)->address().str(), &mine[(2 * q) * kBytes]);
        internal::AddressBytes(listened[q], &mine[(2 * q + 1) * kBytes]);
      }
      gloo::AlltoallOptions opts(ctx);
      opts.setInput(mine.data(), mine.size());
      opts.setOutput(theirs.data(), theirs.size());
      opts.setTimeout(ToMillis(budget));
      gloo::alltoall(opts);
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        for (int k = 0; k < 2; ++k) {
          std::string address = internal::AddressOf(&theirs[(2 * r + k) * kBytes]);
          std::vector<std::string>& known = connected.addresses[r];
          if (!address.empty() && std::find(known.begin(), known.end(), address) == known.end()) {
            known.push_back(std::move(address));
          }
        }
      }
    }
    return connected;
  } catch (const PeerFailed& e) {
    return e.status;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string msg =
        absl::StrCat("[rendezvous] ", who, ": could not connect the group through ",
                     shared->where, " (prefix \"", prefix, "\") within ", Seconds(timeout), ": ",
                     what);
    if (absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout")) {
      return absl::DeadlineExceededError(
          absl::StrCat(msg, NeverJoined(*shared, prefix, rank, size)));
    }
    return absl::UnavailableError(msg);
  }
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  // `world_ranks` (by rank) and `label`: a subgroup's, as errors name it
  // (empty for the world group).
  GlooProcessGroup(std::shared_ptr<Shared> shared, Connected connected, std::string prefix,
                   absl::Duration timeout, std::vector<int> world_ranks = {},
                   std::string label = "")
      : ProcessGroup(timeout),
        shared_(std::move(shared)),
        ctx_(std::move(connected.ctx)),
        processes_(std::move(connected.processes)),
        addresses_(std::move(connected.addresses)),
        prefix_(std::move(prefix)),
        world_ranks_(std::move(world_ranks)),
        label_(std::move(label)),
        ledger_(&tensor::MemoryLedger::Current()),
        worker_([this] { Loop(); }) {}

  ~GlooProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  absl::string_view backend() const override { return "gloo"; }

  // RemoveOwnFolderStoreKeys (gloo_group.h).
  absl::StatusOr<int> RemoveOwnFolderStoreKeys() {
    auto* folder = dynamic_cast<gloo::rendezvous::FileStore*>(shared_->root_store.get());
    if (folder == nullptr) return 0;  // Redis
    int removed = 0;
    std::string first_error;
    // Last written first: this rank's claim under the prefix (its first key)
    // outlives its other keys, so a run starting under the same prefix
    // meanwhile is refused rather than reading stale addresses. (A set that
    // threw lists the file it found: only in runs that failed, which do not
    // get here.)
    const std::vector<std::string> paths = folder->getAllKeyFilePaths();
    for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
      const std::string& path = *it;
      if (::unlink(path.c_str()) == 0) {
        ++removed;
      } else if (errno != ENOENT && first_error.empty()) {
        first_error = absl::StrCat("'", path, "': ", std::strerror(errno));
      }
    }
    if (!first_error.empty()) {
      return absl::InternalError(absl::StrCat("[gloo] rank ", rank(), ": cannot remove the ",
                                              "store key file ", first_error));
    }
    return removed;
  }

 protected:
  // "rank 1 of 2 in group world/split0/color1" in a subgroup (the world
  // group's first split, color 1), as the threads engine.
  std::string Who() const override { return internal::GroupWho(rank(), size(), label_); }

  WorkPtr Issue(std::shared_ptr<CollectiveCall> call) override {
    auto work = std::make_shared<CompletionWork>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(std::move(call), work);
    }
    cv_.notify_all();
    return work;
  }

  absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int color, int key,
                                                        absl::Duration timeout) override {
    const int seq = split_seq_++;
    Tensor mine = Tensor::FromData<int64_t>(std::vector<int64_t>{color, key}, {2});
    Tensor all = Tensor::Empty({2 * size()}, Dtype::kI64);
    absl::Status st = AllGatherSync(mine, all, CollectiveOptions::WithTimeout(timeout));
    if (!st.ok()) return st;
    if (color < 0) return std::unique_ptr<ProcessGroup>();
    const std::vector<int64_t> v = all.ToVector<int64_t>();
    std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
    for (int r = 0; r < size(); ++r) {
      if (v[2 * r] == color) members.emplace_back(v[2 * r + 1], r);
    }
    std::sort(members.begin(), members.end());
    int new_rank = -1;
    for (int i = 0; i < static_cast<int>(members.size()); ++i) {
      if (members[i].second == rank()) new_rank = i;
    }
    const std::string prefix = absl::StrCat(prefix_, "/split", seq, "/color", color);
    auto connected = Connect(shared_, prefix, new_rank, static_cast<int>(members.size()), timeout,
                             timeout,
                             absl::StrCat("[split] ", Who()));
    if (!connected.ok()) return connected.status();
    // Errors in the new group name its ranks with the world's, as the
    // threads engine's do: "rank 1 (world 3)".
    std::vector<int> world_ranks;
    for (const auto& [member_key, parent_rank] : members) {
      world_ranks.push_back(world_ranks_.empty() ? parent_rank : world_ranks_[parent_rank]);
    }
    return std::unique_ptr<ProcessGroup>(new GlooProcessGroup(
        shared_, *std::move(connected), prefix, this->timeout(), std::move(world_ranks),
        internal::SubgroupLabel(label_, seq, color)));
  }

 private:
  void Loop() {
    // Staging buffers count for the rank that created the group, as
    // communication (as the threads engine's worker).
    tensor::ScopedLedger scoped_ledger(ledger_);
    tensor::ScopedMemoryCategory scoped_category(tensor::MemoryCategory::kCommunication);
    while (true) {
      std::pair<std::shared_ptr<CollectiveCall>, std::shared_ptr<CompletionWork>> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::shared_ptr<CollectiveCall> call = std::move(item.first);
      const absl::Status status = Run(*call);
      call.reset();  // free the call's buffers before the waiter goes on
      item.second->Complete(status);
    }
  }

  std::string Prefix(const CollectiveCall& call) const {
    return absl::StrCat("[", CollectiveName(call.kind), "] ", Who());
  }

  absl::Status Run(CollectiveCall& call) {
    if (!broken_.ok()) {
      return absl::Status(broken_.code(), absl::StrCat(Prefix(call),
                                                       ": the group is unusable after an earlier "
                                                       "failure: ",
                                                       broken_.message()));
    }
    const absl::Time deadline = absl::Now() + call.timeout;
    auto remaining = [&] { return ToMillis(deadline - absl::Now()); };
    // 1. This rank's buffers (one short of memory says so in step 2).
    Staged staged;
    absl::Status staging;
    if (call.error.ok()) {
      try {
        staged = Stage(call);
      } catch (const std::bad_alloc& e) {
        staging = absl::ResourceExhaustedError(
            absl::StrCat(Prefix(call), ": out of memory staging the call's buffers (",
                         e.what(), "); the call did nothing on any rank"));
      } catch (const std::exception& e) {  // tensors gloo cannot take: invalid arguments
        staging = absl::InvalidArgumentError(
            absl::StrCat(Prefix(call), ": cannot stage the call's tensors: ", e.what()));
      }
    }
    try {
      // 2. Descriptors: every rank learns what every rank called.
      std::vector<int64_t> mine = Describe(call, staging);
      std::vector<int64_t> all(kDescLen * size());
      AllGatherBytes(ctx_.get(), mine.data(), all.data(), kDescLen * sizeof(int64_t),
                     remaining());
      std::vector<int> invalid;
      std::vector<int> short_of_memory;
      std::vector<int> differ;
      for (int r = 0; r < size(); ++r) {
        const int64_t* d = &all[kDescLen * r];
        if (d[1] == 1) invalid.push_back(r);
        if (d[1] == 2) short_of_memory.push_back(r);
        if (!SameCall(d, mine.data())) differ.push_back(r);
      }
      if (!call.error.ok()) return call.error;
      if (absl::IsInvalidArgument(staging)) return staging;
      if (!invalid.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Prefix(call), ": ", internal::NameRanks(invalid, world_ranks_),
                         " passed invalid arguments"));
      }
      if (!differ.empty()) {
        std::vector<std::string> calls;
        for (int r = 0; r < size(); ++r) {
          calls.push_back(absl::StrCat(internal::NameRanks({r}, world_ranks_), ": ",
                                       DescribeRemote(&all[kDescLen * r])));
        }
        return absl::InvalidArgumentError(absl::StrCat(
            Prefix(call), ": mismatched collective calls (", absl::StrJoin(calls, "; "), ")"));
      }
      // Short of memory last: a mismatched (larger) call may be why.
      if (!staging.ok()) return staging;
      if (!short_of_memory.empty()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            Prefix(call), ": ", internal::NameRanks(short_of_memory, world_ranks_),
            " ran out of memory staging the call's buffers; the call did nothing on any rank"));
      }
      // 3. Data.
      RunData(ctx_.get(), call, staged, remaining());
    } catch (const std::bad_alloc& e) {
      // Gloo's own buffers: the peers may be inside the collective already.
      broken_ = absl::ResourceExhaustedError(
          absl::StrCat(Prefix(call), ": out of memory inside the collective (", e.what(),
                       "); its peers may wait for this rank until their timeout"));
      return broken_;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      std::vector<int> peers;
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) peers.push_back(r);
      }
      if (absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout")) {
        broken_ = absl::DeadlineExceededError(absl::StrCat(
            Prefix(call), " timed out after ", Seconds(call.timeout), " waiting for ",
            internal::NameRanks(peers, world_ranks_), " (gloo: ", what, ")"));
      } else {
        broken_ = absl::AbortedError(absl::StrCat(Prefix(call), ": ", LostPeers(what, peers)));
      }
      return broken_;
    }
    // 4. The result into the call's tensors (every rank's data phase is
    // done: a failure here is this rank's alone and leaves the group usable).
    try {
      Finish(call, staged, rank());
    } catch (const std::bad_alloc& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat(Prefix(call), ": out of memory copying the result into the call's "
                       "tensors: ", e.what()));
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat(Prefix(call), ": copying the result into the call's tensors: ", e.what()));
    }
    return absl::OkStatus();
  }

  // What gloo's error `what` says of `peers` (every rank but this one): the
  // one it names (by either of its addresses), whether its process exited or
  // it left the group, with any other peer whose process exited on this
  // host; else the peers whose process exited; else that one of them left.
  std::string LostPeers(const std::string& what, const std::vector<int>& peers) const {
    const int named = internal::PeerIndexNamedIn(what, addresses_, rank());
    if (named < 0) {
      const std::string exited =
          internal::ExitedPeers(processes_, peers, /*wait_ms=*/1000, world_ranks_);
      if (!exited.empty()) return absl::StrCat("lost a peer: ", exited, " (gloo: ", what, ")");
      return absl::StrCat("lost a peer (one of ", internal::NameRanks(peers, world_ranks_),
                          " left or its connection broke; gloo: ", what, ")");
    }
    std::string said = internal::ExitedPeers(processes_, {named}, /*wait_ms=*/1000, world_ranks_);
    if (said.empty()) {
      said = internal::PeerNamedIn(what, processes_, addresses_, rank(), world_ranks_);
    }
    std::vector<int> others;
    for (const int r : peers) {
      if (r != named) others.push_back(r);
    }
    const std::string also =
        internal::ExitedPeers(processes_, others, /*wait_ms=*/0, world_ranks_);
    return absl::StrCat("lost a peer: ", said, also.empty() ? "" : absl::StrCat("; also ", also),
                        " (gloo: ", what, ")");
  }

  const std::shared_ptr<Shared> shared_;
  const std::shared_ptr<gloo::Context> ctx_;
  const std::vector<internal::PeerProcess> processes_;  // by rank
  // By rank: what gloo's errors here may print for it (Connected::addresses).
  const std::vector<std::vector<std::string>> addresses_;
  const std::string prefix_;
  const std::vector<int> world_ranks_;  // by rank, in a subgroup; empty in the world group
  const std::string label_;             // "world/split0/color1" in a subgroup; "" in the world
  int split_seq_ = 0;            // Issuing thread only.
  absl::Status broken_;          // Worker thread only.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<CollectiveCall>, std::shared_ptr<CompletionWork>>> queue_;
  bool stop_ = false;
  tensor::MemoryLedger* ledger_;  // the creating rank's
  std::thread worker_;  // Last: starts after the members above exist.
};

}  // namespace

namespace {

// A peer that exits closes its sockets; Gloo's next write to one raises
// SIGPIPE, whose default action kills this process (exit status 141) before
// the engine can report the lost peer. Ignore it unless the program installed
// a handler of its own: writes then fail with EPIPE and the call fails naming
// the peer.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

// Opens the store `options` name into `shared` (root_store, present,
// where): a Redis endpoint, or a folder made if missing (mkdir -p) that this
// process must be able to write. InvalidArgument naming the store when it
// is none of those; Unavailable when opening it fails.
absl::Status OpenStore(const GlooGroupOptions& options, const std::string& who, Shared& shared) {
  try {
    if (absl::StartsWith(options.store, "redis://")) {
      absl::StatusOr<std::pair<std::string, int>> endpoint = ParseRedisStore(options.store);
      if (!endpoint.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("[gloo] ", who, ": ", endpoint.status().message()));
      }
      auto redis =
          std::make_shared<gloo::rendezvous::RedisStore>(endpoint->first, endpoint->second);
      shared.present = [redis](const std::string& key) { return redis->check({key}); };
      shared.root_store = std::move(redis);
    } else {
      std::string dir = options.store;
      if (absl::StartsWith(dir, "file://")) dir = dir.substr(7);
      if (dir.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "[gloo] ", who, ": no store given (a directory or redis://host:port)"));
      }
      // mkdir -p; then it must be a folder this process can write.
      int mkdir_err = 0;  // the first mkdir that failed, but for one that exists
      for (size_t pos = 1; pos != std::string::npos;) {
        pos = dir.find('/', pos + 1);
        if (::mkdir(dir.substr(0, pos).c_str(), 0755) != 0 && errno != EEXIST && mkdir_err == 0) {
          mkdir_err = errno;
        }
      }
      struct stat st {};
      const int err = ::stat(dir.c_str(), &st) != 0 ? (mkdir_err != 0 ? mkdir_err : errno)
                      : !S_ISDIR(st.st_mode)          ? ENOTDIR
                      : ::access(dir.c_str(), W_OK | X_OK) != 0 ? errno
                                                                 : 0;
      if (err != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "[gloo] ", who, ": the rendezvous store '", dir, "' is not a folder this process "
            "can write (", std::strerror(err), "): give --rdzv=<a folder every rank can write> "
            "(or redis://host:port), or another TMPDIR for the default one"));
      }
      auto file = std::make_shared<CheckableFileStore>(dir);
      shared.present = [file](const std::string& key) { return file->check({key}); };
      shared.root_store = std::move(file);
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[gloo] ", who, ": cannot open store \"",
                                               options.store, "\": ", e.what()));
  }
  shared.where = options.store;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> RemoveOwnFolderStoreKeys(ProcessGroup& group) {
  auto* gloo = dynamic_cast<GlooProcessGroup*>(&group);
  return gloo == nullptr ? 0 : gloo->RemoveOwnFolderStoreKeys();
}

absl::StatusOr<bool> AnnounceGlooFailure(int rank, int size, const GlooGroupOptions& options,
                                         const std::string& why) {
  Shared shared;
  if (absl::Status opened = OpenStore(options, absl::StrCat("rank ", rank, " of ", size), shared);
      !opened.ok()) {
    return opened;
  }
  GlooLayoutStore store(shared, "");
  return internal::AnnounceFailure(store, options.prefix, rank, size, why);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateGlooProcessGroup(
    int rank, int size, const GlooGroupOptions& options) {
  const std::string who = absl::StrCat("rank ", rank, " of ", size);
  IgnoreSigpipeUnlessHandled();
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("[gloo] invalid rank ", rank, " for a group of size ", size));
  }
  auto shared = std::make_shared<Shared>();
  if (absl::Status opened = OpenStore(options, who, *shared); !opened.ok()) return opened;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    attr.iface = options.iface;
    if (!attr.iface.empty()) attr.hostname.clear();
    shared->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("[gloo] ", who, ": cannot create the TCP device: ", e.what()));
  }
  // The layout check and the connection share the rendezvous timeout.
  const absl::Time deadline = absl::Now() + options.timeout;
  const internal::LaunchLayout me{rank, size, options.local_rank, options.local_world_size};
  std::string run_folder;
  if (options.run_folder && !absl::StartsWith(options.store, "redis://")) {
    run_folder = std::string(absl::StripPrefix(options.store, "file://"));
  }
  GlooLayoutStore layout_store(*shared, run_folder);
  absl::Status layout =
      internal::ClaimAndCheckLayout(layout_store, options.prefix, me, deadline, who);
  if (!layout.ok()) return layout;
  auto connected = Connect(shared, options.prefix, rank, size, deadline - absl::Now(),
                           options.timeout, who, &layout_store);
  if (!connected.ok()) return connected.status();
  // A node launched for another world may have shown up meanwhile.
  layout = internal::CheckNoLayoutMismatch(layout_store, options.prefix, me, who);
  if (!layout.ok()) return layout;
  return std::unique_ptr<ProcessGroup>(
      new GlooProcessGroup(shared, *std::move(connected), options.prefix, options.timeout));
}

}  // namespace dist
