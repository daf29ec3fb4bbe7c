// The `threads` engine: the per-handle communication worker, the copy-free
// collectives (on host buffers, or with kernels on a communication stream
// when every rank's tensors are on one GPU), and RunRanks. How the ranks of
// a round meet: thread_rendezvous.h.
#include "dist/thread_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/collective_share.h"
#include "dist/device_lane.h"
#include "dist/rank_names.h"
#include "dist/thread_rendezvous.h"
#include "glog/logging.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"

namespace dist {
namespace internal {
namespace {

bool Overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

class ThreadProcessGroup final : public ProcessGroup {
 public:
  ThreadProcessGroup(std::shared_ptr<GroupState> group, int rank, tensor::MemoryLedger* ledger,
                     absl::Duration timeout)
      : ProcessGroup(timeout),
        group_(std::move(group)),
        rank_(rank),
        ledger_(ledger),
        rendezvous_(group_, rank) {
    {
      std::lock_guard<std::mutex> lock(group_->world->mu);
      ++group_->world->live_handles;
    }
    worker_ = std::thread([this] { WorkerLoop(); });
  }

  ~ThreadProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    worker_.join();  // The worker runs what is still queued first.
    WorldState& world = *group_->world;
    {
      std::lock_guard<std::mutex> lock(world.mu);
      group_->closed[rank_] = true;
      --world.live_handles;
    }
    world.cv.notify_all();
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::string_view backend() const override { return "threads"; }

  void WaitIdle() {
    std::unique_lock<std::mutex> lock(queue_mu_);
    queue_cv_.wait(lock, [this] { return jobs_.empty() && !busy_; });
  }

 protected:
  std::string Who() const override { return rendezvous_.Who(); }

  WorkPtr Issue(std::shared_ptr<CollectiveCall> call) override {
    auto work = std::make_shared<CompletionWork>();
    // Tensors on a GPU: mark where this thread's stream (or the call's ready
    // stream) stands, so that the collective's kernels start after the ones
    // producing its inputs.
    tensor::cuda::EventHandle issued = nullptr;
    if (call->error.ok() && call->input.defined() && call->input.device().is_cuda()) {
      try {
        const int device = call->input.device().index;
        issued = lane_.MarkIssued(device, call->ready_stream);
        // Another GPU than the lane's: no mark to wait for, and the call is
        // staged through the host on the worker thread, so that stream must
        // have produced the inputs first.
        if (issued == nullptr) tensor::cuda::SynchronizeStream(call->ready_stream, device);
      } catch (const std::exception& e) {
        call->error = absl::InternalError(
            absl::StrCat("[", CollectiveName(call->kind), "] ", Who(), ": ", e.what()));
      }
    }
    Enqueue([this, work, call, issued]() mutable {
      absl::Status status = Execute(*call, issued);
      // Drop the call's tensors before waking the waiter: once Wait() returns,
      // buffers only the call held are freed (and off the memory ledger).
      call = nullptr;
      work->Complete(std::move(status));
    });
    return work;
  }

  absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int color, int key,
                                                        absl::Duration timeout) override {
    auto done = std::make_shared<CompletionWork>();
    auto result = std::make_shared<std::unique_ptr<ProcessGroup>>();
    const absl::Duration child_timeout = this->timeout();
    Enqueue([this, color, key, timeout, child_timeout, done, result] {
      done->Complete(ExecuteSplit(color, key, timeout, child_timeout, result.get()));
    });
    absl::Status status = done->Wait();
    if (!status.ok()) return status;
    return std::move(*result);
  }

 private:
  void Enqueue(std::function<void()> job) {
    WorldState& world = *group_->world;
    {
      std::lock_guard<std::mutex> lock(world.mu);
      ++group_->pending[rank_];
    }
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      jobs_.push_back(std::move(job));
    }
    queue_cv_.notify_all();
  }

  void WorkerLoop() {
    tensor::ScopedLedger scoped_ledger(ledger_);
    tensor::ScopedMemoryCategory scoped_category(tensor::MemoryCategory::kCommunication);
    WorldState& world = *group_->world;
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left to run
        job = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
      }
      job();
      job = nullptr;  // Release the call's tensors before reporting idle.
      {
        std::lock_guard<std::mutex> lock(world.mu);
        --group_->pending[rank_];
      }
      world.cv.notify_all();
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        busy_ = false;
      }
      queue_cv_.notify_all();
    }
  }

  // Whether this rank can take the device path: contiguous tensors on the
  // lane's GPU (`issued` is its mark) and a group small enough for one
  // reduction launch. The path is taken when every rank can, on one GPU.
  bool DeviceEligible(const CollectiveCall& call, tensor::cuda::EventHandle issued) const {
    if (issued == nullptr || size() > tensor::cuda::kMaxReduceBuffers) return false;
    if (!call.input.is_contiguous()) return false;
    return !call.output.defined() ||
           (call.output.device() == call.input.device() && call.output.is_contiguous());
  }

  // Engine checks (overlap) and staging copies: of non-contiguous tensors,
  // and of tensors in device memory off the device path, which are copied to
  // host buffers here and back after the call (cudaMemcpy on the legacy
  // default stream: it waits for the kernels every rank thread queued before;
  // the copy back is waited for before the Work completes). Sets *in / *out to the
  // buffers to publish: the call's own tensors on the device path.
  absl::Status Prepare(const CollectiveCall& call, bool on_device, tensor::Tensor* in,
                       tensor::Tensor* out) {
    const std::string op(CollectiveName(call.kind));
    if (call.kind == CollectiveKind::kBarrier) return absl::OkStatus();
    if (on_device) {
      *in = call.input;
    } else {
      *in = call.input.device().is_cpu() ? call.input.Contiguous()  // copies when not contiguous
                                         : call.input.To(tensor::Device::Cpu());
    }
    if (!call.output.defined()) {
      *out = *in;  // in place
      return absl::OkStatus();
    }
    if (on_device) {
      *out = call.output;
    } else {
      *out = call.output.is_contiguous() && call.output.device().is_cpu()
                 ? call.output
                 : tensor::Tensor::Empty(call.output.shape(), call.output.dtype());
    }
    if (in->SharesStorageWith(call.input) && out->SharesStorageWith(call.output) &&
        Overlaps(in->raw_data(), in->nbytes(), out->raw_data(), out->nbytes())) {
      // Only the in-place layouts are allowed: output = this rank's chunk of
      // the input (reduce_scatter) or input = this rank's chunk of the output
      // (all_gather).
      const char* base_in = static_cast<const char*>(in->raw_data());
      const char* base_out = static_cast<const char*>(out->raw_data());
      const bool in_place = call.kind == CollectiveKind::kReduceScatter
                                ? base_out == base_in + rank_ * out->nbytes()
                                : base_in == base_out + rank_ * in->nbytes();
      if (!in_place) {
        return absl::InvalidArgumentError(absl::StrCat(
            "[", op, "] ", Who(), ": input and output overlap other than at this rank's chunk"));
      }
    }
    return absl::OkStatus();
  }

  // This rank's share (dist/collective_share.h) on its communication
  // stream, after every rank's issue mark; records the end of the share in
  // me->done. Every rank's buffers are on me->device. Errors are CUDA's.
  absl::Status ComputeOnDevice(const CollectiveCall& call, const std::vector<const Arrival*>& all,
                               Arrival* me) {
    try {
      std::vector<tensor::cuda::EventHandle> marks;
      for (const Arrival* a : all) marks.push_back(a->issued);
      lane_.WaitFor(marks);
      QueueShareOnDevice(call, rank_, Buffers(all), me->device.index, lane_.stream());
      me->done = lane_.MarkShareDone();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("[", CollectiveName(call.kind), "] ", Who(),
                                              ": the work on ", me->device.ToString(),
                                              " failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  static std::vector<RankBuffers> Buffers(const std::vector<const Arrival*>& all) {
    std::vector<RankBuffers> buffers;
    for (const Arrival* a : all) buffers.push_back({a->in, a->out});
    return buffers;
  }

  // A call whose ranks' buffers are not all on one GPU, though some are on a
  // GPU: those ranks stage theirs on the host now (Prepare's copies), then
  // every rank waits until all have, so that ShareOnHost reads host memory only.
  // Identical result on every rank. Takes world.mu.
  absl::Status StageOnHost(int64_t seq, const CollectiveCall& call,
                           const std::vector<const Arrival*>& all, Arrival* me, tensor::Tensor* in,
                           tensor::Tensor* out) {
    const std::string op(CollectiveName(call.kind));
    absl::Status staged;
    tensor::Tensor host_in, host_out;
    if (me->device.is_cuda()) {
      try {
        staged = Prepare(call, /*on_device=*/false, &host_in, &host_out);
      } catch (...) {
        staged = tensor::StatusOfCurrentException(
            absl::StrCat("[", op, "] ", Who(), ": staging on the host failed: "));
      }
    }
    rendezvous_.Staged(seq, [&] {
      if (me->device.is_cuda() && staged.ok()) {
        *in = host_in;
        *out = host_out;
        // me->device stays: every rank decided this round's path from the
        // devices published at arrival, and a peer may still be reading them.
        me->in = in->raw_data();
        me->out = out->raw_data();
      }
      me->failed = staged;
    });
    if (!me->failed.ok()) return me->failed;
    // The peers are all still in this round (none can leave before this rank
    // has finished its share): their Arrivals are alive.
    return rendezvous_.PeerFailure(op,
                                   [&](int r) -> const absl::Status& { return all[r]->failed; });
  }

  // The staged host result into the caller's tensor (any strides, any
  // device: a strided device destination gets a device copy first).
  static void CopyBack(const tensor::Tensor& staged, tensor::Tensor& dst) {
    if (dst.device() != staged.device() && !dst.is_contiguous()) {
      dst.CopyFrom(staged.To(dst.device()));
    } else {
      dst.CopyFrom(staged);
    }
  }

  // One collective of this rank. The device path, when every rank's tensors
  // are contiguous on one GPU: the ranks' communication streams do their
  // shares with kernels and device copies, ordered after each issuing stream's
  // mark (dist/device_lane.h), and nothing goes through host memory; the
  // Work completes once every rank's share has finished on the device.
  // Otherwise host buffers (Prepare, StageOnHost).
  absl::Status Execute(const CollectiveCall& call, tensor::cuda::EventHandle issued) {
    const std::string op(CollectiveName(call.kind));
    const int64_t seq = next_seq_++;
    Arrival me;
    me.call = &call;
    me.error = call.error;
    const bool eligible = me.error.ok() && DeviceEligible(call, issued);
    tensor::Tensor in, out;
    if (me.error.ok()) {
      try {
        // Device work this thread does for the call off the device path
        // (Prepare's and CopyBack's strided copies, on this thread's stream)
        // comes after the issuing stream's kernels, which produce the inputs
        // and may still read the outputs.
        if (issued != nullptr) {
          tensor::cuda::StreamWaitEvent(/*stream=*/nullptr, issued, call.input.device().index);
        }
        me.error = Prepare(call, eligible, &in, &out);
      } catch (...) {
        me.error = tensor::StatusOfCurrentException(
            absl::StrCat("[", op, "] ", Who(), ": preparing buffers failed: "));
      }
    }
    if (me.error.ok() && in.defined()) {
      me.in = in.raw_data();
      me.out = out.raw_data();
      if (eligible) {
        me.device = call.input.device();
        me.issued = issued;
      }
    }
    std::vector<const Arrival*> all;
    absl::Status status = rendezvous_.Arrive(seq, me, op, call.timeout, &all);
    if (!status.ok()) {  // Never entered the compute phase.
      lane_.Recycle(issued);
      return status;
    }
    status = rendezvous_.CheckArrivals(all, op);
    bool on_device = status.ok();
    bool any_on_device = false;
    for (const Arrival* a : all) {
      on_device = on_device && a->device.is_cuda() && a->device == all[0]->device;
      any_on_device = any_on_device || a->device.is_cuda();
    }
    if (status.ok() && !on_device && any_on_device) {
      status = StageOnHost(seq, call, all, &me, &in, &out);
    }
    if (status.ok() && on_device) {
      me.failed = ComputeOnDevice(call, all, &me);
    } else if (status.ok()) {
      ShareOnHost(call, rank_, Buffers(all));
    }
    // Whether a peer's share failed; on the device path, this rank's stream
    // waits for the ends of the peers' shares (queued before any peer
    // returns from Leave: a peer that returned may destroy its end event).
    absl::Status peer_failed;
    std::exception_ptr wait_error;
    rendezvous_.Leave(
        seq,
        [&](Round& round) {
          peer_failed = rendezvous_.PeerFailure(
              op, [&](int r) -> const absl::Status& { return round.failed[r]; });
          if (!status.ok() || !on_device) return;
          std::vector<tensor::cuda::EventHandle> peers_done;
          for (int r = 0; r < size(); ++r) {
            if (r != rank_) peers_done.push_back(round.share_done[r]);
          }
          try {
            lane_.WaitFor(peers_done);
          } catch (...) {
            wait_error = std::current_exception();
          }
        },
        &me);
    if (status.ok() && on_device) {
      try {  // My buffers are done with once every peer's share has finished.
        if (wait_error) std::rethrow_exception(wait_error);
        lane_.Drain();
      } catch (const std::exception& e) {
        if (me.failed.ok()) {
          me.failed = absl::InternalError(absl::StrCat(
              "[", op, "] ", Who(), ": waiting on ", me.device.ToString(), " failed: ", e.what()));
        }
      }
    }
    lane_.Recycle(issued);  // Every peer's stream has queued its wait for it.
    if (!status.ok()) return status;
    if (on_device && !me.failed.ok()) return me.failed;
    if (on_device && !peer_failed.ok()) return peer_failed;
    try {
      // Copy staged results back (nothing to do on the device path).
      tensor::Tensor dst;
      if (call.kind == CollectiveKind::kAllReduce || call.kind == CollectiveKind::kBroadcast) {
        if (!in.SharesStorageWith(call.input)) {
          dst = call.input;
          CopyBack(in, dst);
        }
      } else if (call.output.defined() && !out.SharesStorageWith(call.output)) {
        dst = call.output;
        CopyBack(out, dst);
      }
      // A strided device destination was written by a kernel on this
      // thread's stream, a contiguous one by a cudaMemcpy from pageable
      // memory, which may return before its bytes land (on the legacy
      // stream): both done before the Work is, so that any stream may read
      // the result (FSDP's offload copies it back on a stream of its own).
      if (dst.defined() && dst.device().is_cuda()) {
        tensor::cuda::SynchronizeStream(/*stream=*/nullptr, dst.device().index);
        tensor::cuda::SynchronizeLegacyStream(dst.device().index);
      }
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("[", op, "] ", Who(), ": copying the result back failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  absl::Status ExecuteSplit(int color, int key, absl::Duration timeout,
                            absl::Duration child_timeout, std::unique_ptr<ProcessGroup>* result) {
    const int64_t seq = next_seq_++;
    const int split = next_split_++;  // every rank splits in the same order
    Arrival me;
    me.is_split = true;
    me.color = color;
    me.key = key;
    std::vector<const Arrival*> all;
    absl::Status status = rendezvous_.Arrive(seq, me, "split", timeout, &all);
    if (!status.ok()) return status;
    status = rendezvous_.CheckArrivals(all, "split");
    std::shared_ptr<GroupState> child;
    int child_rank = -1;
    if (status.ok() && color >= 0) {
      // Members of my color ordered by (key, rank).
      std::vector<int> members;
      for (int r = 0; r < size(); ++r) {
        if (all[r]->color == color) members.push_back(r);
      }
      std::stable_sort(members.begin(), members.end(),
                       [&](int a, int b) { return all[a]->key < all[b]->key; });
      child_rank =
          static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
      rendezvous_.Leave(seq, [&](Round& round) {
        std::shared_ptr<GroupState>& slot = round.splits[color];
        if (slot == nullptr) {
          std::vector<int> world_ranks;
          for (int m : members) world_ranks.push_back(group_->world_ranks[m]);
          slot = std::make_shared<GroupState>(group_->world, std::move(world_ranks),
                                              internal::SubgroupLabel(group_->label, split, color));
        }
        child = slot;
      });
    } else {
      rendezvous_.Leave(seq);
    }
    if (!status.ok()) return status;
    if (child != nullptr) {
      *result = std::make_unique<ThreadProcessGroup>(child, child_rank, ledger_, child_timeout);
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<GroupState> group_;
  const int rank_;
  tensor::MemoryLedger* const ledger_;
  Rendezvous rendezvous_;  // this rank's side of the group's rounds
  int64_t next_seq_ = 0;   // worker thread only
  int next_split_ = 0;     // worker thread only: this group's splits so far
  DeviceLane lane_;        // calls on a GPU: the communication stream and events

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by queue_mu_
  bool busy_ = false;                       // guarded by queue_mu_
  bool stopping_ = false;                   // guarded by queue_mu_
  std::thread worker_;
};

}  // namespace internal

namespace {

// Ledgers that tensors still point to when their world is destroyed: kept
// (reachable, so leak checkers stay quiet) until the process exits.
void KeepForever(std::unique_ptr<tensor::MemoryLedger> ledger) {
  static std::mutex* mu = new std::mutex;
  static auto* kept = new std::vector<std::unique_ptr<tensor::MemoryLedger>>;
  std::lock_guard<std::mutex> lock(*mu);
  kept->push_back(std::move(ledger));
}

}  // namespace

ThreadWorld::ThreadWorld(int size, ThreadWorldOptions options)
    : size_(size), state_(std::make_shared<internal::WorldState>(size)) {
  CHECK_GE(size, 1) << "a ThreadWorld needs at least one rank";
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  auto group = std::make_shared<internal::GroupState>(state_, ranks, "");
  for (int r = 0; r < size; ++r) {
    ledgers_.push_back(std::make_unique<tensor::MemoryLedger>());
  }
  for (int r = 0; r < size; ++r) {
    groups_.push_back(std::make_unique<internal::ThreadProcessGroup>(group, r, ledgers_[r].get(),
                                                                     options.timeout));
  }
}

ThreadWorld::~ThreadWorld() {
  // Let every handle know that all ranks are done, so calls still queued fail
  // fast instead of waiting for peers that will never come.
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (int r = 0; r < size(); ++r) state_->finished[r] = true;
  }
  state_->cv.notify_all();
  groups_.clear();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    CHECK_EQ(state_->live_handles, 0)
        << "groups split from a ThreadWorld must be destroyed before the world";
  }
  for (int r = 0; r < size(); ++r) {
    int64_t held = 0;
    held += ledgers_[r]->Total(tensor::Device::Cpu()).current;
    for (int d = 0; d < tensor::MemoryLedger::kMaxCudaDevices; ++d) {
      held += ledgers_[r]->Total(tensor::Device::Cuda(d)).current;
    }
    if (held != 0) {
      LOG(WARNING) << "ThreadWorld destroyed while rank " << r << "'s ledger still holds " << held
                   << " bytes; keeping the ledger alive for the tensors that still use it";
      KeepForever(std::move(ledgers_[r]));
    }
  }
}

ProcessGroup& ThreadWorld::group(int rank) {
  CHECK(rank >= 0 && rank < size()) << "rank " << rank << " of " << size();
  return *groups_[rank];
}

tensor::MemoryLedger& ThreadWorld::ledger(int rank) {
  CHECK(rank >= 0 && rank < size()) << "rank " << rank << " of " << size();
  return *ledgers_[rank];
}

void ThreadWorld::MarkRankFinished(int rank, const absl::Status& status) {
  CHECK(rank >= 0 && rank < size()) << "rank " << rank << " of " << size();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->finished[rank] = true;
    state_->finish_status[rank] = status;
  }
  state_->cv.notify_all();
}

void ThreadWorld::ResetFinished() {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (int r = 0; r < size(); ++r) {
    state_->finished[r] = false;
    state_->finish_status[r] = absl::OkStatus();
  }
}

void ThreadWorld::WaitIdle() {
  for (auto& group : groups_) group->WaitIdle();
}

namespace internal {

absl::Status RunRanksImpl(ThreadWorld& world, const RankFn& fn) {
  const int n = world.size();
  world.ResetFinished();
  std::mutex mu;
  std::vector<std::pair<int, absl::Status>> failures;  // in the order they happened
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::Status status;
      {
        tensor::ScopedLedger scoped(&world.ledger(r));
        try {
          status = fn(r, world.group(r));
        } catch (const tensor::StatusError& e) {  // a collective's failure, its code kept
          status = e.status();
        } catch (const std::invalid_argument& e) {
          status = absl::InvalidArgumentError(absl::StrCat("uncaught exception: ", e.what()));
        } catch (const std::bad_alloc& e) {  // tensor::OutOfMemoryError says where and how much
          status = absl::ResourceExhaustedError(e.what());
        } catch (...) {
          status = tensor::StatusOfCurrentException("uncaught exception: ");
        }
      }
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        failures.emplace_back(r, status);
      }
      world.MarkRankFinished(r, status);
    });
  }
  for (std::thread& t : threads) t.join();
  world.WaitIdle();
  if (failures.empty()) return absl::OkStatus();
  const auto& [first_rank, first] = failures.front();
  std::string message = absl::StrCat("rank ", first_rank, ": ", first.message());
  if (failures.size() > 1) {
    // Ranks that failed alike (the same check on every rank) are named
    // together, their status once: as the first's, "ranks 0, 1: the same".
    std::vector<std::pair<absl::Status, std::vector<int>>> groups;  // in order of first failure
    for (size_t i = 1; i < failures.size(); ++i) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == failures[i].second; });
      if (it == groups.end()) it = groups.insert(groups.end(), {failures[i].second, {}});
      it->second.push_back(failures[i].first);
    }
    std::vector<std::string> others;
    for (auto& [status, ranks] : groups) {
      std::sort(ranks.begin(), ranks.end());
      const std::string who =
          absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
      if (status == first) {
        others.insert(others.begin(), absl::StrCat(who, ": the same"));
      } else {
        others.push_back(absl::StrCat(who, ": ", status.ToString()));
      }
    }
    absl::StrAppend(&message, " [then: ", absl::StrJoin(others, "; "), "]");
  }
  return absl::Status(first.code(), message);
}

}  // namespace internal
}  // namespace dist
