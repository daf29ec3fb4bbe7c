// The `gloo` engine (see gloo_group.h): a worker thread per group that runs
// each call as staging (its buffers in Gloo's dtypes), a descriptor exchange
// (Gloo all-gather) and the Gloo collective, with the call's timeout.
#include "dist/gloo_group.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "gloo/transport/tcp/device.h"
#include "dist/gloo_peers.h"
#include "dist/redis_keys.h"
#include "dist/launch_layout.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace {

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

// Elementwise reductions for gloo::AllreduceOptions::setReduceFunction:
// c[i] = op(a[i], b[i]). Max/min propagate NaN (as the threads engine does).
template <typename T>
void SumFn(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] + y[i]);
}
template <typename T>
void MaxFn(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x[i]) || std::isnan(y[i])) {
        out[i] = std::isnan(x[i]) ? x[i] : y[i];
        continue;
      }
    }
    out[i] = x[i] > y[i] ? x[i] : y[i];
  }
}
template <typename T>
void MinFn(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x[i]) || std::isnan(y[i])) {
        out[i] = std::isnan(x[i]) ? x[i] : y[i];
        continue;
      }
    }
    out[i] = x[i] < y[i] ? x[i] : y[i];
  }
}

template <typename T>
void GlooAllReduce(gloo::Context* ctx, T* data, size_t count, ReduceOp op,
                   std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
  opts.setOutput<T>(data, count);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      opts.setReduceFunction(&SumFn<T>);
      break;
    case ReduceOp::kMax:
      opts.setReduceFunction(&MaxFn<T>);
      break;
    case ReduceOp::kMin:
      opts.setReduceFunction(&MinFn<T>);
      break;
  }
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
  if (op == ReduceOp::kAvg) {
    if constexpr (std::is_floating_point_v<T>) {
      const T n = static_cast<T>(ctx->size);
      for (size_t i = 0; i < count; ++i) data[i] /= n;
    }
  }
}

// In-place all-reduce of a contiguous tensor whose dtype Gloo reduces natively
// here (f32, i32, i64, u8).
void AllReduceNative(gloo::Context* ctx, const Tensor& t, ReduceOp op,
                     std::chrono::milliseconds timeout) {
  const size_t n = static_cast<size_t>(t.numel());
  switch (t.dtype()) {
    case Dtype::kF32:
      GlooAllReduce<float>(ctx, static_cast<float*>(t.raw_data()), n, op, timeout);
      return;
    case Dtype::kI32:
      GlooAllReduce<int32_t>(ctx, static_cast<int32_t*>(t.raw_data()), n, op, timeout);
      return;
    case Dtype::kI64:
      GlooAllReduce<int64_t>(ctx, static_cast<int64_t*>(t.raw_data()), n, op, timeout);
      return;
    case Dtype::kU8:
      GlooAllReduce<uint8_t>(ctx, static_cast<uint8_t*>(t.raw_data()), n, op, timeout);
      return;
    default:
      throw std::logic_error("AllReduceNative: unsupported dtype");
  }
}

// The contiguous buffers in Gloo's dtypes that a call's data phase works on,
// allocated before the descriptors are exchanged: a rank short of memory
// tells its peers there, while the group is still in step, instead of
// leaving them inside a collective it cannot join. Copied back by Finish.
struct Staged {
  // all_reduce, reduce_scatter: what is reduced in place (f16/bf16 as f32;
  // reduce_scatter: a flat copy of the whole input). all_gather: this rank's
  // piece (a copy: the input may alias the output). broadcast: the buffer.
  Tensor work;
  Tensor out;  // all_gather: where the pieces land
};

bool IsHalf(Dtype d) { return d == Dtype::kF16 || d == Dtype::kBF16; }

Staged Stage(const CollectiveCall& call) {
  // Gloo reads and writes host memory: a GPU tensor would need the issuing
  // stream's work ordered before its reads, and its result copied back
  // before the Work completes, which this engine does not do.
  for (const Tensor* t : {&call.input, &call.output}) {
    if (t->defined() && !t->device().is_cpu()) {
      throw std::invalid_argument(absl::StrCat(
          "the gloo engine takes CPU tensors; the ", t == &call.input ? "input" : "output",
          " is on ", t->device().ToString(),
          " (the nccl engine takes GPU tensors, the threads engine ranks sharing a GPU)"));
    }
  }
  Staged s;
  const Tensor& in = call.input;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      s.work = IsHalf(in.dtype()) ? in.To(Dtype::kF32) : in.Contiguous();
      break;
    case CollectiveKind::kReduceScatter:
      s.work = (IsHalf(in.dtype()) ? in.To(Dtype::kF32) : in.Clone()).Flatten();
      break;
    case CollectiveKind::kAllGather:
      s.work = in.is_contiguous() ? in.Clone() : in.Contiguous();
      s.out = call.output.is_contiguous() ? call.output
                                          : Tensor::Empty(call.output.shape(), call.output.dtype());
      break;
    case CollectiveKind::kBroadcast:
      s.work = in.Contiguous();
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  return s;
}

void AllGatherBytes(gloo::Context* ctx, const void* in, void* out, size_t bytes_per_rank,
                    std::chrono::milliseconds timeout) {
  gloo::AllgatherOptions opts(std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
  opts.setInput<uint8_t>(static_cast<uint8_t*>(const_cast<void*>(in)), bytes_per_rank);
  opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), bytes_per_rank * ctx->size);
  opts.setTimeout(timeout);
  gloo::allgather(opts);
}

// The descriptor every rank publishes before a call.
constexpr int kDescLen = 8;
// d[1] is the rank's state: 0 ready, 1 invalid arguments (or tensors it
// could not stage), 2 out of memory while staging.
std::vector<int64_t> Describe(const CollectiveCall& call, const absl::Status& staging) {
  return {1,
          !call.error.ok() || absl::IsInvalidArgument(staging) ? 1
          : staging.ok()                                       ? 0
                                                               : 2,
          static_cast<int64_t>(call.kind),
          static_cast<int64_t>(call.op),
          call.input.defined() ? static_cast<int64_t>(call.input.dtype()) : -1,
          call.input.defined() ? call.input.numel() : -1,
          call.output.defined() ? call.output.numel() : -1,
          call.root};
}

std::string DescribeRemote(const int64_t* d) {
  CollectiveKind kind = static_cast<CollectiveKind>(d[2]);
  const std::string name(CollectiveName(kind));
  const std::string dtype =
      d[4] >= 0 ? std::string(tensor::DtypeName(static_cast<Dtype>(d[4]))) : "?";
  const std::string op(ReduceOpName(static_cast<ReduceOp>(d[3])));
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return absl::StrCat(name, "(", op, ", ", dtype, ", ", d[5], " elements)");
    case CollectiveKind::kReduceScatter:
      return absl::StrCat(name, "(", op, ", ", dtype, ", ", d[5], " -> ", d[6], " elements)");
    case CollectiveKind::kAllGather:
      return absl::StrCat(name, "(", dtype, ", ", d[5], " -> ", d[6], " elements)");
    case CollectiveKind::kBroadcast:
      return absl::StrCat(name, "(root ", d[7], ", ", dtype, ", ", d[5], " elements)");
    case CollectiveKind::kBarrier:
      return absl::StrCat(name, "()");
  }
  return name;
}

bool SameCall(const int64_t* a, const int64_t* b) {
  for (int i = 2; i < kDescLen; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
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

// A store whose reads wait the group's timeout: gloo's connectFullMesh reads
// each lower rank's address with Store::get, which its FileStore bounds by
// its own 30 s default (a rank that came up later than that failed the
// rendezvous early, whatever --timeout_s said; a shorter timeout was not
// honoured there either).
class TimedStore : public gloo::rendezvous::Store {
 public:
  TimedStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
      : inner_(inner), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 private:
  gloo::rendezvous::Store& inner_;
  const std::chrono::milliseconds timeout_;
};

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
  std::vector<std::string> addresses;  // by rank: its end of its connection with this one
};

// Connects within `budget`; errors name `timeout` (the group's: the budget
// may be what is left of it).
absl::StatusOr<Connected> Connect(const std::shared_ptr<Shared>& shared, const std::string& prefix,
                                  int rank, int size, absl::Duration budget,
                                  absl::Duration timeout, const std::string& who) {
  try {
    TimedStore timed(*shared->root_store, ToMillis(budget));
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
                        std::vector<std::string>(size)};
    AllGatherBytes(ctx.get(), &me, connected.processes.data(), sizeof(internal::PeerProcess),
                   ToMillis(budget));
    // Then each rank's end of each connection, to the rank at its other end:
    // what that rank's gloo errors print for this one.
    if (size > 1) {
      constexpr size_t kBytes = internal::kAddressBytes;
      std::vector<char> mine(size * kBytes, 0), theirs(size * kBytes, 0);
      for (int q = 0; q < size; ++q) {
        if (q != rank) internal::AddressBytes(ctx->getPair(q)->address().str(), &mine[q * kBytes]);
      }
      gloo::AlltoallOptions opts(ctx);
      opts.setInput(mine.data(), mine.size());
      opts.setOutput(theirs.data(), theirs.size());
      opts.setTimeout(ToMillis(budget));
      gloo::alltoall(opts);
      for (int r = 0; r < size; ++r) {
        if (r != rank) connected.addresses[r] = internal::AddressOf(&theirs[r * kBytes]);
      }
    }
    return connected;
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
  GlooProcessGroup(std::shared_ptr<Shared> shared, Connected connected, std::string prefix,
                   absl::Duration timeout)
      : ProcessGroup(timeout),
        shared_(std::move(shared)),
        ctx_(std::move(connected.ctx)),
        processes_(std::move(connected.processes)),
        addresses_(std::move(connected.addresses)),
        prefix_(std::move(prefix)),
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

 protected:
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
    return std::unique_ptr<ProcessGroup>(
        new GlooProcessGroup(shared_, *std::move(connected), prefix, this->timeout()));
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
            absl::StrCat(Prefix(call), ": ", invalid.size() == 1 ? "rank " : "ranks ",
                         absl::StrJoin(invalid, ", "), " passed invalid arguments"));
      }
      if (!differ.empty()) {
        std::vector<std::string> calls;
        for (int r = 0; r < size(); ++r) {
          calls.push_back(absl::StrCat("rank ", r, ": ", DescribeRemote(&all[kDescLen * r])));
        }
        return absl::InvalidArgumentError(absl::StrCat(
            Prefix(call), ": mismatched collective calls (", absl::StrJoin(calls, "; "), ")"));
      }
      // Short of memory last: a mismatched (larger) call may be why.
      if (!staging.ok()) return staging;
      if (!short_of_memory.empty()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            Prefix(call), ": ", short_of_memory.size() == 1 ? "rank " : "ranks ",
            absl::StrJoin(short_of_memory, ", "),
            " ran out of memory staging the call's buffers; the call did nothing on any rank"));
      }
      // 3. Data.
      RunData(call, staged, remaining());
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
            peers.size() == 1 ? "rank " : "ranks ", absl::StrJoin(peers, ", "),
            " (gloo: ", what, ")"));
      } else if (const std::string exited = internal::ExitedPeers(processes_, rank());
                 !exited.empty()) {
        broken_ = absl::AbortedError(
            absl::StrCat(Prefix(call), ": lost a peer: ", exited, " (gloo: ", what, ")"));
      } else if (const std::string named =
                     internal::PeerNamedIn(what, processes_, addresses_, rank());
                 !named.empty()) {
        broken_ = absl::AbortedError(
            absl::StrCat(Prefix(call), ": lost a peer: ", named, " (gloo: ", what, ")"));
      } else {
        broken_ = absl::AbortedError(absl::StrCat(
            Prefix(call), ": lost a peer (one of ", peers.size() == 1 ? "rank " : "ranks ",
            absl::StrJoin(peers, ", "), " left or its connection broke; gloo: ", what, ")"));
      }
      return broken_;
    }
    // 4. The result into the call's tensors (every rank's data phase is
    // done: a failure here is this rank's alone and leaves the group usable).
    try {
      Finish(call, staged);
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

  // The collective itself, on the staged buffers.
  void RunData(const CollectiveCall& call, const Staged& staged,
               std::chrono::milliseconds timeout) {
    gloo::Context* ctx = ctx_.get();
    const Tensor& work = staged.work;
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kReduceScatter:  // all-reduce the whole input, keep chunk rank()
        if (work.numel() > 0) AllReduceNative(ctx, work, call.op, timeout);
        return;
      case CollectiveKind::kAllGather:
        if (work.nbytes() > 0) {
          AllGatherBytes(ctx, work.raw_data(), staged.out.raw_data(),
                         static_cast<size_t>(work.nbytes()), timeout);
        }
        return;
      case CollectiveKind::kBroadcast:
        if (work.nbytes() > 0) {
          gloo::BroadcastOptions opts(
              std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
          opts.setOutput<uint8_t>(static_cast<uint8_t*>(work.raw_data()),
                                  static_cast<size_t>(work.nbytes()));
          opts.setRoot(call.root);
          opts.setTimeout(timeout);
          gloo::broadcast(opts);
        }
        return;
      case CollectiveKind::kBarrier: {
        gloo::BarrierOptions opts(std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
        opts.setTimeout(timeout);
        gloo::barrier(opts);
        return;
      }
    }
  }

  // Copies the staged result into the call's tensors (converting the dtype;
  // nothing is allocated).
  void Finish(const CollectiveCall& call, const Staged& staged) const {
    const Tensor& work = staged.work;
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kBroadcast:
        if (!work.SharesStorageWith(call.input)) {
          Tensor target = call.input;
          target.CopyFrom(work);
        }
        return;
      case CollectiveKind::kReduceScatter: {
        const int64_t k = call.output.numel();
        Tensor out = call.output;
        out.CopyFrom(work.Narrow(0, rank() * k, k).Reshape(call.output.shape()));
        return;
      }
      case CollectiveKind::kAllGather:
        if (!staged.out.SharesStorageWith(call.output)) {
          Tensor target = call.output;
          target.CopyFrom(staged.out);
        }
        return;
      case CollectiveKind::kBarrier:
        return;
    }
  }

  const std::shared_ptr<Shared> shared_;
  const std::shared_ptr<gloo::Context> ctx_;
  const std::vector<internal::PeerProcess> processes_;  // by rank
  const std::vector<std::string> addresses_;  // by rank: what gloo's errors here print for it
  const std::string prefix_;
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

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateGlooProcessGroup(
    int rank, int size, const GlooGroupOptions& options) {
  const std::string who = absl::StrCat("rank ", rank, " of ", size);
  IgnoreSigpipeUnlessHandled();
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("[gloo] invalid rank ", rank, " for a group of size ", size));
  }
  auto shared = std::make_shared<Shared>();
  try {
    if (absl::StartsWith(options.store, "redis://")) {
      absl::StatusOr<std::pair<std::string, int>> endpoint = ParseRedisStore(options.store);
      if (!endpoint.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("[gloo] ", who, ": ", endpoint.status().message()));
      }
      auto redis =
          std::make_shared<gloo::rendezvous::RedisStore>(endpoint->first, endpoint->second);
      shared->present = [redis](const std::string& key) { return redis->check({key}); };
      shared->root_store = std::move(redis);
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
      shared->present = [file](const std::string& key) { return file->check({key}); };
      shared->root_store = std::move(file);
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    attr.iface = options.iface;
    if (!attr.iface.empty()) attr.hostname.clear();
    shared->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("[gloo] ", who, ": cannot open store \"",
                                               options.store, "\" or device: ", e.what()));
  }
  shared->where = options.store;
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
  auto connected =
      Connect(shared, options.prefix, rank, size, deadline - absl::Now(), options.timeout, who);
  if (!connected.ok()) return connected.status();
  // A node launched for another world may have shown up meanwhile.
  layout = internal::CheckNoLayoutMismatch(layout_store, options.prefix, me, who);
  if (!layout.ok()) return layout;
  return std::unique_ptr<ProcessGroup>(
      new GlooProcessGroup(shared, *std::move(connected), options.prefix, options.timeout));
}

}  // namespace dist
