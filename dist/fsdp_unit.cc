// FSDP's unit (fsdp_unit.h): unsharding with prefetch, the hooks, and the
// gradient's reduce-scatter.
#include "dist/fsdp_unit.h"

#include <algorithm>
#include <map>
#include <utility>

#include "nn/checkpoint.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace internal {

FsdpUnit::FsdpUnit(int id, UnitPlan plan, FsdpShared& shared, ProcessGroup& shard_pg,
                   ProcessGroup* replicate_pg, const std::set<const nn::Parameter*>& kept_fp32)
    : id_(id),
      name_(plan.name),
      module_(plan.module),
      shared_(shared),
      pg_(shard_pg),
      replicate_pg_(replicate_pg),
      strategy_(shared.options.strategy),
      device_(shared.options.device),
      offload_(shared.options.cpu_offload),
      param_dtype_(shared.options.mixed_precision.param_dtype),
      // A group of one communicates nothing: keep the gradient fp32 (as
      // DDP and ZeRO-1 do), so world 1 equals one process bit for bit.
      reduce_dtype_(shard_pg.size() == 1 && replicate_pg == nullptr
                        ? tensor::Dtype::kF32
                        : shared.options.mixed_precision.reduce_dtype),
      flat_(std::move(plan.params), no_shard() ? 1 : shard_pg.size(),
            no_shard() ? 0 : shard_pg.rank()) {
  gather_dtype_ = param_dtype_;
  bool trains_kept = false;  // holds a trainable parameter kept fp32
  for (const FlatParameter::Entry& e : flat_.entries()) {
    const bool keep = kept_fp32.count(e.param) > 0;
    if (keep && !e.frozen) trains_kept = true;
    if (param_dtype_ == tensor::Dtype::kF32) continue;
    keep_fp32_.push_back(keep);
    if (keep) gather_dtype_ = tensor::Dtype::kF32;  // gather fp32, cast the others
  }
  // Kept parameters' gradients travel in fp32 too (as those of PyTorch's
  // fp32 units do). Under low precision FullyShard makes kept modules units
  // of their own, so a unit that trains a kept parameter holds kept ones only.
  if (trains_kept) reduce_dtype_ = tensor::Dtype::kF32;
}

FsdpUnit::~FsdpUnit() {
  // Collectives still in flight complete (or time out) on their own; wait so
  // that no engine writes into buffers of a unit that is gone.
  if (gather_work_) gather_work_->Wait().IgnoreError();
  if (reduce_work_) reduce_work_->Wait().IgnoreError();
  if (replicas_work_) replicas_work_->Wait().IgnoreError();
}

void FsdpUnit::Init(uint64_t seed) {
  // Offloaded shards live in page-locked host memory: they travel to the
  // GPU at every unshard and their gradients back at every reduce.
  flat_.InitShard(seed, offload_ ? tensor::Device::Cpu() : device_, /*pinned=*/offload_);
  if (values_are_shard()) flat_.SetValueViews(flat_.shard());
}

std::vector<tensor::Dtype> FsdpUnit::OffloadDtypes() const {
  std::vector<tensor::Dtype> dtypes;
  if (!offload_) return dtypes;
  if (flat_.trains()) dtypes.push_back(reduce_dtype_);
  // A low-precision copy of the shard cast on the host (NO_SHARD's uploads
  // on a GPU cast on the device: QueueUpload).
  if (gather_dtype_ != tensor::Dtype::kF32 && !(no_shard() && device_.is_cuda())) {
    dtypes.push_back(gather_dtype_);
  }
  return dtypes;
}

std::optional<tensor::Dtype> FsdpUnit::UploadDtype() const {
  if (!offload_ || no_shard()) return std::nullopt;
  return gather_dtype_;
}

void FsdpUnit::GatherInto(const tensor::Tensor& out) {
  tensor::Tensor send;
  {
    tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
    send = ShardOnDevice(tensor::Dtype::kF32);
  }
  Check(pg_.AllGatherSync(send, out), "all_gather");
}

void FsdpUnit::IssueUnshard(bool prefetch) {
  if (values_are_shard() || held_) return;
  if (gathered_this_pass()) {
    if (!prefetch) prefetched_ = false;  // in use now: no longer counted as ahead
    return;
  }
  // Held from an earlier pass (SHARD_GRAD_OP's units, the root after a
  // forward-only pass, a prefetch the pass did not use): stale, and freed
  // before the new buffer is allocated, so that a unit never holds two.
  if (full_.defined()) Reshard();
  gather_pass_ = shared_.pass;
  prefetched_ = prefetch;
  if (prefetch) ++shared_.prefetch_stats.issued;
  views_set_ = false;  // a new buffer: WaitUnshard points the values at it
  tensor::ScopedMemoryCategory params(tensor::MemoryCategory::kParameters);
  if (no_shard()) {  // a local cast and/or copy to the device, nothing to communicate
    full_ = shared_.queued_upload ? QueueUpload() : ShardOnDevice(gather_dtype_);
    return;
  }
  full_ = tensor::Tensor::Empty({flat_.padded_numel()}, gather_dtype_, device_);
  ++shared_.all_gathers;
  // Offloaded: the shard goes up on the uploads' stream when a slot is
  // free; the all-gather waits for it (and for this thread's work so far),
  // neither this thread's later kernels nor the host do.
  std::optional<OffloadUploads::Upload> up;
  if (offload_ && shared_.uploads) up = shared_.uploads->TryStart(flat_.shard(), gather_dtype_);
  if (up) {
    gather_slot_ = up->slot;
    CollectiveOptions after_upload;
    after_upload.ready_stream = up->ready_stream;
    gather_work_ = pg_.AllGather(up->values, full_, after_upload);
  } else if (gather_dtype_ == tensor::Dtype::kF32 && !offload_) {
    gather_work_ = pg_.AllGather(flat_.shard(), full_);
  } else {  // a copy (offloaded and no slot free: a blocking one)
    tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
    gather_send_ = ShardOnDevice(gather_dtype_);
    gather_work_ = pg_.AllGather(gather_send_, full_);
  }
}

void FsdpUnit::WaitUnshard() {
  prefetched_ = false;
  if (values_are_shard() || held_) return;
  if (gather_work_) {
    gather_send_ = tensor::Tensor();
    WaitGather();
  }
  if (views_set_) return;
  flat_.SetValueViews(full_);
  views_set_ = true;
  if (gather_dtype_ != param_dtype_) {
    // fp32 gather: cast the parameters not kept fp32 (as nn::MixedPrecision).
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    const auto& entries = flat_.entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!keep_fp32_[i]) entries[i].param->value = entries[i].param->value.To(param_dtype_);
    }
  }
}

void FsdpUnit::Unshard() {
  IssueUnshard(false);
  WaitUnshard();
}

void FsdpUnit::Hold() {
  WaitUnshard();
  held_ = true;
}

void FsdpUnit::Reshard() {
  held_ = false;
  if (values_are_shard()) return;
  if (prefetched_) ++shared_.prefetch_stats.unused;
  if (gather_work_) WaitGather();  // an unused prefetch
  DropGatherSlot(false);  // an upload whose all-gather was not issued (it threw)
  gather_send_ = tensor::Tensor();
  flat_.ClearValues();
  full_ = tensor::Tensor();
  views_set_ = false;
  prefetched_ = false;
}

void FsdpUnit::PreForward(nn::Module&) {
  if (nn::IsRecomputing()) {  // activation checkpointing, inside the backward
    Unshard();
    return;
  }
  if (is_root()) {
    ++shared_.pass;
    shared_.forward_now.clear();
    shared_.backward_now.clear();
  }
  shared_.forward_now.push_back(id_);
  IssueUnshard(false);
  if (const auto& next = shared_.explicit_forward[id_]) {
    shared_.PrefetchUnits(*next);
  } else if (shared_.options.forward_prefetch) {
    shared_.Prefetch(shared_.forward_order(), shared_.forward_now);
  }
  WaitUnshard();
}

void FsdpUnit::PostForward(nn::Module&) {
  if (is_root()) {
    shared_.forward_order() = shared_.forward_now;
    shared_.FreeUnusedPrefetches();  // this pass left the recorded order
  }
  if (nn::IsRecomputing()) {
    // The module recomputed: its backward follows at once, on these values.
    // A unit inside it (nested units, or units under a checkpointed
    // container) runs its backward only after the rest of the recompute:
    // freed now as after its forward, gathered again for its backward, so a
    // recompute holds one such unit at a time, not the whole region.
    if (nn::RecomputeRoot() != module_ && reshards_after_forward() && !is_root() && !held_) {
      Reshard();
    }
    return;
  }
  // Forward-only passes free the unit under every strategy: SHARD_GRAD_OP
  // keeps it for a backward that will not come.
  if ((reshards_after_forward() || shared_.forward_only()) && !is_root() && !held_) Reshard();
}

void FsdpUnit::PreBackward(nn::Module&) {
  OP_CHECK(!held_, "fsdp", "unit '", name_,
           "': backward while Unshard() holds the parameters (forward-only work); call "
           "Reshard() before training");
  if (is_root()) shared_.backward_now.clear();
  shared_.backward_now.push_back(id_);
  IssueUnshard(false);
  if (const auto& next = shared_.explicit_backward[id_]) {
    shared_.PrefetchUnits(*next, /*in_backward=*/true);
  } else if (shared_.options.backward_prefetch == BackwardPrefetch::kPre) {
    shared_.Prefetch(shared_.backward_order, shared_.backward_now);
  }
  WaitUnshard();
  flat_.CheckFrozenUnchanged();
  if (!flat_.trains()) return;  // frozen: the input gradients only, nothing to reduce
  // A gradient already there was written by a module outside this unit that
  // read the parameter (a tied weight): the views below would drop it.
  const std::string written = flat_.FirstWithGrad();
  OP_CHECK(written.empty(), "fsdp", "unit '", name_, "': ", written,
           " has a gradient before the unit's backward: a module outside the unit used it "
           "(a tied weight) and its gradient would be lost; wrap so that one unit holds the "
           "parameter and every module that uses it (the root, for a tied head: "
           "train::CheckTiedWeightsInRoot checks a policy). (Or a backward that threw left it: "
           "ZeroGrad() before the next backward.)");
  if (full_grad_.defined()) {   // accumulated under no_sync: added to
    flat_.SetGradViews(full_grad_);
  } else {  // new, not zeroed: the backward writes each parameter's gradient
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
    full_grad_ = tensor::Tensor::Empty({flat_.padded_numel()}, tensor::Dtype::kF32, device_);
    flat_.ZeroUncoveredGrad(full_grad_);
    flat_.SetGradViews(full_grad_, /*unwritten=*/true);
  }
}

void FsdpUnit::PostBackward(nn::Module&) {
  OP_CHECK(full_grad_.defined() || !flat_.trains(), "fsdp", "unit '", name_,
           "': post-backward without pre-backward");
  flat_.ZeroUnwrittenGrads();  // parameters this backward did not reach
  flat_.ClearGrads();
  if (!shared_.explicit_backward[id_] &&
      shared_.options.backward_prefetch == BackwardPrefetch::kPost) {
    shared_.Prefetch(shared_.backward_order, shared_.backward_now);
  }
  if (shared_.require_sync && flat_.trains()) {
    // A unit run twice in a forward (its backwards back to back, no other
    // unit's between): its first reduce finishes, into the gradient shard,
    // before the second is issued over the same buffers.
    if (reducing()) shared_.FinishReducesThrough(this);
    IssueReduce();
    shared_.pending_reduces.push_back(this);
  }
  // Keep this unit's reduce in flight while the next unit computes; the
  // root's finishes every one, also when the root has no parameter that
  // trains (its children all wrapped: the last unit's reduce was left in
  // flight past the optimizer step, and issued again over itself).
  if (shared_.require_sync) shared_.FinishReducesBefore(is_root() ? 0 : 1);
  Reshard();
  if (is_root()) {
    shared_.backward_order = shared_.backward_now;
    shared_.FreeUnusedPrefetches();
    shared_.ReshardUnitsBackwardSkipped();
    shared_.CheckNoGradientLeft();
  }
}

void FsdpUnit::IssueReduce() {
  if (reduce_dtype_ != tensor::Dtype::kF32) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    reduce_buf_ = full_grad_.To(reduce_dtype_);
    full_grad_ = tensor::Tensor();
  } else {
    reduce_buf_ = std::move(full_grad_);
  }
  if (no_shard()) {
    reduce_out_ = reduce_buf_;
    reduce_work_ = pg_.AllReduce(reduce_buf_, ReduceOp::kAvg);
    return;
  }
  if (replicate_pg_ != nullptr && pg_.size() > 1) {
    // A buffer of its own, which the replicas' all-reduce then averages in
    // place while reduce_buf_ is already freed (FinishReduce). (With shard
    // groups of 1 the shard is the whole buffer: the view below.)
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    reduce_out_ = tensor::Tensor::Empty({flat_.shard_numel()}, reduce_dtype_, device_);
  } else {
    reduce_out_ = reduce_buf_.Narrow(0, flat_.shard_begin(), flat_.shard_numel());
  }
  reduce_work_ = pg_.ReduceScatter(reduce_buf_, reduce_out_, ReduceOp::kAvg);
}

void FsdpUnit::FinishReduce() {
  WorkPtr work = std::move(reduce_work_);
  CheckReduced(work->Wait(), no_shard() ? "all_reduce" : "reduce_scatter");
  if (replicate_pg_ == nullptr) {
    AccumulateReduced();
    return;
  }
  reduce_buf_ = tensor::Tensor();  // read: the reduce-scatter has finished
  // Waits for nothing on the device (FsdpShared::replicas_ready); the host
  // goes on with the next unit's backward (FinishReplicas waits).
  CollectiveOptions options;
  if (shared_.replicas_ready) options.ready_stream = shared_.replicas_ready->stream;
  replicas_work_ = replicate_pg_->AllReduce(reduce_out_, ReduceOp::kAvg, options);
}

void FsdpUnit::FinishReplicas() {
  WorkPtr work = std::move(replicas_work_);
  CheckReduced(work->Wait(), "all_reduce (replicas)");
  AccumulateReduced();
}

void FsdpUnit::CheckReduced(const absl::Status& s, const char* what) {
  if (!s.ok()) {  // the collective has ended: its buffers go
    reduce_out_ = tensor::Tensor();
    reduce_buf_ = tensor::Tensor();
  }
  Check(s, what);
}

void FsdpUnit::AccumulateReduced() {
  if (reduce_out_.device() != flat_.grad_shard().device()) {  // offloaded
    tensor::Tensor host = shared_.OffloadStaging(reduce_out_.dtype(), reduce_out_.numel());
    // The reduce has finished (waited above): the copy waits for nothing else,
    // and the staging is free again after the accumulate below.
    shared_.CopyToHost(reduce_out_, host);
    reduce_out_ = host;
  }
  flat_.AccumulateGradShard(reduce_out_);  // written when ZeroGrad dropped it
  reduce_out_ = tensor::Tensor();
  reduce_buf_ = tensor::Tensor();
}

void FsdpUnit::WaitGather() {
  WorkPtr work = std::move(gather_work_);
  const absl::Status s = work->Wait();
  DropGatherSlot(s.ok());
  Check(s, "all_gather");
}

void FsdpUnit::DropGatherSlot(bool read_finished) {
  if (gather_slot_ >= 0 && read_finished) shared_.uploads->Release(gather_slot_);
  gather_slot_ = -1;
}

tensor::Tensor FsdpUnit::QueueUpload() {
  const tensor::Tensor& values = flat_.shard();  // [padded numel] f32, page-locked
  tensor::Tensor up;
  if (gather_dtype_ == values.dtype()) {
    up = tensor::Tensor::Empty(values.shape(), values.dtype(), device_);
  } else {  // cast below: the f32 copy is transient
    tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
    up = tensor::Tensor::Empty(values.shape(), values.dtype(), device_);
  }
  // After the thread's earlier kernels (the block's last users), before its
  // later ones (the unit's forward).
  tensor::cuda::CopyToDeviceOnStream(up.raw_data(), values.raw_data(), values.nbytes(),
                                     device_.index, /*stream=*/nullptr);
  tensor::cuda::RecordEvent(shared_.queued_upload->event, /*stream=*/nullptr, device_.index);
  shared_.upload_queued = true;
  return gather_dtype_ == values.dtype() ? up : up.To(gather_dtype_);
}

tensor::Tensor FsdpUnit::ShardOnDevice(tensor::Dtype dtype) const {
  tensor::Tensor shard = flat_.shard();
  if (dtype != shard.dtype()) {
    if (offload_) {
      tensor::Tensor cast = shared_.OffloadStaging(dtype, shard.numel());
      cast.CopyFrom(shard);
      shard = cast;  // copied to the device below, synchronously: the staging is free again
    } else {
      shard = shard.To(dtype);
    }
  }
  return shard.To(device_);
}

void FsdpUnit::Check(const absl::Status& s, const char* what) {
  tensor::ThrowIfError(s, "fsdp", "unit '", name_.empty() ? "<root>" : name_, "' ", what);
}

bool FsdpShared::forward_only() const { return units[0]->held(); }

std::vector<int>& FsdpShared::forward_order() {
  return forward_only() ? forward_only_order : training_forward_order;
}

void FsdpShared::Prefetch(const std::vector<int>& order, const std::vector<int>& now) {
  if (!recorded(order, now)) return;  // first pass, or the order changed
  int in_flight = 1;                  // the unit now running
  for (FsdpUnit* u : units) in_flight += u->prefetched() ? 1 : 0;
  for (size_t j = now.size(); j < order.size() && in_flight < options.max_inflight_all_gathers;
       ++j) {
    FsdpUnit* next = units[order[j]];
    if (next->gathered_this_pass()) continue;
    next->IssueUnshard(/*prefetch=*/true);
    ++in_flight;
  }
}

void FsdpShared::PrefetchUnits(const std::vector<int>& ids, bool in_backward) {
  // After a first pass of the kind, only the units it ran.
  const std::vector<int>* ran = in_backward      ? &backward_order
                                : forward_only() ? &forward_only_order
                                                 : nullptr;
  for (int id : ids) {
    if (ran != nullptr && !ran->empty() && std::find(ran->begin(), ran->end(), id) == ran->end()) {
      continue;  // the last pass of its kind did not run it
    }
    if (!units[id]->gathered_this_pass()) units[id]->IssueUnshard(/*prefetch=*/true);
  }
}

FsdpShared::SideStream::SideStream(int device)
    : device(device), stream(tensor::cuda::CreateStream(device)) {}

FsdpShared::SideStream::~SideStream() { tensor::cuda::DestroyStream(stream, device); }

FsdpShared::SideEvent::SideEvent(int device)
    : device(device), event(tensor::cuda::CreateEvent(device)) {}

FsdpShared::SideEvent::~SideEvent() { tensor::cuda::DestroyEvent(event, device); }

void FsdpShared::WaitQueuedUploads() {
  if (!upload_queued) return;
  tensor::cuda::SynchronizeEvent(queued_upload->event, queued_upload->device);
  upload_queued = false;
}

void FsdpShared::CopyToHost(const tensor::Tensor& device_values, tensor::Tensor& host) const {
  OP_CHECK(offload_stream != nullptr && device_values.device().is_cuda() &&
               device_values.device().index == offload_stream->device,
           "fsdp", "offload copy: no offload stream for ", device_values.device().ToString(),
           " (cpu_offload runs on a GPU)");
  OP_CHECK(device_values.is_contiguous() && host.is_contiguous() &&
               device_values.dtype() == host.dtype() && device_values.numel() == host.numel(),
           "fsdp", "offload copy: mismatched buffers");
  tensor::cuda::CopyToHostOnStream(host.raw_data(), device_values.raw_data(),
                                   device_values.nbytes(), offload_stream->device,
                                   offload_stream->stream);
  tensor::cuda::SynchronizeStream(offload_stream->stream, offload_stream->device);
}

void FsdpShared::AllocateOffloadStaging(const tensor::Device& device) {
  if (device.is_cuda()) offload_stream = std::make_unique<SideStream>(device.index);
  std::map<tensor::Dtype, int64_t> numel;  // the largest shard per dtype
  std::map<tensor::Dtype, int64_t> upload_numel;
  std::map<tensor::Dtype, int> uploaders;  // units gathered in the dtype
  for (FsdpUnit* u : units) {
    for (tensor::Dtype d : u->OffloadDtypes()) {
      numel[d] = std::max(numel[d], u->flat().shard_numel());
    }
    if (const std::optional<tensor::Dtype> d = u->UploadDtype()) {
      upload_numel[*d] = std::max(upload_numel[*d], u->flat().shard_numel());
      ++uploaders[*d];
    }
  }
  tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
  for (const auto& [dtype, n] : numel) {
    offload_staging[dtype] = tensor::Tensor::EmptyPinned({n}, dtype);
  }
  const bool no_shard = std::any_of(units.begin(), units.end(),
                                    [](const FsdpUnit* u) { return u->no_shard(); });
  if (device.is_cuda() && no_shard) queued_upload = std::make_unique<SideEvent>(device.index);
  if (device.is_cuda() && !upload_numel.empty()) {
    uploads = std::make_unique<OffloadUploads>(device.index);
    for (const auto& [dtype, n] : upload_numel) {
      uploads->Reserve(dtype, n, std::min(options.max_inflight_all_gathers, uploaders[dtype]));
    }
  }
}

tensor::Tensor FsdpShared::OffloadStaging(tensor::Dtype dtype, int64_t numel) const {
  const auto it = offload_staging.find(dtype);
  OP_CHECK(it != offload_staging.end() && it->second.numel() >= numel, "fsdp",
           "no offload staging buffer of ", numel, " ", tensor::DtypeName(dtype),
           " values (FullyShard allocates them)");
  return it->second.Narrow(0, 0, numel);
}

void FsdpShared::FreeUnusedPrefetches() {
  for (FsdpUnit* u : units) {
    if (u->prefetched()) u->Reshard();
  }
}

void FsdpShared::ReshardUnitsBackwardSkipped() {
  for (FsdpUnit* u : units) {
    if (u->is_root() || u->held() || !u->unsharded()) continue;
    if (std::find(backward_now.begin(), backward_now.end(), u->id()) == backward_now.end()) {
      u->Reshard();
    }
  }
}

void FsdpShared::CheckNoGradientLeft() const {
  for (const FsdpUnit* u : units) {
    const std::string written = u->flat().FirstWithGrad();
    OP_CHECK(written.empty(), "fsdp", "unit '", u->name(), "': ", written,
             " has a gradient after the unit's backward: a module outside the unit used it "
             "(a tied weight) and its gradient is not reduced; wrap so that one unit holds the "
             "parameter and every module that uses it");
  }
}

void FsdpShared::FinishReducesThrough(const FsdpUnit* unit) {
  auto pending = [unit](const std::vector<FsdpUnit*>& units) {
    return std::find(units.begin(), units.end(), unit) != units.end();
  };
  while (pending(pending_reduces)) FinishOldestReduce();
  while (pending(pending_replicas)) FinishOldestReplicas();
}

void FsdpShared::FinishReducesBefore(size_t keep) {
  // Each reduce finished may issue a replicas' all-reduce: no more than
  // max(keep, 1) stay in flight behind it, also while every one finishes.
  while (pending_reduces.size() > keep) {
    FinishOldestReduce();
    while (pending_replicas.size() > std::max<size_t>(keep, 1)) FinishOldestReplicas();
  }
  while (pending_replicas.size() > keep) FinishOldestReplicas();
}

void FsdpShared::FinishOldestReduce() {
  FsdpUnit* u = pending_reduces.front();
  pending_reduces.erase(pending_reduces.begin());
  u->FinishReduce();
  if (u->averaging_replicas()) pending_replicas.push_back(u);
}

void FsdpShared::FinishOldestReplicas() {
  FsdpUnit* u = pending_replicas.front();
  pending_replicas.erase(pending_replicas.begin());
  u->FinishReplicas();
}

}  // namespace internal
}  // namespace dist
