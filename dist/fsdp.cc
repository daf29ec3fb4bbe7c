// FullyShardedModel (fsdp.h): builds the units of a model from its wrap plan,
// and the model-wide calls (parameters, gradients, clipping, state dicts).
#include "dist/fsdp.h"

#include <algorithm>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/fsdp_unit.h"
#include "nn/fp32_modules.h"
#include "nn/state_dict.h"
#include "optim/clip_grad.h"
#include "precision/loss_scaler.h"
#include "tensor/allocator.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"

namespace dist {
namespace {

// Every rank learns which ranks failed a step (an all-gather of one flag per
// rank), so that all stop together instead of the peers waiting in their
// next collective for a rank that left: a rank that failed rethrows its own
// exception, the others throw an error naming the ranks that failed -- an
// OutOfMemoryError when every one of them ran out of memory (the job needs
// less memory per rank, as sync_module_states says too), else an OpError.
// Its buffers are made first, before the step that may run out of memory.
class FailureAgreement {
 public:
  FailureAgreement(ProcessGroup& pg, tensor::Device device) : pg_(pg) {
    if (pg.size() == 1) return;
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    mine_ = tensor::Tensor::Zeros({1}, tensor::Dtype::kF32, device);
    all_ = tensor::Tensor::Empty({pg.size()}, tensor::Dtype::kF32, device);  // (size,)
  }

  void AgreeOrRethrow(const std::exception_ptr& local, absl::string_view what) {
    if (pg_.size() == 1) {
      if (local) std::rethrow_exception(local);
      return;
    }
    if (local) tensor::Fill(mine_, IsOutOfMemory(local) ? kShort : kFailed);
    const absl::Status s = pg_.AllGatherSync(mine_, all_);
    if (local) std::rethrow_exception(local);  // this rank's own error first
    tensor::ThrowIfError(s, "FullyShard", "agreeing that every rank finished ", what);
    const std::vector<float> flags = all_.To(tensor::Device::Cpu()).ToVector<float>();
    std::vector<int> failed;
    bool all_short = true;
    for (int r = 0; r < pg_.size(); ++r) {
      if (flags[r] == 0.0f) continue;
      failed.push_back(r);
      all_short = all_short && flags[r] == kShort;
    }
    if (!failed.empty() && all_short) {
      throw tensor::OutOfMemoryError(absl::StrCat("[FullyShard] ", what, " failed on rank(s) ",
                                                  absl::StrJoin(failed, ", "),
                                                  ", out of memory (see their errors)"));
    }
    OP_CHECK(failed.empty(), "FullyShard", what, " failed on rank(s) ",
             absl::StrJoin(failed, ", "), " (see their errors)");
  }

 private:
  static constexpr float kFailed = 1, kShort = 2;  // a rank's flag: failed, out of memory

  static bool IsOutOfMemory(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  ProcessGroup& pg_;
  tensor::Tensor mine_;  // (1,): 0, or kFailed / kShort when this rank failed
  tensor::Tensor all_;   // (size,)
};

// sync_module_states: rank 0's values of each unit's parameters, broadcast
// in one flat buffer (the unit's size, on `device`, for the engine), become
// every rank's; the unit's shard is then taken from them. Every rank makes
// its buffer (rank 0 also fills it) before any value moves, and says in one
// all-gather whether it could, rank 0 also which value it lacks: all ranks
// then throw alike (a rank that failed its own error; its peers an
// OutOfMemoryError naming the ranks short of memory, else an OpError naming
// the ranks that failed; an OpError when rank 0 lacks a value) instead of
// some waiting in the broadcast for a rank that left it. The exchange's
// buffers are made once, before the first unit.
class UnitValuesBroadcast {
 public:
  UnitValuesBroadcast(ProcessGroup& pg, tensor::Device device) : pg_(pg), device_(device) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    said_ = tensor::Tensor::Empty({2}, tensor::Dtype::kF32, device);
    all_ = tensor::Tensor::Empty({2 * pg.size()}, tensor::Dtype::kF32, device);
  }

  void Run(const std::vector<std::pair<std::string, nn::Parameter*>>& params) {
    int64_t numel = 0;
    int missing = -1;  // this rank's first parameter without a value
    for (size_t i = 0; i < params.size(); ++i) {
      numel += params[i].second->shape.numel();
      if (missing < 0 && !params[i].second->value.defined()) missing = static_cast<int>(i);
    }
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    tensor::Tensor flat;  // (numel,)
    std::exception_ptr failure;
    bool short_of_memory = false;
    try {
      flat = tensor::Tensor::Empty({numel}, tensor::Dtype::kF32, device_);
      if (pg_.rank() == 0 && missing < 0) {
        int64_t offset = 0;
        for (const auto& [name, p] : params) {
          const int64_t n = p->shape.numel();
          flat.Narrow(0, offset, n).CopyFrom(p->value.Reshape({n}));
          offset += n;
        }
      }
    } catch (const std::bad_alloc&) {
      failure = std::current_exception();
      short_of_memory = true;
    } catch (...) {
      failure = std::current_exception();
    }
    // (2,) per rank: [0 ready, 1 short of memory, 2 failed otherwise; its `missing` + 1].
    tensor::Fill(said_.Narrow(0, 0, 1), failure ? (short_of_memory ? 1.0 : 2.0) : 0.0);
    tensor::Fill(said_.Narrow(0, 1, 1), static_cast<double>(missing + 1));
    absl::Status s = pg_.AllGatherSync(said_, all_);
    if (failure) std::rethrow_exception(failure);  // this rank's own error first
    tensor::ThrowIfError(s, "FullyShard", "sync_module_states");
    const std::vector<float> told = all_.To(tensor::Device::Cpu()).ToVector<float>();  // (2 size,)
    std::vector<int> short_ranks, failed_ranks;
    for (int r = 0; r < pg_.size(); ++r) {
      if (told[2 * r] == 1.0f) short_ranks.push_back(r);
      if (told[2 * r] == 2.0f) failed_ranks.push_back(r);
    }
    const auto ranks = [](const std::vector<int>& r) {
      return absl::StrCat(r.size() == 1 ? "rank " : "ranks ", absl::StrJoin(r, ", "));
    };
    if (!short_ranks.empty()) {
      throw tensor::OutOfMemoryError(absl::StrCat(
          "[FullyShard] sync_module_states: ", ranks(short_ranks),
          " ran out of memory making the buffer for rank 0's ", numel, " values (see ",
          short_ranks.size() == 1 ? "its" : "their", " error); no value moved"));
    }
    OP_CHECK(failed_ranks.empty(), "FullyShard", "sync_module_states: ", ranks(failed_ranks),
             " failed to make the buffer for rank 0's ", numel, " values (see ",
             failed_ranks.size() == 1 ? "its" : "their", " error); no value moved");
    const int rank0_missing = static_cast<int>(told[1]) - 1;
    OP_CHECK(rank0_missing < 0, "FullyShard", "sync_module_states: rank 0's parameter '",
             params[rank0_missing].first,
             "' is not materialized (rank 0's values become every rank's: it must have them all)");
    s = pg_.BroadcastSync(flat, 0);
    tensor::ThrowIfError(s, "FullyShard", "sync_module_states");
    int64_t offset = 0;
    for (const auto& [name, p] : params) {
      const int64_t n = p->shape.numel();
      p->value = flat.Narrow(0, offset, n).View(p->shape);
      offset += n;
    }
  }

 private:
  ProcessGroup& pg_;
  tensor::Device device_;
  tensor::Tensor said_;  // (2,)
  tensor::Tensor all_;   // (2 * size,)
};

}  // namespace

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
    OP_CHECK(device.index >= 0 && device.index < count, "FullyShard", "device ", device.ToString(),
             " is not available: this machine has ", count, " CUDA device(s)");
  }
  OP_CHECK(!options_.cpu_offload || device.is_cuda(), "FullyShard", "cpu_offload keeps shards ",
           "in host memory instead of the compute device's; with device ", device.ToString(),
           " they are there already (offload needs a CUDA device)");
  {
    absl::Status s = options_.mixed_precision.Validate(device);
    OP_CHECK(s.ok(), "FullyShard", "mixed precision: ", s.ToString());
  }
  OP_CHECK(options_.max_inflight_all_gathers >= 1, "FullyShard",
           "max_inflight_all_gathers=", options_.max_inflight_all_gathers,
           " must be >= 1 (1: no prefetch)");
  // The model and the policy, before anything changes it or communicates.
  {
    absl::Status s = options_.policy.CheckMatches(root);
    OP_CHECK(s.ok(), "FullyShard", s.message());
  }
  // Modules kept fp32 (BatchNorm) become units of their own under mixed precision.
  std::vector<UnitPlan> plans =
      PlanUnits(root, options_.policy.ForMixedPrecision(options_.mixed_precision));
  for (size_t i = 0; i < plans.size(); ++i) {
    OP_CHECK(plans[i].module->hooks() == nullptr, "FullyShard",
             plans[i].name.empty() ? std::string("the root module")
                                   : absl::StrCat("module '", plans[i].name, "'"),
             " is wrapped already (FullyShard, DDP or ZeRO-1 hooks on it): wrap a model once");
    for (const auto& [name, p] : plans[i].params) {
      OP_CHECK(p->held_by.empty(), "FullyShard", "parameter '", name, "' is held by ", p->held_by,
               " already: wrap a model once");
    }
    // The root unit's optimizer state is "fsdp.root" (param_ref_name).
    OP_CHECK(i == 0 || plans[i].name != "root", "FullyShard",
             "a unit is named 'root', as the root unit's optimizer state is (\"fsdp.root\"): "
             "rename that module");
  }
  OP_CHECK(IsHybrid(options_.strategy) || options_.hybrid_shard_group_size == 0, "FullyShard",
           "hybrid_shard_group_size=", options_.hybrid_shard_group_size, " applies to ",
           "HYBRID_SHARD and HYBRID_SHARD_ZERO2 only; ", ShardingStrategyName(options_.strategy),
           " uses all ", pg.size(), " ranks as one group (leave it 0)");
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
    tensor::ThrowIfError(shard.status(), "FullyShard", "HYBRID_SHARD shard group");
    absl::StatusOr<std::unique_ptr<ProcessGroup>> replicate = pg.Split(pg.rank() % g);
    tensor::ThrowIfError(replicate.status(), "FullyShard", "HYBRID_SHARD replicate group");
    shard_pg_ = std::move(*shard);
    replicate_pg_ = std::move(*replicate);
    shard_pg = shard_pg_.get();
    replicate_pg = replicate_pg_->size() > 1 ? replicate_pg_.get() : nullptr;
  }
  shared_->options = options_;
  // Computed and reduced in fp32 (FsdpUnit), whatever the policy's dtypes.
  const std::set<const nn::Parameter*> kept_fp32 =
      nn::KeptFp32Parameters(root, options_.mixed_precision.fp32_module_classes);
  FailureAgreement agreement(pg, device);
  // Buffers (BatchNorm's running statistics) are not sharded: every rank
  // keeps its own on the compute device. Moving them there may run out of
  // memory on some ranks only: the ranks agree before any collective (a model
  // without buffers, the same on every rank, exchanges nothing).
  const auto buffers = root.NamedBuffers();
  if (!buffers.empty()) {
    std::exception_ptr move_failure;
    try {
      for (auto& [name, buffer] : buffers) {
        if (buffer->defined() && buffer->device() != device) *buffer = buffer->To(device);
      }
    } catch (...) {
      move_failure = std::current_exception();
    }
    agreement.AgreeOrRethrow(move_failure,
                             absl::StrCat("moving its buffers to ", device.ToString()));
  }
  for (auto& [name, buffer] : buffers) {
    if (options_.sync_module_states && buffer->defined()) {
      absl::Status s = pg.BroadcastSync(*buffer, 0);
      tensor::ThrowIfError(s, "FullyShard", "sync_module_states: buffer ", name);
    }
  }
  // A unit's Init reads this rank's shard (--init_from's file, out of
  // memory): it may fail on some ranks only. Those ranks skip the later
  // Inits but keep making the same collectives, and all agree below.
  std::exception_ptr init_failure;  // this rank's first
  if (replicate_pg != nullptr && device.is_cuda()) {
    try {
      shared_->replicas_ready = std::make_unique<internal::FsdpShared::SideStream>(device.index);
    } catch (...) {
      init_failure = std::current_exception();
    }
  }
  std::optional<UnitValuesBroadcast> broadcast;
  if (options_.sync_module_states) broadcast.emplace(pg, device);
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].params.empty() && i != 0) continue;  // a unit with nothing to shard
    if (broadcast) broadcast->Run(plans[i].params);
    auto unit =
        std::make_unique<internal::FsdpUnit>(static_cast<int>(units_.size()), std::move(plans[i]),
                                             *shared_, *shard_pg, replicate_pg, kept_fp32);
    if (!init_failure) {
      try {
        unit->Init(options_.seed);
      } catch (...) {
        init_failure = std::current_exception();
      }
    }
    shared_->units.push_back(unit.get());
    units_.push_back(std::move(unit));
  }
  if (options_.cpu_offload && !init_failure) {
    try {
      shared_->AllocateOffloadStaging(options_.device);
    } catch (...) {
      init_failure = std::current_exception();
    }
  }
  agreement.AgreeOrRethrow(init_failure, "initializing its FSDP units");
  // Hooks last: a unit that fails above (a peer lost during
  // sync_module_states, rank 0 missing a value, out of memory) throws before
  // any module points at a unit, so nothing dangles once units_ is freed.
  shared_->explicit_forward.resize(units_.size());
  shared_->explicit_backward.resize(units_.size());
  for (auto& unit : units_) {
    unit->module()->set_hooks(unit.get());
    const std::string holder = unit->name().empty()
                                   ? std::string("the FSDP root unit")
                                   : absl::StrCat("FSDP unit '", unit->name(), "'");
    for (const FlatParameter::Entry& e : unit->flat().entries()) e.param->held_by = holder;
  }
}

FullyShardedModel::~FullyShardedModel() {
  for (auto& u : units_) {
    u->module()->set_hooks(nullptr);
    for (const FlatParameter::Entry& e : u->flat().entries()) e.param->held_by.clear();
  }
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
  shared_->WaitQueuedUploads();  // the caller may change the shards
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
  // Reduce-scatters a backward that threw left in flight would add into the
  // shards after they are zeroed (or dropped): finish them first.
  shared_->FinishReducesBefore(0);
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
    tensor::ThrowIfError(sum.status(), "fsdp", "clip_grad_norm all_gather");
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
  tensor::ThrowIfError(any.status(), "fsdp", "unscale_grads all_reduce");
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
  for (auto& [name, b] : root_->NamedBuffers()) {  // rank 0's, as PyTorch's state_dict
    if (b->defined()) out.emplace_back(name, b->To(tensor::Device::Cpu()).Clone());
  }
  return out;
}

absl::Status FullyShardedModel::LoadFullStateDict(
    const std::vector<std::pair<std::string, tensor::Tensor>>& state) {
  std::map<std::string, const tensor::Tensor*> all;
  for (const auto& [name, t] : state) all.emplace(name, &t);
  absl::Status mine = nn::CheckStateDict(*root_, state);
  if (!mine.ok()) {
    mine = absl::Status(mine.code(), absl::StrCat("LoadFullStateDict: ", mine.message()));
  }
  // Each unit's new shard, on its device, and each buffer's new value, made
  // before anything is written: the parts of its parameters that fall in
  // [shard_begin, shard_end) of the flat layout; padding zero.
  std::vector<tensor::Tensor> staged(units_.size());
  std::vector<tensor::Tensor> buffer_values;
  const auto buffers = root_->NamedBuffers();
  if (mine.ok()) {
    try {
      for (size_t i = 0; i < units_.size(); ++i) {
        const FlatParameter& flat = units_[i]->flat();
        tensor::Tensor host = tensor::Tensor::Zeros({flat.shard_numel()}, tensor::Dtype::kF32);
        for (const FlatParameter::Entry& e : flat.entries()) {
          const int64_t lo = std::max(e.offset, flat.shard_begin());
          const int64_t hi = std::min(e.offset + e.numel, flat.shard_end());
          if (lo >= hi) continue;
          const tensor::Tensor whole = all.at(e.name)
                                           ->To(tensor::Device::Cpu())
                                           .To(tensor::Dtype::kF32)
                                           .Contiguous()
                                           .Reshape({e.numel});
          host.Narrow(0, lo - flat.shard_begin(), hi - lo)
              .CopyFrom(whole.Narrow(0, lo - e.offset, hi - lo));
        }
        const tensor::Device device = flat.shard().device();
        staged[i] = device.is_cpu() ? host : host.To(device);
      }
      for (auto& [name, b] : buffers) {
        if (!b->defined()) continue;
        tensor::Tensor cast = all.at(name)->To(b->dtype());
        buffer_values.push_back(b->device().is_cpu() ? cast : cast.To(b->device()));
      }
    } catch (const std::exception& e) {
      mine = absl::ResourceExhaustedError(
          absl::StrCat("LoadFullStateDict: staging the shards: ", e.what()));
    }
  }
  // Every rank's answer before any write.
  if (pg_->size() > 1) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    const tensor::Tensor flag =
        tensor::Tensor::Full({1}, mine.ok() ? 0.0 : 1.0).To(options_.device);
    const tensor::Tensor flags =
        tensor::Tensor::Empty({pg_->size()}, tensor::Dtype::kF32, options_.device);
    const absl::Status gathered = pg_->AllGatherSync(flag, flags);
    if (!mine.ok()) return mine;
    if (!gathered.ok()) return gathered;
    std::vector<int> refused;
    const std::vector<float> f = flags.To(tensor::Device::Cpu()).ToVector<float>();
    for (int r = 0; r < pg_->size(); ++r) {
      if (f[r] != 0.0f) refused.push_back(r);
    }
    if (!refused.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("LoadFullStateDict: rank(s) ", absl::StrJoin(refused, ", "),
                       " refused the state dict (see their errors): nothing was loaded"));
    }
  } else if (!mine.ok()) {
    return mine;
  }
  Reshard();                      // units held unsharded hold the old values
  shared_->WaitQueuedUploads();  // (offload) nothing may still copy into the shards
  for (size_t i = 0; i < units_.size(); ++i) {
    tensor::Tensor shard = units_[i]->flat().shard();
    shard.CopyFrom(staged[i]);
  }
  size_t next = 0;
  for (auto& [name, b] : buffers) {
    if (b->defined()) b->CopyFrom(buffer_values[next++]);
  }
  return absl::OkStatus();
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
