#include "dist/fsdp.h"

#include <cstring>
#include <map>
#include <set>

#include "optim/clip_grad.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace dist {

const char* ShardingStrategyName(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard:
      return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard:
      return "NO_SHARD";
  }
  return "?";
}

namespace internal {

class FsdpUnit : public nn::ModuleHooks {
 public:
  // `kept_fp32`: parameters of modules the mixed-precision policy keeps fp32.
  FsdpUnit(UnitPlan plan, bool is_root, ProcessGroup& pg, ShardingStrategy strategy,
           const precision::MixedPrecisionPolicy& mp, const std::set<const nn::Parameter*>& kept_fp32)
      : name_(plan.name),
        module_(plan.module),
        is_root_(is_root),
        pg_(pg),
        strategy_(strategy),
        param_dtype_(mp.param_dtype),
        reduce_dtype_(mp.reduce_dtype),
        flat_(std::move(plan.params), strategy == ShardingStrategy::kNoShard ? 1 : pg.size(),
              strategy == ShardingStrategy::kNoShard ? 0 : pg.rank()) {
    gather_dtype_ = param_dtype_;
    if (param_dtype_ != tensor::Dtype::kF32) {
      for (const FlatParameter::Entry& e : flat_.entries()) {
        const bool keep = kept_fp32.count(e.param) > 0;
        keep_fp32_.push_back(keep);
        if (keep) gather_dtype_ = tensor::Dtype::kF32;  // gather fp32, cast the others
      }
    }
  }

  const std::string& name() const { return name_; }
  nn::Module* module() const { return module_; }
  FlatParameter& flat() { return flat_; }
  bool no_shard() const { return strategy_ == ShardingStrategy::kNoShard; }

  void Init(uint64_t seed) {
    flat_.InitShard(seed);
    if (no_shard() && !mixed()) flat_.SetValueViews(flat_.shard());
  }

  // Low-precision compute copies (param_dtype not f32).
  bool mixed() const { return param_dtype_ != tensor::Dtype::kF32; }
  tensor::Dtype gather_dtype() const { return gather_dtype_; }

  // Gathers the unsharded flat parameter into `out` (padded_numel, fp32).
  void GatherInto(const tensor::Tensor& out) {
    Check(pg_.AllGatherSync(flat_.shard(), out), "all_gather");
  }

  void Unshard() {
    if (!mixed()) {
      if (no_shard()) return;
      if (!full_.defined()) {
        tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
        full_ = tensor::Tensor::Empty({flat_.padded_numel()}, tensor::Dtype::kF32);
      }
      GatherInto(full_);
      flat_.SetValueViews(full_);
      return;
    }
    // Mixed precision: the unsharded buffer is in gather_dtype_ (param_dtype,
    // or f32 when the unit holds kept-fp32 parameters).
    {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
      if (no_shard()) {
        full_ = flat_.shard().To(gather_dtype_);  // f32: the shard itself
      } else {
        if (!full_.defined()) {
          full_ = tensor::Tensor::Empty({flat_.padded_numel()}, gather_dtype_);
        }
      }
    }
    if (!no_shard()) {
      if (gather_dtype_ == tensor::Dtype::kF32) {
        GatherInto(full_);
      } else {
        tensor::Tensor send;
        {
          tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
          send = flat_.shard().To(gather_dtype_);
        }
        Check(pg_.AllGatherSync(send, full_), "all_gather");
      }
    }
    flat_.SetValueViews(full_);
    if (gather_dtype_ != param_dtype_) {
      // fp32 gather: cast the parameters not kept fp32 (as nn::MixedPrecision).
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
      const auto& entries = flat_.entries();
      for (size_t i = 0; i < entries.size(); ++i) {
        if (!keep_fp32_[i]) entries[i].param->value = entries[i].param->value.To(param_dtype_);
      }
    }
  }

  void Reshard() {
    if (no_shard() && !mixed()) return;
    flat_.ClearValues();
    full_ = tensor::Tensor();
  }

  void PreForward(nn::Module&) override {
    // Always gather: the shard may have changed since the last gather (an
    // optimizer step, a loaded checkpoint).
    Unshard();
  }

  void PostForward(nn::Module&) override {
    if (strategy_ == ShardingStrategy::kFullShard && !is_root_) Reshard();
  }

  void PreBackward(nn::Module&) override {
    if ((!no_shard() || mixed()) && !full_.defined()) Unshard();
    {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
      full_grad_ = tensor::Tensor::Zeros({flat_.padded_numel()}, tensor::Dtype::kF32);
    }
    flat_.SetGradViews(full_grad_);
  }

  void PostBackward(nn::Module&) override {
    OP_CHECK(full_grad_.defined(), "fsdp", "unit '", name_, "': post-backward without pre-backward");
    if (reduce_dtype_ != tensor::Dtype::kF32) {
      // Reduce in reduce_dtype; the result is added into the fp32 shard.
      tensor::Tensor low;
      {
        tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
        low = full_grad_.To(reduce_dtype_);
      }
      if (no_shard()) {
        Check(pg_.AllReduceSync(low, ReduceOp::kAvg), "all_reduce");
        tensor::AddInPlace(flat_.grad_shard(), low);
      } else {
        tensor::Tensor chunk = low.Narrow(0, flat_.shard_begin(), flat_.shard_numel());
        Check(pg_.ReduceScatterSync(low, chunk, ReduceOp::kAvg), "reduce_scatter");
        tensor::AddInPlace(flat_.grad_shard(), chunk);
      }
    } else if (no_shard()) {
      Check(pg_.AllReduceSync(full_grad_, ReduceOp::kAvg), "all_reduce");
      tensor::AddInPlace(flat_.grad_shard(), full_grad_);
    } else {
      tensor::Tensor chunk = full_grad_.Narrow(0, flat_.shard_begin(), flat_.shard_numel());
      Check(pg_.ReduceScatterSync(full_grad_, chunk, ReduceOp::kAvg), "reduce_scatter");
      tensor::AddInPlace(flat_.grad_shard(), chunk);
    }
    flat_.ClearGrads();
    full_grad_ = tensor::Tensor();
    Reshard();
  }

 private:
  void Check(const absl::Status& s, const char* what) {
    OP_CHECK(s.ok(), "fsdp", "unit '", name_.empty() ? "<root>" : name_, "' ", what, ": ",
             s.ToString());
  }

  std::string name_;
  nn::Module* module_;
  bool is_root_;
  ProcessGroup& pg_;
  ShardingStrategy strategy_;
  tensor::Dtype param_dtype_;
  tensor::Dtype reduce_dtype_;
  tensor::Dtype gather_dtype_ = tensor::Dtype::kF32;
  std::vector<bool> keep_fp32_;  // per flat entry (mixed precision only)
  FlatParameter flat_;
  tensor::Tensor full_;       // unsharded flat parameter (undefined while sharded)
  tensor::Tensor full_grad_;  // unsharded flat gradient (during backward only)
};

}  // namespace internal

FullyShardedModel::FullyShardedModel(nn::Module& root, ProcessGroup& pg, FsdpOptions options)
    : root_(&root), pg_(&pg), options_(std::move(options)), ledger_(&tensor::MemoryLedger::Current()) {
  {
    absl::Status s = options_.mixed_precision.Validate(tensor::Device::Cpu());
    OP_CHECK(s.ok(), "FullyShard", "mixed precision: ", s.ToString());
  }
  std::set<const nn::Parameter*> kept_fp32;
  if (options_.mixed_precision.IsMixed()) {
    for (auto& [prefix, module] : root.NamedModules()) {
      if (!options_.mixed_precision.KeepsFp32(module->class_name())) continue;
      for (auto& [name, p] : module->LocalParameters()) kept_fp32.insert(p);
    }
  }
  std::vector<UnitPlan> plans = PlanUnits(root, options_.policy);
  for (size_t i = 0; i < plans.size(); ++i) {
    OP_CHECK(plans[i].module->hooks() == nullptr, "FullyShard", "module '", plans[i].name,
             "' already has hooks");
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].params.empty() && i != 0) continue;  // a unit with nothing to shard
    auto unit = std::make_unique<internal::FsdpUnit>(std::move(plans[i]), i == 0, pg,
                                                     options_.strategy,
                                                     options_.mixed_precision, kept_fp32);
    unit->Init(options_.seed);
    unit->module()->set_hooks(unit.get());
    units_.push_back(std::move(unit));
  }
}

FullyShardedModel::~FullyShardedModel() {
  for (auto& u : units_) u->module()->set_hooks(nullptr);
}

const std::string& FullyShardedModel::unit_name(int i) const { return units_.at(i)->name(); }
const FlatParameter& FullyShardedModel::flat_param(int i) const { return units_.at(i)->flat(); }

int FullyShardedModel::shard_group_rank() const { return units_.front()->flat().shard_index(); }
int FullyShardedModel::shard_group_size() const { return units_.front()->flat().num_shards(); }

int FullyShardedModel::replica_index() const {
  return options_.strategy == ShardingStrategy::kNoShard ? pg_->rank() : 0;
}

int FullyShardedModel::num_replicas() const {
  return options_.strategy == ShardingStrategy::kNoShard ? pg_->size() : 1;
}

std::string FullyShardedModel::param_ref_name(int i) const {
  const std::string& name = units_.at(i)->name();
  return "fsdp." + (name.empty() ? std::string("root") : name);
}

std::vector<optim::ParamRef> FullyShardedModel::ParamRefs() {
  std::vector<optim::ParamRef> refs;
  for (size_t i = 0; i < units_.size(); ++i) {
    auto& u = units_[i];
    optim::ParamRef r;
    r.name = param_ref_name(static_cast<int>(i));
    r.param = u->flat().shard();
    r.grad = u->flat().grad_shard();
    r.decay_ranges = u->flat().shard_decay_ranges();
    refs.push_back(std::move(r));
  }
  return refs;
}

void FullyShardedModel::ZeroGrad() {
  for (auto& u : units_) {
    const tensor::Tensor& g = u->flat().grad_shard();
    std::memset(g.raw_data(), 0, g.nbytes());
  }
}

double FullyShardedModel::ClipGradNorm(double max_norm) {
  if (options_.strategy == ShardingStrategy::kNoShard) {
    return optim::ClipGradNorm(ParamRefs(), max_norm);  // every rank has the whole gradient
  }
  // The collectives have no f64: each rank's double is sent as a (hi, lo) f32
  // pair and the sum is taken in double, in rank order (the same on every rank).
  auto all_reduce_sum = [this](double local) {
    const float hi = static_cast<float>(local);
    const float lo = static_cast<float>(local - static_cast<double>(hi));
    tensor::Tensor in = tensor::Tensor::FromVector({hi, lo}, {2});
    tensor::Tensor out = tensor::Tensor::Empty({2 * pg_->size()}, tensor::Dtype::kF32);
    absl::Status s = pg_->AllGatherSync(in, out);
    OP_CHECK(s.ok(), "fsdp", "clip_grad_norm all_gather: ", s.ToString());
    const float* p = out.data<float>();
    double sum = 0;
    for (int r = 0; r < pg_->size(); ++r) sum += double(p[2 * r]) + double(p[2 * r + 1]);
    return sum;
  };
  return optim::ClipGradNorm(ParamRefs(), max_norm, all_reduce_sum);
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
      full = tensor::Tensor::Empty({flat.padded_numel()}, tensor::Dtype::kF32);
      u->GatherInto(full);
    }
    if (!keep) continue;
    for (const FlatParameter::Entry& e : flat.entries()) {
      gathered[e.name] = full.Narrow(0, e.offset, e.numel).View(e.param->shape).Clone();
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

std::unique_ptr<FullyShardedModel> FullyShard(nn::Module& root, ProcessGroup& pg,
                                              FsdpOptions options) {
  return std::unique_ptr<FullyShardedModel>(new FullyShardedModel(root, pg, std::move(options)));
}

}  // namespace dist
