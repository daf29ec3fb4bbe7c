// The `nccl` engine (see nccl_group.h): its CUDA and NCCL side. The host-side
// logic (unique id exchange, the call thread, timeouts naming the missing
// ranks, tensor rules) lives in nccl_rendezvous and nccl_worker, which are
// tested without a GPU; this file enqueues the NCCL calls and polls events.
#include "dist/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/launch_layout.h"
#include "dist/nccl_comm.h"
#include "dist/nccl_env.h"
#include "dist/nccl_launch_order.h"
#include "dist/nccl_rendezvous.h"
#include "dist/nccl_worker.h"
#include "dist/rank_names.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl engine needs NCCL >= 2.18 (non-blocking communicators, ncclCommSplit)"
#endif

namespace dist {
namespace {

using nccl::AbortWithin;
using nccl::AsStream;
using nccl::CallsLock;
using nccl::ClearNotReady;
using nccl::Comm;
using nccl::CommPtr;
using nccl::CommReady;
using nccl::CudaCheck;
using nccl::DeviceGuard;
using nccl::LockCalls;
using nccl::MakeComm;
using nccl::NcclError;
using nccl::NcclOp;
using nccl::NcclType;
using nccl::Prefixed;
using tensor::Dtype;

// One collective: waits for the compute stream's event, enqueues the NCCL
// call on the communication stream, records the completion event.
class NcclCollective final : public nccl::PendingCall {
 public:
  NcclCollective(Comm* comm, std::shared_ptr<CollectiveCall> call)
      : comm_(comm), call_(std::move(call)) {}
  ~NcclCollective() override {
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (done_ != nullptr) cudaEventDestroy(done_);
  }

  // On the issuing thread, with the group's device current: marks the point
  // of `compute` the call waits for.
  absl::Status RecordReady(cudaStream_t compute) {
    absl::Status s = CudaCheck(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming),
                               "cudaEventCreateWithFlags");
    if (s.ok()) {
      s = CudaCheck(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
                    "cudaEventCreateWithFlags");
    }
    if (s.ok()) s = CudaCheck(cudaEventRecord(ready_, compute), "cudaEventRecord (compute stream)");
    return s;
  }

  absl::Status Start() override {
    absl::Status s =
        CudaCheck(cudaStreamWaitEvent(comm_->stream, ready_, 0), "cudaStreamWaitEvent");
    if (!s.ok()) return s;
    {
      absl::StatusOr<CallsLock> lock =
          LockCalls(comm_->calls(), call_->timeout, "enqueuing the NCCL call");
      if (!lock.ok()) return lock.status();
      const ncclResult_t result = Launch();
      if (result == ncclInProgress) return absl::OkStatus();  // Enqueued() completes it.
      if (result != ncclSuccess) return NcclError(result, "enqueuing the NCCL call", comm_->comm);
    }
    return RecordDone();
  }

  absl::StatusOr<bool> Enqueued() override {
    if (recorded_) return true;
    absl::StatusOr<bool> ready = CommReady(comm_->comm, comm_->calls());
    if (!ready.ok() || !*ready) return ready;
    if (absl::Status s = RecordDone(); !s.ok()) return s;
    return true;
  }

  absl::StatusOr<bool> Finished() override {
    // NCCL's error first (as PyTorch): a communicator that failed or was
    // aborted (a peer's call differed, a peer aborted) can let the done
    // event complete without the collective having run, and the call must
    // not then look successful over an output nothing wrote.
    bool busy = false;
    absl::StatusOr<bool> state = CommReady(comm_->comm, comm_->calls(), &busy);
    if (!state.ok()) return state.status();
    if (busy) return false;  // NCCL's error unread: not the event alone
    const cudaError_t err = cudaEventQuery(done_);
    if (err == cudaSuccess) return true;
    if (err != cudaErrorNotReady) return CudaCheck(err, "cudaEventQuery");
    ClearNotReady();
    return false;
  }

 private:
  absl::Status RecordDone() {
    recorded_ = true;
    return CudaCheck(cudaEventRecord(done_, comm_->stream),
                     "cudaEventRecord (communication stream)");
  }

  ncclResult_t Launch() {
    const CollectiveCall& c = *call_;
    ncclComm_t comm = comm_->comm;
    cudaStream_t stream = comm_->stream;
    switch (c.kind) {
      case CollectiveKind::kAllReduce:
        return ncclAllReduce(c.input.raw_data(), c.input.raw_data(),
                             static_cast<size_t>(c.input.numel()), NcclType(c.input.dtype()),
                             NcclOp(c.op), comm, stream);
      case CollectiveKind::kReduceScatter:
        return ncclReduceScatter(c.input.raw_data(), c.output.raw_data(),
                                 static_cast<size_t>(c.output.numel()), NcclType(c.input.dtype()),
                                 NcclOp(c.op), comm, stream);
      case CollectiveKind::kAllGather:
        return ncclAllGather(c.input.raw_data(), c.output.raw_data(),
                             static_cast<size_t>(c.input.numel()), NcclType(c.input.dtype()), comm,
                             stream);
      case CollectiveKind::kBroadcast:
        return ncclBroadcast(c.input.raw_data(), c.input.raw_data(),
                             static_cast<size_t>(c.input.numel()), NcclType(c.input.dtype()),
                             c.root, comm, stream);
      case CollectiveKind::kBarrier:
        return ncclAllReduce(comm_->barrier, comm_->barrier, 1, ncclFloat32, ncclSum, comm, stream);
    }
    return ncclInvalidArgument;
  }

  Comm* const comm_;
  const std::shared_ptr<CollectiveCall> call_;  // Keeps the tensors alive.
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool recorded_ = false;
};

// ncclCommSplit of the parent communicator; runs once the earlier calls have
// finished. Aborts the new communicator unless TakeChild() took it.
class NcclSplit final : public nccl::PendingCall {
 public:
  NcclSplit(Comm* parent, int color, int key, absl::Duration timeout)
      : parent_(parent), color_(color), key_(key), timeout_(timeout) {
    config_.blocking = 0;
  }
  ~NcclSplit() override {
    if (child_ != nullptr) AbortWithin(child_, parent_->device, "a split that failed");
  }

  bool NeedsIdle() const override { return true; }

  absl::Status Start() override {
    absl::StatusOr<CallsLock> lock = LockCalls(parent_->calls(), timeout_, "ncclCommSplit");
    if (!lock.ok()) return lock.status();
    const ncclResult_t result = ncclCommSplit(
        parent_->comm, color_ < 0 ? NCCL_SPLIT_NOCOLOR : color_, key_, &child_, &config_);
    if (result != ncclSuccess && result != ncclInProgress) {
      return NcclError(result, "ncclCommSplit", parent_->comm);
    }
    return absl::OkStatus();
  }

  // The split is "enqueued" once done, so no later call starts meanwhile.
  absl::StatusOr<bool> Enqueued() override { return Finished(); }

  absl::StatusOr<bool> Finished() override {
    absl::StatusOr<bool> parent = CommReady(parent_->comm, parent_->calls());
    if (!parent.ok() || !*parent || child_ == nullptr) return parent;
    return CommReady(child_, parent_->calls());  // of the same family
  }

  // The new communicator (nullptr for a negative color), once finished.
  ncclComm_t TakeChild() {
    ncclComm_t child = child_;
    child_ = nullptr;
    return child;
  }

 private:
  Comm* const parent_;
  const int color_;
  const int key_;
  const absl::Duration timeout_;  // the split's
  ncclConfig_t config_ = NCCL_CONFIG_INITIALIZER;
  ncclComm_t child_ = nullptr;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  // `launch_order` is shared with the group this one was split from, if any.
  // `label`: a subgroup's, as errors name it (nccl::Who); "" for the world.
  // `world_rank`: this rank's in the world group (-1: `rank`, the world's).
  NcclProcessGroup(int rank, int size, Store* store, CommPtr comm,
                   const NcclGroupOptions& options,
                   std::shared_ptr<nccl::LaunchOrder> launch_order, std::string label = "",
                   int world_rank = -1)
      : ProcessGroup(options.timeout),
        rank_(rank),
        size_(size),
        label_(std::move(label)),
        world_rank_(world_rank >= 0 ? world_rank : rank),
        store_(store),
        prefix_(options.prefix),
        report_wait_(options.report_wait),
        peer_check_interval_(options.peer_check_interval),
        compute_stream_(AsStream(options.compute_stream)),
        launch_order_(std::move(launch_order)),
        comm_(std::move(comm)),
        worker_(WorkerOptions()) {}

  // The worker finishes the calls in flight (each within its timeout); then
  // the communicator is finalized and destroyed (~Comm: three steps, each
  // waiting up to the group's current timeout), or else aborted within
  // kAbortWait: up to 3 timeouts and kAbortWait in all.
  ~NcclProcessGroup() override { comm_->finalize_timeout = timeout(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view backend() const override { return "nccl"; }

  void set_compute_stream(void* stream) { compute_stream_ = AsStream(stream); }
  const std::shared_ptr<nccl::LaunchOrder>& launch_order() const { return launch_order_; }
  int device() const { return comm_->device; }
  void* communication_stream() const { return comm_->stream; }

 protected:
  std::string Who() const override { return nccl::Who(rank_, size_, label_); }

  WorkPtr Issue(std::shared_ptr<CollectiveCall> call) override {
    // A refused call breaks a group of several ranks (CallWorker::Refuse):
    // the peers make it, and this rank's next call would pair with theirs.
    if (!call->error.ok()) {
      return worker_.Refuse(std::string(CollectiveName(call->kind)), call->timeout, call->error);
    }
    if (OnlyCpuTensors(*call)) return Work::Done(RunStaged(*call));
    const cudaStream_t after =
        call->ready_stream != nullptr ? AsStream(call->ready_stream) : compute_stream_;
    return IssueOnDevice(std::move(call), after);
  }

  absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int color, int key,
                                                        absl::Duration timeout) override;

 private:
  static bool OnlyCpuTensors(const CollectiveCall& call) {
    if (call.kind == CollectiveKind::kBarrier) return false;
    return call.input.device().is_cpu() &&
           (!call.output.defined() || call.output.device().is_cpu());
  }

  // A call on CPU tensors: copies them to the device (on the legacy default
  // stream, which the call then waits for), runs the call there and waits for
  // it, then copies the result back. Out of place on the device, so the
  // in-place forms need nothing special.
  absl::Status RunStaged(const CollectiveCall& call) {
    const std::string op(CollectiveName(call.kind));
    const tensor::Device device = tensor::Device::Cuda(comm_->device);
    auto staged = std::make_shared<CollectiveCall>(call);
    try {
      staged->input = call.input.To(device);
      if (call.output.defined()) {
        staged->output = tensor::Tensor::Empty(call.output.shape(), call.output.dtype(), device);
      }
    } catch (...) {
      const absl::Status refusal = tensor::StatusOfCurrentException(
          absl::StrCat("staging the CPU tensors on ", device.ToString(), ": "));
      return worker_.Refuse(op, call.timeout, Prefixed(refusal, op, rank_, size_, label_))
          ->Wait();
    }
    const bool result_in_input =
        call.kind == CollectiveKind::kAllReduce || call.kind == CollectiveKind::kBroadcast;
    absl::Status status = IssueOnDevice(staged, cudaStreamLegacy)->Wait();
    if (!status.ok()) return status;
    try {
      tensor::Tensor target = result_in_input ? call.input : call.output;
      target.CopyFrom((result_in_input ? staged->input : staged->output).To(tensor::Device::Cpu()));
    } catch (const std::exception& e) {
      return Prefixed(absl::InternalError(absl::StrCat("copying the result back from ",
                                                       device.ToString(), ": ", e.what())),
                      op, rank_, size_, label_);
    }
    return absl::OkStatus();
  }

  // Issues a call on device tensors, ordered after the work queued so far on
  // `after`.
  WorkPtr IssueOnDevice(std::shared_ptr<CollectiveCall> call, cudaStream_t after) {
    const tensor::Device device = tensor::Device::Cuda(comm_->device);
    const std::string op(CollectiveName(call->kind));
    if (absl::Status s = nccl::CheckNcclTensors(*call, device, rank_, size_, label_); !s.ok()) {
      return worker_.Refuse(op, call->timeout, s);
    }
    if (!worker_.broken().ok()) return Work::Done(worker_.BrokenError(op));
    DeviceGuard guard(comm_->device);
    auto pending = std::make_shared<NcclCollective>(comm_.get(), call);
    if (absl::Status s = pending->RecordReady(after); !s.ok()) {
      return worker_.Refuse(op, call->timeout, Prefixed(s, op, rank_, size_, label_));
    }
    return worker_.Submit(op, call->timeout, std::move(pending));
  }

  nccl::CallWorkerOptions WorkerOptions();

  const int rank_;
  const int size_;
  const std::string label_;  // "world/split0/color1" in a subgroup; "" in the world group
  const int world_rank_;     // this rank's in the world group
  Store* const store_;
  const std::string prefix_;
  const absl::Duration report_wait_;
  const absl::Duration peer_check_interval_;
  cudaStream_t compute_stream_;  // Issuing thread only.
  int split_seq_ = 0;            // Issuing thread only.
  // This rank's calls on this group and the groups split from it reach NCCL
  // in the order they were issued (nccl_launch_order.h), whichever group's
  // worker gets to them first.
  const std::shared_ptr<nccl::LaunchOrder> launch_order_;
  // Declared before the worker, which uses it, so destroyed after it.
  const CommPtr comm_;
  nccl::CallWorker worker_;
};

absl::StatusOr<std::unique_ptr<ProcessGroup>> NcclProcessGroup::DoSplit(int color, int key,
                                                                        absl::Duration timeout) {
  const int seq = split_seq_++;
  auto split = std::make_shared<NcclSplit>(comm_.get(), color, key, timeout);
  if (absl::Status s = worker_.Submit("split", timeout, split)->Wait(); !s.ok()) return s;
  ncclComm_t child = split->TakeChild();
  if (color < 0) {
    if (child != nullptr) AbortWithin(child, comm_->device, "split");
    return std::unique_ptr<ProcessGroup>();
  }
  if (child == nullptr) {
    return Prefixed(
        absl::InternalError(absl::StrCat("NCCL made no communicator for color ", color)), "split",
        rank_, size_, label_);
  }
  int new_rank = 0;
  int new_size = 0;
  absl::Status counted;
  if (absl::StatusOr<CallsLock> lock =
          LockCalls(comm_->calls(), this->timeout(), "ncclCommUserRank/ncclCommCount");
      !lock.ok()) {
    counted = lock.status();
  } else {
    ncclResult_t result = ncclCommUserRank(child, &new_rank);
    if (result == ncclSuccess) result = ncclCommCount(child, &new_size);
    if (result != ncclSuccess) {
      counted = NcclError(result, "ncclCommUserRank/ncclCommCount", child);
    }
  }
  if (!counted.ok()) {
    AbortWithin(child, comm_->device, "split");
    return Prefixed(counted, "split", rank_, size_, label_);
  }
  DeviceGuard guard(comm_->device);
  absl::StatusOr<CommPtr> comm = MakeComm(child, comm_->device, this->timeout(), launch_order_);
  if (!comm.ok()) return Prefixed(comm.status(), "split", rank_, size_, label_);
  NcclGroupOptions options;
  options.prefix = absl::StrCat(prefix_, "/split", seq, "/color", color);
  options.timeout = this->timeout();
  options.report_wait = report_wait_;
  options.peer_check_interval = peer_check_interval_;
  options.compute_stream = compute_stream_ == cudaStreamPerThread ? nullptr : compute_stream_;
  // The peers' errors name this rank by its world rank too (a failed Set
  // only leaves it out of them: "(world ?)").
  if (store_ != nullptr) {
    store_->Set(nccl::WorldRankKey(options.prefix, new_rank), absl::StrCat(world_rank_))
        .IgnoreError();
  }
  return std::unique_ptr<ProcessGroup>(new NcclProcessGroup(
      new_rank, new_size, store_, *std::move(comm), options, launch_order_,
      internal::SubgroupLabel(label_, seq, color),
      world_rank_));
}

nccl::CallWorkerOptions NcclProcessGroup::WorkerOptions() {
  nccl::CallWorkerOptions options;
  options.rank = rank_;
  options.size = size_;
  options.label = label_;
  options.store = store_;
  options.prefix = prefix_;
  options.report_wait = report_wait_;
  options.peer_check_interval = peer_check_interval_;
  options.launch_order = launch_order_;
  const int device = comm_->device;
  options.on_thread_start = [device] { cudaSetDevice(device); };
  Comm* comm = comm_.get();
  // The abort drains the stream for up to `drain` after NCCL's abort
  // returns; past that and a margin, NCCL's abort is what hangs.
  const absl::Duration drain = comm_->finalize_timeout;
  options.abort = [comm, drain] { comm->Abort(drain); };
  options.abort_timeout = drain + absl::Seconds(30);
  options.abandon = [comm](std::vector<std::shared_ptr<nccl::PendingCall>> calls) {
    comm->kept_calls = std::move(calls);
    comm->abandoned = true;
  };
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateNcclProcessGroup(
    int rank, int size, int device_index, Store& store, const NcclGroupOptions& options) {
  nccl::ChooseNcclEnvironment();  // before NCCL reads it (its first init)
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("[nccl_init] invalid rank ", rank, " for a group of size ", size));
  }
  std::shared_ptr<nccl::LaunchOrder> launch_order = std::make_shared<nccl::LaunchOrder>();
  if (options.launch_order_with != nullptr) {
    auto* other = dynamic_cast<NcclProcessGroup*>(options.launch_order_with);
    if (other == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "[nccl_init] launch_order_with: the group's engine is ",
          options.launch_order_with->backend(), ", not nccl"));
    }
    if (other->device() != device_index) {
      return absl::InvalidArgumentError(absl::StrCat(
          "[nccl_init] launch_order_with: that group runs on cuda:", other->device(),
          ", this one on cuda:", device_index,
          ": the order is one rank's (another rank's group would make the two ranks wait "
          "for each other's turns)"));
    }
    launch_order = other->launch_order();
  }
  if (options.peer_check_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("[nccl_init] peer_check_interval must be > 0 (InfiniteDuration: ",
                     "never), not ", absl::FormatDuration(options.peer_check_interval)));
  }
  const std::string who = nccl::Who(rank, size);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (device_index < 0 || device_index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("[nccl_init] ", who, ": device cuda:", device_index, " does not exist (",
                     count, " CUDA devices visible)"));
  }
  // The rank's device becomes, and stays, this thread's current one (one
  // process per GPU, as torch.cuda.set_device(local_rank) before
  // init_process_group). Restoring the one before -- cuda:0 on a thread that
  // never chose -- would make CUDA 12+ create a context on GPU 0 for every rank.
  if (const cudaError_t err = cudaSetDevice(device_index); err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("[nccl_init] ", who, ": cudaSetDevice(",
                                                      device_index,
                                                      ") failed: ", cudaGetErrorString(err)));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  // The nodes' launches agree (within the init's timeout) before any id is set.
  const internal::LaunchLayout me{rank, size, options.local_rank, options.local_world_size};
  internal::DistLayoutStore layout_store(store);
  if (absl::Status s =
          internal::ClaimAndCheckLayout(layout_store, options.prefix, me, deadline, who);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> id = nccl::ExchangeUniqueId(
      store, options.prefix, rank, size, sizeof(ncclUniqueId),
      []() -> absl::StatusOr<std::string> {
        ncclUniqueId unique;
        const ncclResult_t result = ncclGetUniqueId(&unique);
        if (result != ncclSuccess) return NcclError(result, "ncclGetUniqueId", nullptr);
        return std::string(unique.internal, sizeof(unique.internal));
      },
      options.timeout);
  if (!id.ok()) return id.status();
  ncclUniqueId unique;
  std::memcpy(unique.internal, id->data(), sizeof(unique.internal));
  if (absl::Status s = nccl::MarkInitArrival(store, options.prefix, rank); !s.ok()) {
    return Prefixed(s, "nccl_init", rank, size);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Init runs in the background: it can time out.
  ncclComm_t nccl_comm = nullptr;
  ncclResult_t result;
  {
    absl::StatusOr<CallsLock> lock =
        LockCalls(launch_order->NcclCalls(), options.timeout, "ncclCommInitRankConfig");
    if (!lock.ok()) return Prefixed(lock.status(), "nccl_init", rank, size);
    result = ncclCommInitRankConfig(&nccl_comm, size, unique, rank, &config);
  }
  if (result != ncclSuccess && result != ncclInProgress) {
    const absl::Status s = NcclError(result, "ncclCommInitRankConfig", nccl_comm);
    if (nccl_comm != nullptr) AbortWithin(nccl_comm, device_index, "init");
    return Prefixed(s, "nccl_init", rank, size);
  }
  // Waits for the init, looking every 50 ms for a rank that announced it
  // failed before joining (launch_layout.h): the init then never completes.
  absl::Status peer_failed;
  absl::Time next_look = absl::Now();
  absl::StatusOr<bool> ready = nccl::PollUntil(
      [&]() -> absl::StatusOr<bool> {
        if (absl::Now() >= next_look) {
          next_look = absl::Now() + absl::Milliseconds(50);
          peer_failed = nccl::PeerFailure(layout_store, options.prefix, size, who);
          if (!peer_failed.ok()) return peer_failed;
        }
        return CommReady(nccl_comm, launch_order->NcclCalls());
      },
      deadline, nccl::Clock(), absl::Milliseconds(1));
  if (!ready.ok() || !*ready) {
    absl::Status s =
        ready.ok() ? nccl::InitTimeoutError(store, options.prefix, rank, size, options.timeout, "")
        : !peer_failed.ok() ? peer_failed
                            : Prefixed(ready.status(), "nccl_init", rank, size);
    if (absl::StrContains(s.message(), "Duplicate GPU")) {  // NCCL's words for it
      s = absl::Status(
          s.code(),
          absl::StrCat(s.message(), ": two ranks of this group are on one GPU. NCCL needs one "
                       "GPU per rank: check CUDA_VISIBLE_DEVICES and the ranks a node runs "
                       "(--nproc_per_node), or share a GPU with the threads engine"));
    }
    AbortWithin(nccl_comm, device_index, "init");
    return s;
  }
  // A node launched for another world may have shown up meanwhile.
  if (absl::Status s = internal::CheckNoLayoutMismatch(layout_store, options.prefix, me, who);
      !s.ok()) {
    AbortWithin(nccl_comm, device_index, "init");
    return s;
  }
  absl::StatusOr<CommPtr> comm = MakeComm(nccl_comm, device_index, options.timeout, launch_order);
  if (!comm.ok()) return Prefixed(comm.status(), "nccl_init", rank, size);
  return std::unique_ptr<ProcessGroup>(
      new NcclProcessGroup(rank, size, &store, *std::move(comm), options,
                           std::move(launch_order)));
}

absl::Status SetNcclComputeStream(ProcessGroup& group, void* stream) {
  auto* nccl_group = dynamic_cast<NcclProcessGroup*>(&group);
  if (nccl_group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[nccl] SetNcclComputeStream: the group's engine is ", group.backend(), ", not nccl"));
  }
  nccl_group->set_compute_stream(stream);
  return absl::OkStatus();
}

absl::StatusOr<void*> NcclCommunicationStream(ProcessGroup& group) {
  auto* nccl_group = dynamic_cast<NcclProcessGroup*>(&group);
  if (nccl_group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[nccl] NcclCommunicationStream: the group's engine is ", group.backend(), ", not nccl"));
  }
  return nccl_group->communication_stream();
}

namespace internal {

absl::StatusOr<std::shared_ptr<std::timed_mutex>> NcclCallsLockForTesting(ProcessGroup& group) {
  auto* nccl_group = dynamic_cast<NcclProcessGroup*>(&group);
  if (nccl_group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[nccl] NcclCallsLockForTesting: the group's engine is ", group.backend(), ", not nccl"));
  }
  const std::shared_ptr<nccl::LaunchOrder>& family = nccl_group->launch_order();
  return std::shared_ptr<std::timed_mutex>(family, &family->NcclCalls());
}

}  // namespace internal

}  // namespace dist
