// Data parallelism for the train binaries, at run time: running the ranks
// (threads, gloo, nccl), wrapping the model (DDP, ZeRO-1, FSDP), its training
// step, evaluation, samples and checkpoints, memory by rank. The flags and the
// configuration: data_parallel_config.cc.
#include "models/common/data_parallel.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dist/gloo_group.h"
#include "dist/host_name.h"
#include "dist/sharded_checkpoint.h"
#include "dist/thread_group.h"
#include "glog/logging.h"
#include "models/common/loss_scaling.h"
#include "models/common/nccl_backend.h"
#include "models/common/run_keys.h"
#include "models/common/tied_weights.h"
#include "nn/fp32_modules.h"
#include "nn/freeze.h"
#include "optim/clip_grad.h"
#include "optim/param_ref.h"
#include "tensor/fnv.h"
#include "tensor/guarded.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace train {
namespace {

absl::Status WithRank(int rank, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("rank ", rank, ": ", s.message()));
}

// The FSDP sharding strategy of an FSDP --strategy.
dist::ShardingStrategy FsdpStrategy(Strategy strategy) {
  switch (strategy) {
    case Strategy::kShardGradOp:
      return dist::ShardingStrategy::kShardGradOp;
    case Strategy::kNoShard:
      return dist::ShardingStrategy::kNoShard;
    case Strategy::kHybridShard:
      return dist::ShardingStrategy::kHybridShard;
    case Strategy::kHybridShardZero2:
      return dist::ShardingStrategy::kHybridShardZero2;
    default:
      return dist::ShardingStrategy::kFullShard;
  }
}

}  // namespace

// ---- Running the ranks ----

absl::Status RunDataParallel(const DataParallelConfig& config, const RankFn& fn) {
  if (config.backend == Backend::kThreads) {
    dist::ThreadWorldOptions options;
    options.timeout = config.timeout;
    dist::ThreadWorld world(config.world_size, options);
    absl::Status s = dist::RunRanks(world, [&](int rank, dist::ProcessGroup& pg) {
      RankContext context{rank, config.world_size, pg, world.ledger(rank)};
      return fn(context);
    });
    if (!s.ok()) return s;
    std::vector<const tensor::MemoryLedger*> ledgers;
    for (int r = 0; r < world.size(); ++r) ledgers.push_back(&world.ledger(r));
    if (!config.device.is_cpu()) {
      std::printf("per-rank peak memory on %s by category (MiB, ledger):\n%s",
                  config.device.ToString().c_str(),
                  PerRankMemoryTable(ledgers, config.device).c_str());
    }
    std::printf("per-rank peak memory by category (MiB, ledger%s):\n%s",
                config.device.is_cpu() ? "" : ", host", PerRankMemoryTable(ledgers).c_str());
    std::fflush(stdout);
    return absl::OkStatus();
  }
  const LaunchEnv& env = config.env;
  if (config.rendezvous.owned) {
    absl::Status mine = CheckOwnedStore(config.rendezvous.store);
    if (!mine.ok()) return WithRank(env.rank, mine);
  }
  if (config.backend == Backend::kNccl) {
    absl::StatusOr<NcclJob> job =
        JoinNcclJob(env.rank, env.world_size, env.local_rank, env.local_world_size,
                    config.device.index, config.rendezvous.store, config.rendezvous.prefix,
                    config.timeout);
    if (!job.ok()) return WithRank(env.rank, job.status());
    tensor::MemoryLedger& ledger = tensor::MemoryLedger::Current();
    absl::Status s = tensor::Guarded([&] {
      RankContext context{env.rank, env.world_size, *job->group, ledger};
      return fn(context);
    });
    job->group.reset();  // writes this rank's departure to the store
    FinishNcclRunFolder(config.rendezvous.store, config.rendezvous.prefix, config.rendezvous.owned,
                        env.rank, env.world_size, std::min(config.timeout, absl::Seconds(60)),
                        s.ok());
    if (!s.ok()) return WithRank(env.rank, s);
    std::printf("%s\n%s\n", RankMemoryLine(env.rank, ledger, config.device).c_str(),
                RankMemoryLine(env.rank, ledger).c_str());
    std::fflush(stdout);
    return absl::OkStatus();
  }
  dist::GlooGroupOptions options;
  options.store = config.rendezvous.store;
  options.prefix = config.rendezvous.prefix;
  options.run_folder = config.rendezvous.owned;
  options.timeout = config.timeout;
  options.local_rank = env.local_rank;  // the nodes' launches are compared
  options.local_world_size = env.local_world_size;
  if (env.local_world_size < env.world_size) {
    // Several nodes: announce this host's name (loopback would not reach it).
    if (std::string host = dist::HostName(); !host.empty()) options.hostname = host;
  }
  absl::StatusOr<std::unique_ptr<dist::ProcessGroup>> pg =
      dist::CreateGlooProcessGroup(env.rank, env.world_size, options);
  if (!pg.ok()) return WithRank(env.rank, pg.status());
  tensor::MemoryLedger& ledger = tensor::MemoryLedger::Current();
  absl::Status s = tensor::Guarded([&] {
    RankContext context{env.rank, env.world_size, **pg, ledger};
    return fn(context);
  });
  if (!s.ok()) return WithRank(env.rank, s);
  RemoveGlooRunKeys(config.rendezvous.store, config.rendezvous.prefix, config.rendezvous.owned,
                    **pg);
  std::printf("%s\n", RankMemoryLine(env.rank, ledger).c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// ---- Inside a rank ----

DataParallelModel::DataParallelModel(nn::Module& model, dist::ProcessGroup& pg,
                                     const DataParallelConfig& config)
    : model_(model),
      pg_(pg),
      strategy_(config.strategy),
      auto_wrap_(config.auto_wrap),
      prefetch_units_(config.prefetch_units),
      keep_last_unit_(config.keep_last_unit) {}

DataParallelModel::~DataParallelModel() = default;

absl::StatusOr<std::unique_ptr<DataParallelModel>> DataParallelModel::Create(
    nn::Module& model, dist::ProcessGroup& pg, const DataParallelConfig& config,
    std::unique_ptr<optim::Optimizer> optimizer, uint64_t seed,
    const std::vector<std::string>& root_params) {
  if (optimizer == nullptr) return absl::InvalidArgumentError("DataParallelModel: no optimizer");
  std::unique_ptr<DataParallelModel> dp(new DataParallelModel(model, pg, config));
  // Frozen parameters (--freeze): frozen leaf modules outside the policy's
  // units get units of their own, so that no unit mixes them with trainable
  // parameters where it can be avoided (the root's tied weights stay in it).
  dist::WrapPolicy policy = config.policy;
  if (IsFsdp(config.strategy) && nn::CountTrainable(model).trainable < model.NumParameters()) {
    policy = dist::WrapPolicy::FrozenLeavesApart(std::move(policy), model, root_params);
    dp->frozen_leaves_apart_ = true;
  }
  if (IsFsdp(config.strategy)) {
    // Tied weights must stay in the root unit: check FullyShard's units before sharding.
    absl::Status tied = CheckTiedWeightsInRoot(
        model, policy.ForMixedPrecision(config.mixed_precision), config.auto_wrap, root_params);
    if (!tied.ok()) return tied;
  }
  // DDP and ZeRO-1 materialize the whole model on every rank (reading
  // --init_from's file), which may fail on some ranks only: all agree before
  // the wrapper's first broadcast. FSDP agrees after its units' Init.
  if (!IsFsdp(config.strategy)) {
    absl::Status materialized = tensor::Guarded([&] {
      model.Materialize(seed, config.device);
      return absl::OkStatus();
    });
    materialized = AgreeOnStatus(pg, materialized, "materializing the model");
    if (!materialized.ok()) return materialized;
  }
  absl::Status s = tensor::Guarded([&]() -> absl::Status {
    switch (config.strategy) {
      case Strategy::kDdp: {
        dist::DdpOptions o;
        o.mixed_precision = config.mixed_precision;
        o.bucket_cap_mb = config.bucket_cap_mb;
        o.max_inflight_buckets = config.max_inflight_buckets;
        dp->ddp_ = std::make_unique<dist::DistributedDataParallel>(model, pg, o);
        dp->owned_optimizer_ = std::move(optimizer);
        dp->optimizer_ = dp->owned_optimizer_.get();
        return absl::OkStatus();
      }
      case Strategy::kZero1: {
        dist::Zero1Options o;
        o.mixed_precision = config.mixed_precision;
        o.bucket_cap_mb = config.bucket_cap_mb;
        o.max_inflight_buckets = config.max_inflight_buckets;
        dp->zero1_ = std::make_unique<dist::Zero1>(model, pg, std::move(optimizer), o);
        dp->optimizer_ = &dp->zero1_->optimizer();
        return absl::OkStatus();
      }
      case Strategy::kShardGradOp:
      case Strategy::kFullShard:
      case Strategy::kNoShard:
      case Strategy::kHybridShard:
      case Strategy::kHybridShardZero2: {
        dist::FsdpOptions o;
        o.strategy = FsdpStrategy(config.strategy);
        o.hybrid_shard_group_size = config.hybrid_shard_group_size;
        o.backward_prefetch = config.backward_prefetch;
        o.forward_prefetch = config.forward_prefetch;
        o.max_inflight_all_gathers = config.max_inflight_all_gathers;
        o.policy = policy;
        o.mixed_precision = config.mixed_precision;
        o.device = config.device;
        o.cpu_offload = config.cpu_offload;
        o.seed = seed;  // sharded init: bitwise equal to Materialize(seed)
        dp->fsdp_ = dist::FullyShard(model, pg, o);
        dist::PrefetchNeighbors(*dp->fsdp_, config.prefetch_units);
        if (config.keep_last_unit) {
          if (dp->fsdp_->num_units() == 1) {
            return absl::InvalidArgumentError(absl::StrCat(
                "--keep_last_unit: --auto_wrap=", config.auto_wrap,
                " gives no unit but the root, which is kept until its backward anyway"));
          }
          // The last unit in pre-order that trains: its backward comes first. A unit of
          // frozen parameters only (a frozen leaf FrozenLeavesApart split off, a frozen
          // Block) is not a candidate: below the lowest trainable block the backward never
          // gathers it again, so keeping it would only hold its memory. Nor is a unit of
          // modules kept fp32 only (a BatchNorm or LayerNorm unit): too small to matter.
          const std::set<const nn::Parameter*> kept =
              nn::KeptFp32Parameters(model, config.mixed_precision.fp32_module_classes);
          const auto only_kept = [&](const dist::FlatParameter& flat) {
            for (const dist::FlatParameter::Entry& e : flat.entries()) {
              if (kept.count(e.param) == 0) return false;
            }
            return true;
          };
          int last = dp->fsdp_->num_units() - 1;
          while (last > 0 && (!dp->fsdp_->flat_param(last).trains() ||
                              only_kept(dp->fsdp_->flat_param(last)))) {
            --last;
          }
          if (last == 0) {
            return absl::InvalidArgumentError(
                "--keep_last_unit: no unit but the root trains (the others hold frozen "
                "parameters only, which the backward does not gather again, or modules kept "
                "fp32 only)");
          }
          dp->kept_unit_ = dp->fsdp_->unit_name(last);
          dp->fsdp_->SetReshardAfterForward(dp->kept_unit_, false);
        }
        dp->owned_optimizer_ = std::move(optimizer);
        dp->optimizer_ = dp->owned_optimizer_.get();
        return absl::OkStatus();
      }
    }
    return absl::InternalError("DataParallelModel: unknown strategy");
  });
  if (!s.ok()) return s;
  return dp;
}

std::string DataParallelModel::Describe() const {
  if (fsdp_ == nullptr) {
    const int buckets = ddp_ != nullptr ? ddp_->num_buckets() : zero1_->num_buckets();
    return absl::StrCat(StrategyName(strategy_), ", ", buckets,
                        buckets == 1 ? " gradient bucket" : " gradient buckets");
  }
  std::string extras;
  if (prefetch_units_ > 0) absl::StrAppend(&extras, ", prefetch_units ", prefetch_units_);
  if (keep_last_unit_) absl::StrAppend(&extras, ", last unit ", kept_unit_, " kept");
  if (frozen_leaves_apart_) absl::StrAppend(&extras, ", frozen leaves apart");
  return absl::StrCat(StrategyName(strategy_), ", ", fsdp_->num_units(), " units (auto_wrap ",
                      auto_wrap_, extras, ")");
}

absl::Status DataParallelModel::FinishBackward() {
  if (ddp_ != nullptr) return ddp_->FinishBackward();
  if (zero1_ != nullptr) return zero1_->FinishBackward();
  return absl::OkStatus();
}

absl::StatusOr<double> DataParallelModel::ClipGradNorm(double max_norm) {
  double norm = 0;
  absl::Status s = tensor::Guarded([&]() -> absl::Status {
    if (ddp_ != nullptr) {
      // Every rank holds the same averaged gradients: the local norm is global.
      norm = optim::ClipGradNorm(optim::FromModule(model_), max_norm);
    } else if (zero1_ != nullptr) {
      // Each rank holds its shard of the averaged gradients: sum the squares.
      auto sum = [this](double x) {
        absl::StatusOr<double> total = dist::SumOverRanks(pg_, x);
        tensor::ThrowIfError(total.status(), "zero1", "clip_grad_norm all_gather");
        return *total;
      };
      norm = optim::ClipGradNorm(zero1_->ParamRefs(), max_norm, sum);
    } else {
      norm = fsdp_->ClipGradNorm(max_norm);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return norm;
}

absl::StatusOr<bool> DataParallelModel::UnscaleGradsAndCheck(double inv_scale) {
  bool found = false;
  absl::Status s = tensor::Guarded([&]() -> absl::Status {
    if (fsdp_ != nullptr) {
      found = fsdp_->UnscaleGradsAndCheck(inv_scale);
      return absl::OkStatus();
    }
    const bool mine = UnscaleGradients(
        zero1_ != nullptr ? zero1_->ParamRefs() : optim::FromModule(model_), inv_scale);
    // ZeRO-1 ranks hold different shards; DDP ranks agree already: OR the
    // flags either way, so every rank skips together.
    absl::StatusOr<bool> any = dist::AnyOverRanks(pg_, mine);
    if (!any.ok()) return any.status();
    found = *any;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return found;
}

absl::Status DataParallelModel::Step() {
  return tensor::Guarded([&]() -> absl::Status {
    if (ddp_ != nullptr) {
      std::vector<optim::ParamRef> refs = optim::FromModule(model_);
      optimizer_->Step(refs);
      return absl::OkStatus();
    }
    if (zero1_ != nullptr) return zero1_->Step();
    optimizer_->Step(fsdp_->ParamRefs());
    return absl::OkStatus();
  });
}

void DataParallelModel::ZeroGrad() {
  // Every strategy drops the gradients: the next backward writes them (DDP and
  // ZeRO-1 into the buckets, FSDP's reduces into the shards): no memset of
  // every bucket or shard, no kernel reading zeros.
  if (ddp_ != nullptr) {
    ddp_->ZeroGrad(/*set_to_none=*/true);
  } else if (zero1_ != nullptr) {
    zero1_->ZeroGrad(/*set_to_none=*/true);
  } else {
    fsdp_->ZeroGrad(/*set_to_none=*/true);
  }
}

DataParallelModel::NoSyncGuard::NoSyncGuard(DataParallelModel& dp) {
  if (dp.ddp_) ddp_.emplace(dp.ddp_.get());
  if (dp.zero1_) zero1_.emplace(dp.zero1_.get());
  if (dp.fsdp_) fsdp_.emplace(dp.fsdp_.get());
}

void DataParallelModel::ForwardOnly(const std::function<void()>& local, Gather gather) {
  // Back to training: training mode, the fp32 masters as the parameters
  // (DDP, ZeRO-1 mixed precision), FSDP's units resharded. Each part does
  // nothing where it was not begun (a failure before it).
  auto end = [&] {
    model_.Train(true);
    if (ddp_) ddp_->EndForwardOnly();
    if (zero1_) zero1_->EndForwardOnly();
    if (fsdp_) fsdp_->Reshard();  // the root (and SHARD_GRAD_OP's units) kept their gathers
  };
  model_.Train(false);
  try {
    if (ddp_) ddp_->BeginForwardOnly();
    if (zero1_) zero1_->BeginForwardOnly();
    // Collective: every unit (or the root) whole until `end` reshards them.
    if (fsdp_ && gather == Gather::kWholeModel) fsdp_->Unshard();
    if (fsdp_ && gather == Gather::kPerUnit) fsdp_->UnshardRoot();
    local();
  } catch (...) {
    // A pass that failed (a sample out of memory, a bad prompt) leaves the
    // model as training needs it, so a caller that goes on trains what it
    // would have without the pass. Its own error is the one thrown: one
    // from ending (a gather in flight from a lost peer) would hide it.
    try {
      end();
    } catch (...) {
    }
    throw;
  }
  end();
}

absl::StatusOr<double> DataParallelModel::Evaluate(const std::function<double()>& local_loss) {
  double local = 0.0;
  ForwardOnly([&] { local = local_loss(); }, Gather::kPerUnit);
  return dist::MeanOverRanks(pg_, local);
}

absl::StatusOr<SampleSchedule> SampleSchedule::Parse(int64_t every, const std::string& gather) {
  SampleSchedule s;
  s.every = every;
  if (every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sample_every must be >= 0 (0: no samples), got ", every));
  }
  if (gather == "unit") {
    s.gather = DataParallelModel::Gather::kPerUnit;
  } else if (gather != "model") {
    return absl::InvalidArgumentError(
        absl::StrCat("--sample_gather must be model or unit, got '", gather, "'"));
  }
  if (every == 0 && gather != "model") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sample_gather=", gather, " without --sample_every: no sample is drawn to gather for"));
  }
  return s;
}

absl::Status SampleSchedule::CheckApplies(std::optional<Strategy> strategy) const {
  if (gather != DataParallelModel::Gather::kPerUnit || (strategy && IsFsdp(*strategy))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--sample_gather=unit gathers FSDP's units one by one, and ",
      strategy ? absl::StrCat(StrategyName(*strategy), " has none")
               : std::string("one process without --strategy has none"),
      " (the whole model is there to sample)"));
}

absl::Status PrintSample(DataParallelModel& dp, const SampleSchedule& schedule, bool print,
                         const std::function<absl::StatusOr<std::string>()>& draw) {
  absl::StatusOr<std::string> sample;
  const absl::Status held = tensor::Guarded([&] {
    dp.ForwardOnly([&] { sample = draw(); }, schedule.gather);
    return absl::OkStatus();
  });
  const absl::Status failed = !held.ok() ? held : sample.status();
  if (!failed.ok()) {
    // The whole model gathered is often what does not fit: say what holds less
    // (NO_SHARD's parameters are whole anyway).
    if (absl::IsResourceExhausted(failed) && absl::StrContains(failed.message(), "out of memory") &&
        schedule.gather == DataParallelModel::Gather::kWholeModel && dp.fsdp() != nullptr &&
        dp.fsdp()->strategy() != dist::ShardingStrategy::kNoShard) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "[sample] with the whole model gathered on every rank (--sample_gather=model): ",
          failed.message(), "; --sample_gather=unit holds the root and one unit at a time"));
    }
    return failed;
  }
  if (print) {
    std::fputs(sample->c_str(), stdout);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

double AccumulateGradients(int64_t K, DataParallelModel* dp,
                           const std::function<double(int64_t m)>& micro_step) {
  CHECK_GE(K, 1) << "[grad accumulation] K must be >= 1";
  double sum = 0;
  for (int64_t m = 0; m < K; ++m) {
    std::optional<DataParallelModel::NoSyncGuard> local_only;
    if (dp != nullptr && m + 1 < K) local_only.emplace(*dp);  // the last one communicates
    sum += micro_step(m);
  }
  return sum / K;
}

absl::StatusOr<StepResult> DataParallelModel::FinishTrainingStep(double local_loss, double scale,
                                                                 int64_t step, double grad_clip,
                                                                 LossScaling& scaling, bool log) {
  StepResult result;
  absl::StatusOr<double> loss = dist::MeanOverRanks(pg_, local_loss);
  if (!loss.ok()) return loss.status();
  if (!std::isfinite(*loss)) {
    return absl::InternalError(
        absl::StrCat("loss is ", *loss, " at step ", step + 1, "; lower --lr or check the data"));
  }
  result.loss = *loss;
  absl::Status s = FinishBackward();  // every rank holds averaged gradients
  if (!s.ok()) return s;
  // Loss scaling: unscale; inf/nan on any rank skips the step on all.
  absl::StatusOr<bool> apply = scaling.FinishStep(
      scale, step + 1, log, [&](double inv) { return UnscaleGradsAndCheck(inv); });
  if (!apply.ok()) return apply.status();
  result.skipped = !*apply;
  if (*apply) {
    if (grad_clip > 0) {
      absl::StatusOr<double> norm = ClipGradNorm(grad_clip);  // global, over all ranks
      if (!norm.ok()) return norm.status();
      result.grad_norm = *norm;
      s = CheckGradNorm(*norm, step + 1);  // the same norm on every rank: all stop
      if (!s.ok()) return s;
    }
    s = Step();
    if (!s.ok()) return s;
  }
  ZeroGrad();
  return result;
}

// ---- Checkpoints ----

absl::Status AgreeOnStatus(dist::ProcessGroup& pg, const absl::Status& local,
                           absl::string_view what) {
  const absl::StatusOr<std::vector<int64_t>> all = dist::AllGatherOverRanks(pg, local.ok() ? 0 : 1);
  if (!local.ok()) {  // this rank's own error first, whatever the agreement gave
    if (all.ok()) return local;
    return absl::Status(local.code(),
                        absl::StrCat(local.message(),
                                     " (and agreeing with the other ranks failed: ",
                                     all.status().message(), ")"));
  }
  if (!all.ok()) return all.status();
  std::vector<int> failed;
  for (int r = 0; r < pg.size(); ++r) {
    if ((*all)[r] != 0) failed.push_back(r);
  }
  if (failed.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(what, " failed on rank(s) ", absl::StrJoin(failed, ", "),
                                         " (see their errors)"));
}

absl::Status DataParallelModel::PrintSample(
    const SampleSchedule& schedule, bool print,
    const std::function<absl::StatusOr<std::string>()>& draw) {
  return train::PrintSample(*this, schedule, print, draw);
}

double DataParallelModel::AccumulateGradients(
    int64_t K, const std::function<double(int64_t m)>& micro_step) {
  return train::AccumulateGradients(K, this, micro_step);
}

absl::Status DataParallelModel::PrepareToTrain(const std::string& checkpoint_dir,
                                              const std::string& resume, bool auto_fresh,
                                              bool logs) {
  if (!checkpoint_dir.empty()) {  // now, not at the first save
    absl::Status ready = PrepareCheckpointDir(checkpoint_dir);
    if (!ready.ok()) return ready;
  }
  // --resume=auto resolved on each process's view of the folder: every rank
  // resumes, or none does.
  absl::Status agreed = AgreeOnResuming(pg_, resume, checkpoint_dir);
  if (!agreed.ok()) return agreed;
  // A fresh start (on every rank now) was planned before rank 0 locked the
  // folder: a run that saved into it meanwhile is not replaced.
  if (resume.empty() && !checkpoint_dir.empty()) {
    agreed = AgreeOnStatus(
        pg_, pg_.rank() == 0 ? CheckFreshCheckpointDir(checkpoint_dir) : absl::OkStatus(),
        absl::StrCat("checking --checkpoint_dir ", checkpoint_dir));
    if (!agreed.ok()) return agreed;
  }
  if (auto_fresh && logs) PrintAutoFreshStart(checkpoint_dir);
  return absl::OkStatus();
}

absl::Status DataParallelModel::PrepareCheckpointDir(const std::string& checkpoint_dir) {
  absl::Status ready;
  if (pg_.rank() != 0 || checkpoint_dir_lock_.has_value()) {
    ready = train::PrepareCheckpointDir(checkpoint_dir, pg_.rank() == 0);
  } else {  // rank 0 locks the folder for the run
    absl::StatusOr<std::optional<CheckpointDirLock>> lock =
        PrepareAndLockCheckpointDir(checkpoint_dir);
    if (lock.ok()) {
      checkpoint_dir_lock_ = *std::move(lock);
    } else {
      ready = lock.status();
    }
  }
  return AgreeOnStatus(pg_, ready, absl::StrCat("preparing --checkpoint_dir ", checkpoint_dir));
}

absl::Status DataParallelModel::SaveCheckpoint(const std::string& checkpoint_dir,
                                               const TrainState& state) {
  const std::string step_dir = absl::StrCat(checkpoint_dir, "/", CheckpointStepName(state.step));
  absl::Status saved;
  if (ddp_ != nullptr) {
    // Every rank holds the same parameters and optimizer state: rank 0 writes.
    if (pg_.rank() == 0) saved = WriteCheckpointStep(checkpoint_dir, model_, *optimizer_, state);
    saved = AgreeOnStatus(pg_, saved, absl::StrCat("saving ", step_dir));
  } else {
    const std::map<std::string, std::string> extra = ShardedCheckpointExtra(state);
    if (pg_.rank() == 0) saved = MakeCheckpointDir(checkpoint_dir);
    saved = AgreeOnStatus(pg_, saved, "creating the checkpoint directory");
    if (saved.ok()) {
      // The same status on every rank (SaveSharded agrees on it).
      saved = zero1_ != nullptr ? dist::SaveSharded(step_dir, *zero1_, pg_, extra)
                                : dist::SaveSharded(step_dir, *fsdp_, *optimizer_, pg_, extra);
    }
  }
  if (!saved.ok()) return saved;
  absl::Status latest;
  if (pg_.rank() == 0) latest = SetLatestCheckpoint(checkpoint_dir, state.step);
  return AgreeOnStatus(pg_, latest, absl::StrCat("pointing ", checkpoint_dir, "/latest at it"));
}

absl::StatusOr<TrainState> DataParallelModel::LoadCheckpoint(const std::string& step_dir,
                                                             const std::string& config) {
  const bool sharded = IsShardedCheckpoint(step_dir);
  absl::Status mismatch;
  if (ddp_ != nullptr && sharded) {
    mismatch = absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", step_dir,
        " is sharded (FSDP or ZeRO-1); resume it with an FSDP strategy "
        "or --strategy=zero1 (any world size), not ddp; or turn it into a single-process "
        "checkpoint with `checkpoint consolidate ",
        step_dir, " OUT` (//tools:checkpoint)"));
  } else if (const std::string lost = ShardsWithoutIndex(step_dir); !lost.empty()) {
    mismatch = absl::DataLossError(lost);
  } else if (!sharded && IsModelOnly(step_dir)) {  // before "shard it": that refuses it too
    mismatch = CheckNotModelOnly(step_dir, "cannot be resumed");
  } else if (ddp_ == nullptr && !sharded) {
    mismatch = absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", step_dir, " is not sharded (no index.json: a single-process or DDP "
        "checkpoint, or not a checkpoint); resume it with --strategy=ddp or --world_size=1, or "
        "turn it into a sharded one that FSDP and ZeRO-1 resume at any world size with "
        "`checkpoint shard ", step_dir, " OUT` (//tools:checkpoint)"));
  }
  // The same on every rank unless the folder is not shared: agree anyway.
  absl::Status s = AgreeOnStatus(pg_, mismatch, absl::StrCat("loading ", step_dir));
  if (!s.ok()) return s;
  if (ddp_ != nullptr) {
    absl::StatusOr<TrainState> state =
        train::LoadCheckpoint(step_dir, model_, *optimizer_, config);
    s = AgreeOnStatus(pg_, state.status(), absl::StrCat("loading ", step_dir));
    if (!s.ok()) return s;
    return state;
  }
  if (!config.empty()) {
    // The model first, from index.json (a failure to read it is LoadSharded's
    // to report).
    absl::Status same;
    const absl::StatusOr<dist::ShardedCheckpointInfo> info =
        dist::ReadShardedCheckpointInfo(step_dir);
    if (info.ok()) {
      const auto saved = info->extra.find("extra.config");
      same = CheckSameModel(saved == info->extra.end() ? "" : saved->second, step_dir, config);
    }
    s = AgreeOnStatus(pg_, same, absl::StrCat("loading ", step_dir));
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::map<std::string, std::string>> extra =
      zero1_ != nullptr ? dist::LoadSharded(step_dir, *zero1_, pg_)
                        : dist::LoadSharded(step_dir, *fsdp_, *optimizer_, pg_);
  if (!extra.ok()) return extra.status();  // the same error on every rank
  return TrainStateFromShardedExtra(*extra, step_dir);
}

namespace {

// The step of a step folder's name ("step_000100": 100); for another name, a
// negative number from its checksum. Trailing slashes are ignored.
int64_t StepFolderId(const std::string& step_dir) {
  const std::string name = FolderAndParent(step_dir).first.filename().string();
  const int64_t step = StepOfName(name);
  if (step >= 0) return step;
  return -1 - static_cast<int64_t>(tensor::Crc32c(name.data(), static_cast<int64_t>(name.size())));
}

}  // namespace

absl::Status AgreeOnResuming(dist::ProcessGroup& pg, const std::string& resume,
                             const std::string& checkpoint_dir) {
  absl::StatusOr<bool> any_resumes = dist::AnyOverRanks(pg, !resume.empty());
  if (!any_resumes.ok()) return any_resumes.status();
  absl::StatusOr<bool> any_fresh = dist::AnyOverRanks(pg, resume.empty());
  if (!any_fresh.ok()) return any_fresh.status();
  if (!*any_resumes || !*any_fresh) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--resume=auto: some ranks found a checkpoint in ", checkpoint_dir,
      " and others did not (this one ", resume.empty() ? "did not" : "did",
      "); give every rank one --checkpoint_dir they all see"));
}

absl::Status AgreeOnLoaderConfig(dist::ProcessGroup& pg, const std::string& config) {
  const absl::StatusOr<std::vector<int64_t>> gathered =
      dist::AllGatherOverRanks(pg, static_cast<int64_t>(tensor::Fnv1a64(config)));
  if (!gathered.ok()) return gathered.status();
  const std::vector<int64_t>& hashes = *gathered;
  std::vector<int> differ;
  for (int r = 1; r < pg.size(); ++r) {
    if (hashes[r] != hashes[0]) differ.push_back(r);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ranks' data differ: the data loader of ", differ.size() == 1 ? "rank " : "ranks ",
      absl::StrJoin(differ, ", "), " is not configured as rank 0's (this rank's: \"", config,
      "\"); each rank reads --data on its own host: give every rank the same file (the same "
      "size and content) and the same data flags"));
}

absl::Status AgreeOnStepFolder(dist::ProcessGroup& pg, const std::string& step_dir,
                               const std::string& resume) {
  const absl::StatusOr<std::vector<int64_t>> gathered =
      dist::AllGatherOverRanks(pg, StepFolderId(step_dir));
  if (!gathered.ok()) return gathered.status();
  const std::vector<int64_t>& ids = *gathered;
  if (std::count(ids.begin(), ids.end(), ids[0]) == pg.size()) return absl::OkStatus();
  std::vector<std::string> steps;
  for (int r = 0; r < pg.size(); ++r) {
    steps.push_back(ids[r] >= 0 ? absl::StrCat("rank ", r, ": step ", ids[r])
                                : absl::StrCat("rank ", r, ": a folder not named step_N"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--resume=", resume, ": the ranks resolved different step folders (",
      absl::StrJoin(steps, ", "), "; this rank: ", step_dir,
      "); resuming them would mix their shards. Each rank reads the folder on its own host: "
      "give every rank one --checkpoint_dir they all see (a shared file system)"));
}

absl::StatusOr<Resumed> DataParallelModel::Resume(const std::string& resume,
                                                  const std::string& checkpoint_dir,
                                                  const std::string& config) {
  // Each rank resolves --resume itself (its view of the folder): all stop
  // together when one cannot.
  absl::StatusOr<std::string> step_dir = ResolveCheckpoint(resume, checkpoint_dir);
  if (absl::Status s = AgreeOnStatus(pg_, step_dir.status(), absl::StrCat("--resume=", resume));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AgreeOnStepFolder(pg_, *step_dir, resume); !s.ok()) return s;
  absl::StatusOr<TrainState> state = LoadCheckpoint(*step_dir, config);
  if (!state.ok()) return ResumeFailure(state.status(), resume, *step_dir);
  // Checks of what each rank read and of its --checkpoint_dir: all stop
  // together when one rank's fail (the others would wait in the first step).
  absl::StatusOr<data::LoaderState> loader = CheckResumable(*state, *step_dir, config);
  absl::Status checked = loader.status();
  if (checked.ok()) checked = CheckStepFolderName(*step_dir, state->step, checkpoint_dir);
  if (absl::Status s = AgreeOnStatus(pg_, checked, absl::StrCat("resuming ", *step_dir));
      !s.ok()) {
    return s;
  }
  return Resumed{std::move(*state), std::move(*loader), *std::move(step_dir)};
}

// ---- Memory ----

namespace {
double PeakMiB(const tensor::MemoryLedger& l, tensor::Device device, int category) {
  return l.Stats(device, static_cast<tensor::MemoryCategory>(category)).peak / 1048576.0;
}
}  // namespace

std::string PerRankMemoryTable(const std::vector<const tensor::MemoryLedger*>& ledgers,
                               tensor::Device device) {
  std::string out = absl::StrFormat("%-5s %11s %11s %11s %11s %11s %11s %11s\n", "rank", "params",
                                    "grads", "optim", "activ", "comm", "temp", "total");
  for (size_t r = 0; r < ledgers.size(); ++r) {
    absl::StrAppendFormat(&out, "%-5d", r);
    for (int c = 0; c < tensor::kNumMemoryCategories; ++c) {
      absl::StrAppendFormat(&out, " %11.2f", PeakMiB(*ledgers[r], device, c));
    }
    absl::StrAppendFormat(&out, " %11.2f\n", ledgers[r]->Total(device).peak / 1048576.0);
  }
  return out;
}

std::string RankMemoryLine(int rank, const tensor::MemoryLedger& ledger, tensor::Device device) {
  const char* names[] = {"params", "grads", "optim", "activ", "comm", "temp"};
  static_assert(sizeof(names) / sizeof(names[0]) == tensor::kNumMemoryCategories);
  std::string out =
      absl::StrCat("peak memory of rank ", rank, device.is_cpu() ? "" : " on ",
                   device.is_cpu() ? "" : device.ToString(), " by category (MiB, ledger):");
  for (int c = 0; c < tensor::kNumMemoryCategories; ++c) {
    absl::StrAppendFormat(&out, " %s %.2f", names[c], PeakMiB(ledger, device, c));
  }
  absl::StrAppendFormat(&out, " total %.2f", ledger.Total(device).peak / 1048576.0);
  return out;
}

}  // namespace train
