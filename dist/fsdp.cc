#include "dist/fsdp.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "nn/checkpoint.h"
#include "optim/clip_grad.h"
#include "precision/loss_scaler.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"

namespace dist {

const char* ShardingStrategyName(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard:
      return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard:
      return "NO_SHARD";
    case ShardingStrategy::kHybridShard:
      return "HYBRID_SHARD";
    case ShardingStrategy::kHybridShardZero2:
      return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

bool IsHybrid(ShardingStrategy s) {
  return s == ShardingStrategy::kHybridShard || s == ShardingStrategy::kHybridShardZero2;
}

bool ReshardsAfterForward(ShardingStrategy s) {
  return s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard;
}

const char* BackwardPrefetchName(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kPre:
      return "BACKWARD_PRE";
    case BackwardPrefetch::kPost:
      return "BACKWARD_POST";
    case BackwardPrefetch::kNone:
      return "NONE";
  }
  return "?";
}

namespace internal {

// What the units of one model share: the pass counter, the unit order recorded
// in the last forward and backward (for prefetch), the reduce-scatters in
// flight, the no_sync flag and the prefetch counts.
struct FsdpShared {
  FsdpOptions options;
  std::vector<FsdpUnit*> units;  // units[0] is the root
  // Incremented at the root's PreForward: gathers of an earlier pass are stale.
  int64_t pass = 0;
  // Unit ids in the order PreForward / PreBackward ran in the last complete
  // pass, and the ones of the pass running now. Forward-only passes (the
  // root held by Unshard / UnshardRoot) keep an order of their own: they may
  // run other units than training does (T5's decoding steps run the decoder
  // alone), and would otherwise make the next training forward's prefetch
  // gather units it does not run next.
  std::vector<int> training_forward_order, forward_only_order, backward_order;
  std::vector<int> forward_now, backward_now;
  // Per unit: the units its PreForward / PreBackward prefetches explicitly
  // (SetForwardPrefetch / SetBackwardPrefetch), or none set: the recorded
  // order's prefetch.
  std::vector<std::optional<std::vector<int>>> explicit_forward, explicit_backward;
  // Reduce-scatters issued and not yet finished, oldest first.
  std::vector<FsdpUnit*> pending_reduces;
  bool require_sync = true;
  FullyShardedModel::PrefetchStats prefetch_stats;
  int64_t all_gathers = 0;  // of unit parameters, since FullyShard

  // A forward-only pass: the root is held (Unshard / UnshardRoot), so no
  // backward follows it (one would throw).
  bool forward_only() const;
  // The recorded forward order for the kind of pass running now.
  std::vector<int>& forward_order();

  bool recorded(const std::vector<int>& order, const std::vector<int>& now) const {
    return now.size() <= order.size() && std::equal(now.begin(), now.end(), order.begin());
  }
  // Issues the all-gathers of the units that follow `now` in `order` (when the
  // pass so far matches it), up to max_inflight_all_gathers not yet used.
  void Prefetch(const std::vector<int>& order, const std::vector<int>& now);
  // Issues the all-gathers of `ids` (an explicit list) not issued this pass.
  void PrefetchUnits(const std::vector<int>& ids);
  void FinishReducesBefore(size_t keep);  // finishes all but the newest `keep`
  // At the end of a pass: reshards the units prefetched and not used (the
  // pass ran other units than its recorded order said), which would
  // otherwise hold their memory and count against max_inflight_all_gathers
  // until their next use.
  void FreeUnusedPrefetches();
  // At the root's PostBackward: frees the units the backward did not reach (a
  // model's backward stops below its lowest trainable parameter), which
  // SHARD_GRAD_OP and SetReshardAfterForward(false) kept gathered for it.
  void ReshardUnitsBackwardSkipped();
};

class FsdpUnit : public nn::ModuleHooks {
 public:
  // `shard_pg`: the group this unit is sharded over; `replicate_pg`: HYBRID_SHARD's
  // group of ranks holding the same shard (else null). `kept_fp32`: parameters
  // of modules the mixed-precision policy keeps fp32.
  FsdpUnit(int id, UnitPlan plan, FsdpShared& shared, ProcessGroup& shard_pg,
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
    if (param_dtype_ != tensor::Dtype::kF32) {
      for (const FlatParameter::Entry& e : flat_.entries()) {
        const bool keep = kept_fp32.count(e.param) > 0;
        keep_fp32_.push_back(keep);
        if (keep) gather_dtype_ = tensor::Dtype::kF32;  // gather fp32, cast the others
      }
    }
  }

  ~FsdpUnit() override {
    // Collectives still in flight complete (or time out) on their own; wait so
    // that no engine writes into buffers of a unit that is gone.
    if (gather_work_) gather_work_->Wait().IgnoreError();
    if (reduce_work_) reduce_work_->Wait().IgnoreError();
  }

  int id() const { return id_; }
  bool is_root() const { return id_ == 0; }
  const std::string& name() const { return name_; }
  nn::Module* module() const { return module_; }
  FlatParameter& flat() { return flat_; }
  bool no_shard() const { return strategy_ == ShardingStrategy::kNoShard; }
  // FullyShardedModel::SetReshardAfterForward: overrides the strategy's rule.
  void set_reshard_after_forward(bool reshard) { reshard_after_forward_ = reshard; }
  // Low-precision compute copies (param_dtype not f32).
  bool mixed() const { return param_dtype_ != tensor::Dtype::kF32; }
  // NO_SHARD in fp32 on the compute device: parameter values are views of
  // the (whole) shard itself; nothing is ever gathered.
  bool values_are_shard() const { return no_shard() && !mixed() && !offload_; }

  void Init(uint64_t seed) {
    // Offloaded shards live in page-locked host memory: they travel to the
    // GPU at every unshard and their gradients back at every reduce.
    flat_.InitShard(seed, offload_ ? tensor::Device::Cpu() : device_, /*pinned=*/offload_);
    if (values_are_shard()) flat_.SetValueViews(flat_.shard());
  }

  // Gathers the unsharded fp32 flat parameter into `out` (padded_numel, on
  // the compute device).
  void GatherInto(const tensor::Tensor& out) {
    tensor::Tensor send;
    {
      tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
      send = ShardOnDevice(tensor::Dtype::kF32);
    }
    Check(pg_.AllGatherSync(send, out), "all_gather");
  }

  // ---- Unsharding: issue (maybe early, a prefetch), then wait ----

  // True when this pass's gather is issued or done and not yet resharded.
  bool gathered_this_pass() const { return gather_pass_ == shared_.pass && full_.defined(); }
  bool prefetched() const { return prefetched_; }
  // Holds an unsharded flat parameter (gathered, prefetched or held).
  bool unsharded() const { return full_.defined(); }

  // Issues the all-gather of this pass unless already issued. `prefetch`: for
  // a later module (counted against max_inflight_all_gathers until used).
  void IssueUnshard(bool prefetch) {
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
      full_ = ShardOnDevice(gather_dtype_);
      return;
    }
    full_ = tensor::Tensor::Empty({flat_.padded_numel()}, gather_dtype_, device_);
    ++shared_.all_gathers;
    if (gather_dtype_ == tensor::Dtype::kF32 && !offload_) {
      gather_work_ = pg_.AllGather(flat_.shard(), full_);
    } else {
      tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
      gather_send_ = ShardOnDevice(gather_dtype_);
      gather_work_ = pg_.AllGather(gather_send_, full_);
    }
  }

  // Waits for this pass's gather and points the parameters at it.
  void WaitUnshard() {
    prefetched_ = false;
    if (values_are_shard() || held_) return;
    if (gather_work_) {
      WorkPtr work = std::move(gather_work_);
      gather_send_ = tensor::Tensor();
      Check(work->Wait(), "all_gather");
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

  void Unshard() {
    IssueUnshard(false);
    WaitUnshard();
  }

  // Gathered now, and kept so (hooks gather and free nothing) until Reshard
  // (FullyShardedModel::Unshard / UnshardRoot).
  void Hold() {
    WaitUnshard();
    held_ = true;
  }
  bool held() const { return held_; }

  void Reshard() {
    held_ = false;
    if (values_are_shard()) return;
    if (prefetched_) ++shared_.prefetch_stats.unused;
    if (gather_work_) Check(gather_work_->Wait(), "all_gather");  // unused prefetch
    gather_work_ = nullptr;
    gather_send_ = tensor::Tensor();
    flat_.ClearValues();
    full_ = tensor::Tensor();
    views_set_ = false;
    prefetched_ = false;
  }

  // ---- Hooks ----

  void PreForward(nn::Module&) override {
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

  void PostForward(nn::Module&) override {
    if (is_root()) {
      shared_.forward_order() = shared_.forward_now;
      shared_.FreeUnusedPrefetches();  // this pass left the recorded order
    }
    if (nn::IsRecomputing()) return;  // its backward follows at once
    // Forward-only passes free the unit under every strategy: SHARD_GRAD_OP
    // keeps it for a backward that will not come.
    if ((reshards_after_forward() || shared_.forward_only()) && !is_root() && !held_) Reshard();
  }

  void PreBackward(nn::Module&) override {
    OP_CHECK(!held_, "fsdp", "unit '", name_,
             "': backward while Unshard() holds the parameters (forward-only work); call "
             "Reshard() before training");
    if (is_root()) shared_.backward_now.clear();
    shared_.backward_now.push_back(id_);
    IssueUnshard(false);
    if (const auto& next = shared_.explicit_backward[id_]) {
      shared_.PrefetchUnits(*next);
    } else if (shared_.options.backward_prefetch == BackwardPrefetch::kPre) {
      shared_.Prefetch(shared_.backward_order, shared_.backward_now);
    }
    WaitUnshard();
    flat_.CheckFrozenUnchanged();
    if (!flat_.trains()) return;  // frozen: the input gradients only, nothing to reduce
    if (full_grad_.defined()) {  // accumulated under no_sync: added to
      flat_.SetGradViews(full_grad_);
    } else {  // new, not zeroed: the backward writes each parameter's gradient
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
      full_grad_ = tensor::Tensor::Empty({flat_.padded_numel()}, tensor::Dtype::kF32, device_);
      flat_.ZeroUncoveredGrad(full_grad_);
      flat_.SetGradViews(full_grad_, /*unwritten=*/true);
    }
  }

  void PostBackward(nn::Module&) override {
    OP_CHECK(full_grad_.defined() || !flat_.trains(), "fsdp", "unit '", name_,
             "': post-backward without pre-backward");
    flat_.ZeroUnwrittenGrads();  // parameters this backward did not reach
    flat_.ClearGrads();
    if (!shared_.explicit_backward[id_] &&
        shared_.options.backward_prefetch == BackwardPrefetch::kPost) {
      shared_.Prefetch(shared_.backward_order, shared_.backward_now);
    }
    if (shared_.require_sync && flat_.trains()) {
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
    }
  }

  // ---- Gradient reduction ----

  // Issues the reduce-scatter (all-reduce under NO_SHARD) of the unsharded
  // gradient in reduce_dtype; the buffers live until FinishReduce.
  void IssueReduce() {
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
    } else {
      reduce_out_ = reduce_buf_.Narrow(0, flat_.shard_begin(), flat_.shard_numel());
      reduce_work_ = pg_.ReduceScatter(reduce_buf_, reduce_out_, ReduceOp::kAvg);
    }
  }

  // Waits for the reduce, averages over the replicas (HYBRID_SHARD) and adds
  // the result into the fp32 gradient shard (offloaded: copied to the host
  // in reduce_dtype first).
  void FinishReduce() {
    WorkPtr work = std::move(reduce_work_);
    Check(work->Wait(), no_shard() ? "all_reduce" : "reduce_scatter");
    if (replicate_pg_ != nullptr) {
      Check(replicate_pg_->AllReduceSync(reduce_out_, ReduceOp::kAvg), "all_reduce (replicas)");
    }
    if (reduce_out_.device() != flat_.grad_shard().device()) {  // offloaded
      tensor::ScopedMemoryCategory comm(tensor::MemoryCategory::kCommunication);
      tensor::Tensor host = tensor::Tensor::EmptyPinned(reduce_out_.shape(), reduce_out_.dtype());
      host.CopyFrom(reduce_out_);
      reduce_out_ = host;
    }
    flat_.AccumulateGradShard(reduce_out_);  // written when ZeroGrad dropped it
    reduce_out_ = tensor::Tensor();
    reduce_buf_ = tensor::Tensor();
  }

  // Drops the unsharded gradient accumulated under no_sync.
  void DropAccumulatedGrad() { full_grad_ = tensor::Tensor(); }

 private:
  bool reshards_after_forward() const {
    return reshard_after_forward_.value_or(ReshardsAfterForward(strategy_));
  }

  // This rank's shard in `dtype` on the compute device: the shard itself, or
  // a copy (offloaded: cast on the host first, into page-locked memory, so
  // fewer bytes cross to the device).
  tensor::Tensor ShardOnDevice(tensor::Dtype dtype) const {
    tensor::Tensor shard = flat_.shard();
    if (dtype != shard.dtype()) {
      if (offload_) {
        tensor::Tensor cast = tensor::Tensor::EmptyPinned(shard.shape(), dtype);
        cast.CopyFrom(shard);
        shard = cast;
      } else {
        shard = shard.To(dtype);
      }
    }
    return shard.To(device_);
  }

  void Check(const absl::Status& s, const char* what) {
    OP_CHECK(s.ok(), "fsdp", "unit '", name_.empty() ? "<root>" : name_, "' ", what, ": ",
             s.ToString());
  }

  int id_;
  std::string name_;
  nn::Module* module_;
  FsdpShared& shared_;
  ProcessGroup& pg_;
  ProcessGroup* replicate_pg_;
  ShardingStrategy strategy_;
  tensor::Device device_;  // compute
  bool offload_;           // shards in host memory
  tensor::Dtype param_dtype_;
  tensor::Dtype reduce_dtype_;
  tensor::Dtype gather_dtype_ = tensor::Dtype::kF32;
  std::vector<bool> keep_fp32_;  // per flat entry (mixed precision only)
  FlatParameter flat_;
  // Unsharding: the unsharded flat parameter (padded_numel, gather dtype;
  // undefined while sharded), the pass it was gathered in, the all-gather in
  // flight and its low-precision send buffer.
  tensor::Tensor full_;
  int64_t gather_pass_ = -1;
  bool held_ = false;  // Hold() until Reshard()
  WorkPtr gather_work_;
  tensor::Tensor gather_send_;
  bool views_set_ = false;
  bool prefetched_ = false;
  std::optional<bool> reshard_after_forward_;  // unset: the strategy's rule
  // The unsharded fp32 gradient (padded_numel; from PreBackward to
  // PostBackward, or across backwards under no_sync), and the reduce in
  // flight: its buffer (reduce dtype) and where this rank's result lands.
  tensor::Tensor full_grad_;
  tensor::Tensor reduce_buf_;
  tensor::Tensor reduce_out_;
  WorkPtr reduce_work_;
};

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

void FsdpShared::PrefetchUnits(const std::vector<int>& ids) {
  for (int id : ids) {
    if (!units[id]->gathered_this_pass()) units[id]->IssueUnshard(/*prefetch=*/true);
  }
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

void FsdpShared::FinishReducesBefore(size_t keep) {
  while (pending_reduces.size() > keep) {
    FsdpUnit* u = pending_reduces.front();
    pending_reduces.erase(pending_reduces.begin());
    u->FinishReduce();
  }
}

}  // namespace internal

FullyShardedModel::FullyShardedModel(nn::Module& root, ProcessGroup& pg, FsdpOptions options)
    : root_(&root),
      pg_(&pg),
      options_(std::move(options)),
      ledger_(&tensor::MemoryLedger::Current()),
      shared_(std::make_unique<internal::FsdpShared>()) {
  const tensor::Device device = options_.device;
  if (device.is_cuda()) {
    OP_CHECK(tensor::cuda::Built(), "FullyShard", "device ", device.ToString(),
             ": this binary was built without CUDA support (build with --config=cuda)");
    const int count = tensor::cuda::DeviceCount();
    OP_CHECK(device.index >= 0 && device.index < count, "FullyShard", "device ",
             device.ToString(), " is not available: this machine has ", count,
             " CUDA device(s)");
  }
  OP_CHECK(!options_.cpu_offload || device.is_cuda(), "FullyShard", "cpu_offload keeps shards ",
           "in host memory instead of the compute device's; with device ", device.ToString(),
           " they are there already (offload needs a CUDA device)");
  {
    absl::Status s = options_.mixed_precision.Validate(device);
    OP_CHECK(s.ok(), "FullyShard", "mixed precision: ", s.ToString());
  }
  OP_CHECK(options_.max_inflight_all_gathers >= 1, "FullyShard", "max_inflight_all_gathers=",
           options_.max_inflight_all_gathers, " must be >= 1 (1: no prefetch)");
  ProcessGroup* shard_pg = &pg;
  ProcessGroup* replicate_pg = nullptr;
  if (IsHybrid(options_.strategy)) {
    const int g = options_.hybrid_shard_group_size;
    OP_CHECK(g >= 1 && pg.size() % g == 0, "FullyShard", ShardingStrategyName(options_.strategy),
             ": hybrid_shard_group_size=", g, " must be >= 1 and divide the world size ",
             pg.size());
    // Shard groups: consecutive ranks (a node); replicate groups: the ranks
    // with the same index in their shard group.
    absl::StatusOr<std::unique_ptr<ProcessGroup>> shard = pg.Split(pg.rank() / g);
    OP_CHECK(shard.ok(), "FullyShard", "HYBRID_SHARD shard group: ", shard.status().ToString());
    absl::StatusOr<std::unique_ptr<ProcessGroup>> replicate = pg.Split(pg.rank() % g);
    OP_CHECK(replicate.ok(), "FullyShard", "HYBRID_SHARD replicate group: ",
             replicate.status().ToString());
    shard_pg_ = std::move(*shard);
    replicate_pg_ = std::move(*replicate);
    shard_pg = shard_pg_.get();
    replicate_pg = replicate_pg_->size() > 1 ? replicate_pg_.get() : nullptr;
  }
  shared_->options = options_;
  std::set<const nn::Parameter*> kept_fp32;
  if (options_.mixed_precision.IsMixed()) {
    for (auto& [prefix, module] : root.NamedModules()) {
      if (!options_.mixed_precision.KeepsFp32(module->class_name())) continue;
      for (auto& [name, p] : module->LocalParameters()) kept_fp32.insert(p);
    }
  }
  // Buffers (BatchNorm's running statistics) are not sharded: every rank
  // keeps its own on the compute device.
  for (auto& [name, buffer] : root.NamedBuffers()) {
    if (buffer->defined() && buffer->device() != device) *buffer = buffer->To(device);
  }
  std::vector<UnitPlan> plans = PlanUnits(root, options_.policy);
  for (size_t i = 0; i < plans.size(); ++i) {
    OP_CHECK(plans[i].module->hooks() == nullptr, "FullyShard", "module '", plans[i].name,
             "' already has hooks");
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].params.empty() && i != 0) continue;  // a unit with nothing to shard
    auto unit = std::make_unique<internal::FsdpUnit>(static_cast<int>(units_.size()),
                                                     std::move(plans[i]), *shared_, *shard_pg,
                                                     replicate_pg, kept_fp32);
    unit->Init(options_.seed);
    unit->module()->set_hooks(unit.get());
    shared_->units.push_back(unit.get());
    units_.push_back(std::move(unit));
  }
  shared_->explicit_forward.resize(units_.size());
  shared_->explicit_backward.resize(units_.size());
}

FullyShardedModel::~FullyShardedModel() {
  for (auto& u : units_) u->module()->set_hooks(nullptr);
}

const std::string& FullyShardedModel::unit_name(int i) const { return units_.at(i)->name(); }

int FullyShardedModel::unit_index(const std::string& name) const {
  std::string names;
  for (size_t i = 0; i < units_.size(); ++i) {
    if (units_[i]->name() == name) return static_cast<int>(i);
    absl::StrAppend(&names, i == 0 ? "" : ", ", "'", units_[i]->name(), "'");
  }
  tensor::ThrowOpError("fsdp", "'", name, "' is not an FSDP unit; the units are ", names,
                       " (the root is '')");
}

namespace {

// The unit indices of `next`, checked for SetForwardPrefetch /
// SetBackwardPrefetch (`what`) of unit `unit`.
std::vector<int> PrefetchList(const FullyShardedModel& m, const char* what, const std::string& unit,
                              const std::vector<std::string>& next) {
  std::vector<int> ids;
  for (const std::string& name : next) {
    OP_CHECK(name != unit, what, "unit '", unit, "' cannot prefetch itself");
    const int id = m.unit_index(name);
    OP_CHECK(std::find(ids.begin(), ids.end(), id) == ids.end(), what, "unit '", unit, "': '", name,
             "' is listed twice");
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

void FullyShardedModel::SetForwardPrefetch(const std::string& unit,
                                           const std::vector<std::string>& next) {
  const int id = unit_index(unit);
  shared_->explicit_forward[id] = PrefetchList(*this, "SetForwardPrefetch", unit, next);
}

void FullyShardedModel::SetBackwardPrefetch(const std::string& unit,
                                            const std::vector<std::string>& next) {
  const int id = unit_index(unit);
  shared_->explicit_backward[id] = PrefetchList(*this, "SetBackwardPrefetch", unit, next);
}
const FlatParameter& FullyShardedModel::flat_param(int i) const { return units_.at(i)->flat(); }

int FullyShardedModel::shard_group_rank() const { return units_.front()->flat().shard_index(); }
int FullyShardedModel::shard_group_size() const { return units_.front()->flat().num_shards(); }

int FullyShardedModel::replica_index() const {
  if (options_.strategy == ShardingStrategy::kNoShard) return pg_->rank();
  if (IsHybrid(options_.strategy)) return pg_->rank() / shard_group_size();
  return 0;
}

int FullyShardedModel::num_replicas() const {
  if (options_.strategy == ShardingStrategy::kNoShard) return pg_->size();
  if (IsHybrid(options_.strategy)) return pg_->size() / shard_group_size();
  return 1;
}

FullyShardedModel::NoSyncGuard::NoSyncGuard(FullyShardedModel* m)
    : m_(m), previous_(m->shared_->require_sync) {
  m_->shared_->require_sync = false;
}

FullyShardedModel::NoSyncGuard::~NoSyncGuard() { m_->shared_->require_sync = previous_; }

std::string FullyShardedModel::param_ref_name(int i) const {
  const std::string& name = units_.at(i)->name();
  return "fsdp." + (name.empty() ? std::string("root") : name);
}

std::vector<optim::ParamRef> FullyShardedModel::ParamRefs() {
  ZeroUnreducedGradShards();
  std::vector<optim::ParamRef> refs;
  for (size_t i = 0; i < units_.size(); ++i) {
    auto& u = units_[i];
    if (!u->flat().trains()) continue;  // every parameter frozen
    optim::ParamRef r;
    r.name = param_ref_name(static_cast<int>(i));
    r.param = u->flat().shard();
    r.grad = u->flat().grad_shard();
    r.decay_ranges = u->flat().shard_decay_ranges();
    r.frozen_ranges = u->flat().shard_frozen_ranges();
    refs.push_back(std::move(r));
  }
  return refs;
}

void FullyShardedModel::ZeroGrad(bool set_to_none) {
  for (auto& u : units_) {
    u->DropAccumulatedGrad();
    if (set_to_none) {
      u->flat().DropGradShard();
    } else {
      u->flat().ZeroGradShard();
    }
  }
}

void FullyShardedModel::ZeroUnreducedGradShards() {
  for (auto& u : units_) u->flat().ZeroGradShardIfUnwritten();
}

FullyShardedModel::PrefetchStats FullyShardedModel::prefetch_stats() const {
  return shared_->prefetch_stats;
}

int64_t FullyShardedModel::all_gathers() const { return shared_->all_gathers; }

void FullyShardedModel::SetReshardAfterForward(const std::string& unit, bool reshard) {
  const int id = unit_index(unit);
  OP_CHECK(id != 0, "SetReshardAfterForward", "the root unit is kept unsharded from its forward ",
           "to its backward, which starts right after it");
  OP_CHECK(options_.strategy != ShardingStrategy::kNoShard, "SetReshardAfterForward", "unit '",
           unit, "': under NO_SHARD every rank holds its whole unit; there is nothing to ",
           "reshard");
  units_[id]->set_reshard_after_forward(reshard);
}

void FullyShardedModel::Reshard() {
  for (auto& u : units_) u->Reshard();
}

void FullyShardedModel::Unshard() { Hold(units_.size()); }

void FullyShardedModel::UnshardRoot() { Hold(1); }

void FullyShardedModel::Hold(size_t num_units) {
  Reshard();        // nothing held from an earlier pass: its shards may have changed
  ++shared_->pass;  // a pass of its own: every gather below is fresh
  for (size_t i = 0; i < num_units; ++i) {
    units_[i]->IssueUnshard(/*prefetch=*/false);  // all in flight at once
  }
  for (size_t i = 0; i < num_units; ++i) units_[i]->Hold();
}

double FullyShardedModel::ClipGradNorm(double max_norm) {
  if (options_.strategy == ShardingStrategy::kNoShard) {
    return optim::ClipGradNorm(ParamRefs(), max_norm);  // every rank has the whole gradient
  }
  // Hybrid strategies: the shard group holds every element once (replicas agree).
  ProcessGroup* group = shard_pg_ ? shard_pg_.get() : pg_;
  return optim::ClipGradNorm(ParamRefs(), max_norm, [group](double local) {
    absl::StatusOr<double> sum = SumOverRanks(*group, local);  // exact, the same on every rank
    OP_CHECK(sum.ok(), "fsdp", "clip_grad_norm all_gather: ", sum.status().ToString());
    return *sum;
  });
}

bool FullyShardedModel::UnscaleGradsAndCheck(double inv_scale) {
  ZeroUnreducedGradShards();
  std::vector<tensor::Tensor> grads;
  grads.reserve(units_.size());
  for (auto& u : units_) {
    if (u->flat().trains()) grads.push_back(u->flat().grad_shard());
  }
  const bool found =
      precision::ScaleAndCheckNonFinite(absl::MakeSpan(grads), static_cast<float>(inv_scale));
  // Under every strategy some rank may hold an inf the others do not (a shard
  // of it, or its own gradient before an all-reduce that already spread it):
  // agree on the OR of the flags.
  absl::StatusOr<bool> any = AnyOverRanks(*pg_, found);
  OP_CHECK(any.ok(), "fsdp", "unscale_grads all_reduce: ", any.status().ToString());
  return *any;
}

std::vector<std::pair<std::string, tensor::Tensor>> FullyShardedModel::FullStateDict() {
  std::map<std::string, tensor::Tensor> gathered;
  const bool keep = pg_->rank() == 0;
  for (auto& u : units_) {
    FlatParameter& flat = u->flat();
    tensor::Tensor full;
    if (u->no_shard()) {
      full = flat.shard();
    } else {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
      full = tensor::Tensor::Empty({flat.padded_numel()}, tensor::Dtype::kF32, options_.device);
      u->GatherInto(full);
    }
    if (!keep) continue;
    for (const FlatParameter::Entry& e : flat.entries()) {
      tensor::Tensor view = full.Narrow(0, e.offset, e.numel).View(e.param->shape);
      gathered[e.name] = view.device().is_cpu() ? view.Clone() : view.To(tensor::Device::Cpu());
    }
  }
  std::vector<std::pair<std::string, tensor::Tensor>> out;
  if (!keep) return out;
  for (auto& [name, p] : root_->NamedParameters()) {
    auto it = gathered.find(name);
    OP_CHECK(it != gathered.end(), "FullStateDict", "parameter ", name, " is in no unit");
    out.emplace_back(name, it->second);
  }
  return out;
}

void PrefetchNeighbors(FullyShardedModel& model, int k) {
  OP_CHECK(k >= 0, "PrefetchNeighbors", "k=", k, " must be >= 0 (0: none)");
  if (k == 0) return;
  const int n = model.num_units();
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> ahead, behind;
    for (int j = i + 1; j < n && j <= i + k; ++j) ahead.push_back(model.unit_name(j));
    // Backward runs the root first, then the units from the last one down.
    const int before = i == 0 ? n : i;
    for (int j = before - 1; j >= 1 && j >= before - k; --j) behind.push_back(model.unit_name(j));
    model.SetForwardPrefetch(model.unit_name(i), ahead);
    model.SetBackwardPrefetch(model.unit_name(i), behind);
  }
}

std::unique_ptr<FullyShardedModel> FullyShard(nn::Module& root, ProcessGroup& pg,
                                              FsdpOptions options) {
  return std::unique_ptr<FullyShardedModel>(new FullyShardedModel(root, pg, std::move(options)));
}

}  // namespace dist
