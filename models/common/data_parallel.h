// Data parallelism for the train binaries: the flags --backend, --world_size,
// --strategy, --auto_wrap, --timeout_s and --rdzv read into one
// DataParallelConfig; the ranks this process runs; each rank's model wrapped
// for the strategy (DDP, ZeRO-1 or FSDP) with the optimizer that steps it; the
// loss averaged over the ranks; peak memory by category per rank. The binaries
// keep their training step written out top to bottom:
//
//   train::RunDataParallel(config, [&](train::RankContext& rank) {
//     GPT model(gpt_config);
//     auto dp = train::DataParallelModel::Create(model, rank.pg, config, std::move(opt), seed);
//     for (step ...) {
//       double local = model.ForwardBackward(batch.inputs, batch.targets);
//       auto loss = dist::MeanOverRanks(rank.pg, local);      // what rank 0 logs
//       (*dp)->FinishBackward();                              // gradients averaged
//       auto norm = (*dp)->ClipGradNorm(grad_clip);           // global norm, all ranks
//       (*dp)->Step();
//       (*dp)->ZeroGrad();
//     }
//   });
//
// Backends (--backend):
//   threads  ranks are threads of this process (--world_size of them; default
//            1); each has its own memory ledger; at the end the process prints
//            every rank's peak memory by category as one table.
//   gloo     this process is ONE rank of a job of processes, as //tools:launch
//            (or torchrun) starts them: RANK and WORLD_SIZE (required),
//            LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//            RESTART_COUNT and RUN_ID come from the environment. The ranks
//            rendezvous through a store (ResolveRendezvous) and talk over Gloo
//            TCP (loopback when the job is on one node). Each rank prints its
//            own peak-memory line at the end (the launcher prefixes "[rank N]").
//   nccl     as gloo (one process per rank, through //tools:launch), over
//            NCCL on cuda:LOCAL_RANK; the ranks meet in a directory store
//            (the default rendezvous directory, or --rdzv=<shared dir>).
//            Needs a --config=cuda build and --device=cuda.
//
// Devices (--device, which the binary owns): cpu, or cuda[:N], where every
// strategy keeps its buffers in device memory. threads: every rank on the
// given device (ranks sharing one GPU; collectives on each rank's
// communication stream in device memory); nccl: rank r of a node on
// cuda:LOCAL_RANK; gloo: CPU only.
// --cpu_offload keeps FSDP's shards, gradients and optimizer state in host
// memory.

#ifndef MODELS_COMMON_DATA_PARALLEL_H_
#define MODELS_COMMON_DATA_PARALLEL_H_

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/process_group.h"
#include "dist/wrap_policy.h"
#include "dist/zero1.h"
#include "models/common/loss_scaling.h"
#include "models/common/checkpoint_dir_lock.h"
#include "models/common/train_support.h"
#include "models/common/trainer.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "precision/policy.h"
#include "tensor/memory_ledger.h"

namespace train {

// ---- Flags ----

enum class Backend { kThreads, kGloo, kNccl };
// "threads", "gloo" or "nccl".
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
absl::string_view BackendName(Backend backend);  // "threads", "gloo", "nccl"

enum class Strategy {
  kDdp,
  kZero1,
  kShardGradOp,
  kFullShard,
  kNoShard,
  kHybridShard,
  kHybridShardZero2
};
// "ddp", "zero1", "shard_grad_op", "full_shard" (also ""), "no_shard",
// "hybrid_shard", "hybrid_shard_zero2" (SHARD_GRAD_OP within the shard groups).
absl::StatusOr<Strategy> ParseStrategy(absl::string_view name);
// "DDP", "ZeRO-1", "FSDP SHARD_GRAD_OP", "FSDP FULL_SHARD", "FSDP NO_SHARD",
// "FSDP HYBRID_SHARD", "FSDP HYBRID_SHARD_ZERO2".
absl::string_view StrategyName(Strategy strategy);
bool IsFsdp(Strategy strategy);
// HYBRID_SHARD or HYBRID_SHARD_ZERO2: sharded within shard groups, replicated across them.
bool IsHybrid(Strategy strategy);

// --auto_wrap: "none" (the root is the only unit), "transformer" (one unit per
// module whose class is in block_classes: "Block" for minGPT, "T5Block" for
// T5) or "size:N" (dist::WrapPolicy::SizeBased(N): a module becomes a unit
// when at least N parameters of its subtree are not in a unit below it).
absl::StatusOr<dist::WrapPolicy> ParseAutoWrap(absl::string_view spec,
                                               const std::set<std::string>& block_classes);

// ---- The launcher's environment (gloo) ----

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // LOCAL_RANK; default: rank
  int local_world_size = 1;  // LOCAL_WORLD_SIZE; default: world_size (one node)
  std::string master_addr;   // MASTER_ADDR; empty when unset
  int master_port = 0;       // MASTER_PORT; 0 when unset
  int restart_count = 0;     // RESTART_COUNT; default 0
  std::string run_id;        // RUN_ID (//tools:launch sets a fresh one per launch); may be empty
  std::string error_file;    // TORCHELASTIC_ERROR_FILE (torchrun's); may be empty
};

// Reads the variables above through `getenv` (std::getenv, or a fake in
// tests). RANK and WORLD_SIZE must be set; every number must be a
// well-formed integer in range. Errors name the variable and its value.
using GetEnvFn = std::function<const char*(const char*)>;
absl::StatusOr<LaunchEnv> ReadLaunchEnv(const GetEnvFn& getenv);

// Where the gloo ranks of one run meet: a store and a key prefix inside it.
struct Rendezvous {
  std::string store;   // a directory (Gloo's FileStore) or "redis://host:port"
  std::string prefix;  // "<run id>/restart<RESTART_COUNT>"
  // The default directory, the run's own: removed when the run ends well (a
  // Redis store or a shared folder loses the run's keys under `prefix` then;
  // run_keys.h).
  bool owned = false;
};

// --rdzv given: that store ("redis://host:port", or a directory, optionally
// "file://<dir>"; another scheme, such as torchrun's tcp:// or c10d://, is
// InvalidArgument), keys under "<RUN_ID or 'run'>/restart<RESTART_COUNT>".
// --rdzv empty (one node): the directory, this user's (`uid`) and this run's,
//   <temp_dir>/fsdp_rdzv_u<uid>_<MASTER_ADDR>_<MASTER_PORT>/<RUN_ID>
// (owned), with keys under "<RUN_ID>/restart<RESTART_COUNT>". RUN_ID is fresh
// for each launch and RESTART_COUNT for each restart, so keys an earlier run
// (or an earlier attempt of this one) left are never read, and a gloo or
// nccl run that ends well removes its folder (run_keys.h). torchrun's RUN_ID "none" (every job's
// without --rdzv-id) adds the name of the agent's log folder for the run,
// from TORCHELASTIC_ERROR_FILE, which every worker of one agent shares.
// Needs MASTER_ADDR, MASTER_PORT and RUN_ID; on several nodes
// (LOCAL_WORLD_SIZE < WORLD_SIZE) a local directory cannot be shared, so
// --rdzv is required. A --rdzv that looks like an endpoint ("host:29400") is
// InvalidArgument too.
absl::StatusOr<Rendezvous> ResolveRendezvous(const std::string& rdzv, const LaunchEnv& env,
                                             const std::string& temp_dir, int64_t uid);
// Before an owned store (Rendezvous::owned) is used: its parent, this user's
// default folder, made 0700 when missing (and chmod 700 when others may
// write it), must be a folder (not a link) that this user owns (others could
// forge the run's keys); FailedPrecondition naming it and what to do
// otherwise.
absl::Status CheckOwnedStore(const std::string& store);
// $TMPDIR, or /tmp.
std::string TempDir();

// ---- The configuration ----

// The flag values as given.
struct DataParallelFlags {
  std::string backend = "threads";
  int world_size = 0;    // 0: 1 with threads, WORLD_SIZE with gloo
  std::string strategy;  // empty: full_shard
  std::string auto_wrap = "transformer";
  double timeout_s = 300;
  std::string rdzv;
  std::string precision = "fp32";
  // FSDP: prefetch and overlap (dist::FsdpOptions), HYBRID_SHARD's group
  // (0: LOCAL_WORLD_SIZE with gloo; required with threads).
  std::string backward_prefetch = "pre";
  bool forward_prefetch = false;
  int max_inflight_all_gathers = 2;
  int hybrid_shard_group_size = 0;
  // FSDP2's explicit prefetch (dist::PrefetchNeighbors) and the last unit
  // kept from its forward to its backward (SetReshardAfterForward).
  int prefetch_units = 0;
  bool keep_last_unit = false;
  // DDP and ZeRO-1: the largest gradient bucket (MiB of fp32 gradients), and
  // the most buckets' low-precision copies in flight at once (0: no bound).
  double bucket_cap_mb = 25;
  int max_inflight_buckets = 2;
  // The binary's --device ("cpu", "cuda", "cuda:N") and FSDP CPU offload.
  std::string device = "cpu";
  bool cpu_offload = false;
};

// Whether the flags ask for data parallelism (otherwise the binaries run
// their plain single-process loop): --world_size other than 0 and 1 (a
// negative one is then an error), --strategy, or a backend other than threads.
bool WantsDataParallel(const DataParallelFlags& flags);

struct DataParallelConfig {
  Backend backend = Backend::kThreads;
  int world_size = 1;
  Strategy strategy = Strategy::kFullShard;
  std::string auto_wrap = "transformer";  // the flag, for logs
  dist::WrapPolicy policy = dist::WrapPolicy::None();
  precision::MixedPrecisionPolicy mixed_precision = precision::MixedPrecisionPolicy::Fp32();
  absl::Duration timeout = dist::DefaultCollectiveTimeout();
  dist::BackwardPrefetch backward_prefetch = dist::BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  int max_inflight_all_gathers = 2;
  int prefetch_units = 0;           // FSDP: dist::PrefetchNeighbors(k); 0: none
  bool keep_last_unit = false;      // FULL_SHARD / HYBRID_SHARD: the last unit that trains not resharded
  int hybrid_shard_group_size = 0;  // HYBRID_SHARD(_ZERO2) only
  double bucket_cap_mb = 25;        // DDP and ZeRO-1 only
  int max_inflight_buckets = 2;     // DDP and ZeRO-1 only
  // Where this process's ranks compute (nccl: cuda:LOCAL_RANK), and FSDP's
  // CPU offload.
  tensor::Device device = tensor::Device::Cpu();
  bool cpu_offload = false;
  // gloo and nccl: this process's rank and where the ranks meet.
  LaunchEnv env;
  Rendezvous rendezvous;

  // "FSDP FULL_SHARD (auto_wrap transformer) over 2 ranks (gloo)".
  std::string Describe() const;
};

// The GPU of a --backend=nccl rank, given the CUDA devices this process sees
// (`visible`): cuda:LOCAL_RANK when the node's GPUs are visible to each of
// its ranks (at least one a rank); cuda:0 when each process sees one GPU of
// its own (CUDA_VISIBLE_DEVICES set per rank: Slurm's --gpus-per-task=1, a
// container per rank). Between those, an InvalidArgument naming both counts
// (NCCL refuses two ranks on one GPU). `visible` 0 (a build without CUDA, no
// device): cuda:LOCAL_RANK, which the nccl engine then refuses, saying why.
absl::StatusOr<tensor::Device> NcclRankDevice(const LaunchEnv& env, int visible);

// Checks the flags and reads the launcher's environment (gloo) through
// `getenv`. Errors are InvalidArgument and name the flag or variable:
// unknown names, --world_size that disagrees with WORLD_SIZE, unsupported
// combinations (the Check... functions above).
absl::StatusOr<DataParallelConfig> ConfigureDataParallel(
    const DataParallelFlags& flags, const std::set<std::string>& block_classes,
    const GetEnvFn& getenv = [](const char* name) -> const char* { return std::getenv(name); });

// For the binaries' one-process loop (WantsDataParallel false), which uses
// none of these flags: a malformed value is still an error naming it (checked
// as ConfigureDataParallel does), and so is a flag that asks for an FSDP
// feature the loop does not have (--cpu_offload, --forward_prefetch,
// --prefetch_units, --keep_last_unit: the error says to add --strategy, which
// runs with one rank too), rather than being ignored.
absl::Status CheckOneProcessFlags(const DataParallelFlags& flags,
                                  const std::set<std::string>& block_classes);

// ---- Running the ranks ----

// What one rank's training function gets.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  dist::ProcessGroup& pg;
  // This rank's ledger (threads: one per rank; gloo: the process's).
  tensor::MemoryLedger& ledger;
  // Rank 0 prints the step log and writes the metrics.
  bool logs() const { return rank == 0; }
};
using RankFn = std::function<absl::Status(RankContext& rank)>;

// threads: runs fn for every rank on its own thread and joins them; then
// prints every rank's peak memory by category (PerRankMemoryTable).
// gloo: joins the job's group (blocks until every rank has arrived, or the
// timeout), runs fn for this process's rank, then prints this rank's line
// (RankMemoryLine). Exceptions thrown by fn (a collective failing inside an
// FSDP hook) become errors. Errors are prefixed "rank N: ".
absl::Status RunDataParallel(const DataParallelConfig& config, const RankFn& fn);

// ---- Inside a rank ----

// Every rank learns whether every rank's `local` is OK (an all-gather): this
// rank's own error when it failed, else Aborted "<what> failed on rank(s) 1
// (see their errors)". For work that can fail on some ranks only (reading
// files), before their next collective: the peers then stop at once instead
// of waiting for the failed rank until their timeout.
absl::Status AgreeOnStatus(dist::ProcessGroup& pg, const absl::Status& local,
                           absl::string_view what);
// Every rank resumes, or none does, after each resolved --resume=auto on its
// own view of checkpoint_dir (`resume`: "" for a fresh start):
// FailedPrecondition on every rank otherwise (a folder they do not all see).
absl::Status AgreeOnResuming(dist::ProcessGroup& pg, const std::string& resume,
                             const std::string& checkpoint_dir);
// Every rank's data loaders have the same configuration (`config`: their
// data::LoaderState::config, the training loader's and the evaluation
// loader's: the data's size and content digest, the global batch, ...):
// FailedPrecondition on every rank naming the ranks whose
// differs from rank 0's (each reads --data on its own host: another copy of
// the data there would feed it other rows than a one-process run's).
absl::Status AgreeOnLoaderConfig(dist::ProcessGroup& pg, const std::string& config);
// Every rank resumes the same step folder (each resolved --resume=latest
// through its own view of the checkpoint directory): FailedPrecondition on
// every rank naming each rank's step when they differ.
absl::Status AgreeOnStepFolder(dist::ProcessGroup& pg, const std::string& step_dir,
                               const std::string& resume);

// One rank's model wrapped for the strategy, and the optimizer that steps it.
class DataParallelModel : public Trainer {
 public:
  // DDP and ZeRO-1: materializes `model` from `seed` and broadcasts rank 0's
  // values. FSDP: shards it by the configured policy with sharded
  // initialization from `seed` (bitwise the values Materialize(seed) gives;
  // no rank materializes the whole model); with frozen parameters the policy
  // is dist::WrapPolicy::FrozenLeavesApart of the configured one. Every parameter named in
  // `root_params` must stay in the root FSDP unit (tied weights read outside
  // their module's forward, such as T5's shared embedding): a policy that
  // moves one into another unit is an InvalidArgument error naming the unit.
  // Collective failures are errors.
  static absl::StatusOr<std::unique_ptr<DataParallelModel>> Create(
      nn::Module& model, dist::ProcessGroup& pg, const DataParallelConfig& config,
      std::unique_ptr<optim::Optimizer> optimizer, uint64_t seed,
      const std::vector<std::string>& root_params = {});
  ~DataParallelModel() override;
  DataParallelModel(const DataParallelModel&) = delete;
  DataParallelModel& operator=(const DataParallelModel&) = delete;

  optim::Optimizer& optimizer() override { return *optimizer_; }
  // "DDP", "ZeRO-1", "FSDP FULL_SHARD, 7 units (auto_wrap transformer)".
  std::string Describe() const;
  // The FSDP model (nullptr for DDP and ZeRO-1).
  dist::FullyShardedModel* fsdp() { return fsdp_.get(); }

  // After ForwardBackward: waits until every rank holds the averaged
  // gradients (ZeRO-1: of its shard; FSDP: done inside backward).
  absl::Status FinishBackward();
  // Clips the gradients to a global 2-norm of max_norm (> 0) over all ranks'
  // shards and returns the norm before clipping; the same on every rank.
  absl::StatusOr<double> ClipGradNorm(double max_norm);
  // Loss scaling: multiplies this rank's (averaged) gradients by inv_scale
  // and returns whether any rank found an inf or NaN (the same on every rank).
  absl::StatusOr<bool> UnscaleGradsAndCheck(double inv_scale);
  // One optimizer step (ZeRO-1: of this rank's shard, then the all-gather of
  // the parameters).
  absl::Status Step();
  // After a step: DDP and ZeRO-1 drop the parameters' gradients (the next
  // backward writes them into the buckets), FSDP drops its gradient shards
  // (the next backward's reduces write them).
  void ZeroGrad();

  // How forward-only work holds FSDP's parameters (DDP and ZeRO-1 hold them
  // whole anyway).
  enum class Gather {
    // Every unit gathered once for all of the work (FullyShardedModel::
    // Unshard, in the compute dtype): the memory of the whole unsharded
    // model, one all-gather of it, and the forwards communicate nothing.
    // Generation's choice when the model fits: decoding N tokens is N
    // forwards.
    kWholeModel,
    // The root unit gathered once (FullyShardedModel::UnshardRoot), and each
    // forward gathers and frees the other units one by one, as a training
    // forward does (FULL_SHARD: the root and the units in flight held at
    // once): an all-gather of every other unit per forward, so every rank
    // must run the same forwards (the same prompt and seed).
    kPerUnit,
  };
  // Forward-only work (evaluation, generation during training): runs
  // `local` with the model in eval mode (no dropout), DDP's and ZeRO-1's
  // compute copies made once (mixed precision: BeginForwardOnly) and FSDP's
  // units gathered as `gather` says; then puts the model back in training
  // mode with its fp32 masters as the parameters (DDP, ZeRO-1 mixed
  // precision) and FSDP's units resharded (FullyShardedModel::Reshard: no
  // unsharded parameters left held). Every rank calls it. `local` calls the
  // model's forward entry points (Forward through Run, Loss, LastLogits,
  // DecodeLogits, T5's Encode and DecodeStep), which run the units' hooks.
  // When `local` throws, the model is put back the same way before the
  // exception goes on (training can go on as if the pass never ran).
  void ForwardOnly(const std::function<void()>& local, Gather gather);

  // Evaluation: ForwardOnly(local_loss, kPerUnit) (forward passes only, e.g.
  // a model's Loss over this rank's rows of the evaluation batches), then the
  // loss averaged over the ranks.
  absl::StatusOr<double> Evaluate(const std::function<double()>& local_loss) override;
  // Trainer's: train::PrintSample(*this, ...) (below).
  absl::Status PrintSample(const SampleSchedule& schedule, bool print,
                           const std::function<absl::StatusOr<std::string>()>& draw) override;
  // Trainer's: train::AccumulateGradients(K, this, micro_step) (below).
  double AccumulateGradients(int64_t K,
                             const std::function<double(int64_t m)>& micro_step) override;

  // Gradient accumulation (--grad_accum_steps): while the guard lives,
  // backward accumulates this rank's gradients locally and communicates
  // nothing (the strategy's no_sync); the next backward outside a guard
  // communicates the sum. Under FULL_SHARD, SHARD_GRAD_OP and the hybrid ones each
  // unit keeps its unsharded fp32 gradient from the first micro-batch to the
  // last (as PyTorch's no_sync), so accumulation costs that memory there.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallelModel& dp);
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    std::optional<dist::DistributedDataParallel::NoSyncGuard> ddp_;
    std::optional<dist::Zero1::NoSyncGuard> zero1_;
    std::optional<dist::FullyShardedModel::NoSyncGuard> fsdp_;
  };

  // The rest of a training step once this rank's ForwardBackward returned
  // `local_loss` at loss scale `scale`, in order: the loss averaged over the
  // ranks (not finite: an error naming the step; `step` is 0-based, said
  // from 1 as the step lines count) -> FinishBackward
  // -> unscale, where an inf or NaN on any rank skips the step on every rank
  // (`scaling`; `log`: say so) -> clip to a global norm of `grad_clip` (when
  // > 0) -> Step -> ZeroGrad. The same result on every rank. One process
  // without data parallelism: train::FinishOneProcessStep.
  absl::StatusOr<StepResult> FinishTrainingStep(double local_loss, double scale, int64_t step,
                                                double grad_clip, LossScaling& scaling,
                                                bool log) override;

  // ---- Checkpoints (collective: every rank calls) ----
  // Saves <checkpoint_dir>/step_<N> and, once every rank is done, points
  // <checkpoint_dir>/latest at it. FSDP and ZeRO-1: a sharded checkpoint
  // (dist::SaveSharded: a file per writing rank + index.json; loadable at
  // another world size, strategy or wrap policy, FSDP <-> ZeRO-1). DDP: every
  // rank holds everything, so rank 0 writes the single-process format
  // (model.safetensors + optimizer.safetensors), which --world_size=1 resumes
  // too. The directory must be one every rank sees. Every rank returns the
  // same success or failure.
  absl::Status SaveCheckpoint(const std::string& checkpoint_dir,
                              const TrainState& state) override;
  // Before training: train::PrepareCheckpointDir on every rank (the folder
  // must be one every rank sees), and rank 0 locks it for this run
  // (CheckpointDirLock, held while this object lives); every rank returns
  // the same result.
  absl::Status PrepareCheckpointDir(const std::string& checkpoint_dir);
  // Before resuming or starting fresh, on every rank: PrepareCheckpointDir
  // (with a checkpoint_dir), AgreeOnResuming (`resume`: --resume resolved on
  // this process, "" for a fresh start), and where `logs`, a fresh
  // --resume=auto start said (`auto_fresh`: PrintAutoFreshStart).
  absl::Status PrepareToTrain(const std::string& checkpoint_dir, const std::string& resume,
                              bool auto_fresh, bool logs) override;
  // Loads a step folder SaveCheckpoint wrote: sharded ones into FSDP or
  // ZeRO-1, single-process ones into DDP (other pairings are InvalidArgument
  // naming the strategy to resume with). Returns the saved TrainState. With
  // a `config`, a checkpoint of another model is refused first
  // (CheckSameModel), before any tensor is read.
  absl::StatusOr<TrainState> LoadCheckpoint(const std::string& step_dir,
                                            const std::string& config = "");
  // --resume: "latest" in checkpoint_dir, a step folder or a checkpoint
  // directory (ResolveCheckpoint); LoadCheckpoint,
  // then CheckResumable against `config` (the model's config string). The
  // caller restores its data loader to `loader` (the global batch must be the
  // same), then rank 0 calls train::PrintResumed. The ranks' counterpart of
  // train::ResumeCheckpoint.
  absl::StatusOr<Resumed> Resume(const std::string& resume, const std::string& checkpoint_dir,
                                 const std::string& config) override;
  absl::Status AgreeOnData(const std::string& loader_config) override {
    return AgreeOnLoaderConfig(pg_, loader_config);
  }
  absl::Status AgreeOnRestore(const absl::Status& local) override {
    return AgreeOnStatus(pg_, local, "restoring the data loader and loss scale");
  }

 private:
  DataParallelModel(nn::Module& model, dist::ProcessGroup& pg, const DataParallelConfig& config);
  nn::Module& model_;
  dist::ProcessGroup& pg_;
  const Strategy strategy_;
  const std::string auto_wrap_;
  const int prefetch_units_;
  const bool keep_last_unit_;
  std::string kept_unit_;  // FSDP with keep_last_unit: the unit not resharded after forward
  bool frozen_leaves_apart_ = false;  // FSDP: dist::WrapPolicy::FrozenLeavesApart applied
  std::unique_ptr<optim::Optimizer> owned_optimizer_;  // DDP, FSDP
  optim::Optimizer* optimizer_ = nullptr;
  std::unique_ptr<dist::DistributedDataParallel> ddp_;
  std::unique_ptr<dist::Zero1> zero1_;
  std::unique_ptr<dist::FullyShardedModel> fsdp_;
  std::optional<CheckpointDirLock> checkpoint_dir_lock_;  // rank 0's
};

// --sample_every and --sample_gather of the train binaries: a sample every
// `every` steps (0: none) and after the last, drawn with the parameters held
// as `gather` says (DataParallelModel::ForwardOnly; one process: whole).
struct SampleSchedule {
  int64_t every = 0;
  DataParallelModel::Gather gather = DataParallelModel::Gather::kWholeModel;

  bool Due(int64_t step_done, int64_t steps) const {
    return every > 0 && (step_done % every == 0 || step_done == steps);
  }
  // InvalidArgument naming the flag unless every >= 0 and gather is "model"
  // or "unit".
  static absl::StatusOr<SampleSchedule> Parse(int64_t every, const std::string& gather);
  // --sample_gather=unit is FSDP's (its units, gathered one by one):
  // InvalidArgument naming the flag for a run without FSDP (`strategy`:
  // nullopt for the single-process loop).
  absl::Status CheckApplies(std::optional<Strategy> strategy) const;
};

// A sample under data parallelism: `draw` (the same work on every rank) runs
// inside dp.ForwardOnly with schedule.gather, and what it returns is printed
// on stdout where `print` (rank 0). What it throws is returned as a status,
// the model put back for training first (ForwardOnly); running out of
// memory with FSDP's whole model gathered adds that --sample_gather=unit
// holds less.
absl::Status PrintSample(DataParallelModel& dp, const SampleSchedule& schedule, bool print,
                         const std::function<absl::StatusOr<std::string>()>& draw);

// Gradient accumulation over K >= 1 micro-batches: calls micro_step(m) for
// m = 0 .. K-1, all but the last under dp's NoSyncGuard (dp null: one process,
// nothing to hold back), and returns the mean of what micro_step returns (the
// micro-batches' losses). micro_step runs micro-batch m's forward and backward
// with its gradient weighted by 1/K (a loss scale of scale / K), so the
// accumulated gradient is that of the mean loss over the K micro-batches.
double AccumulateGradients(int64_t K, DataParallelModel* dp,
                           const std::function<double(int64_t m)>& micro_step);

// ---- Memory ----

// A table of peak MiB by category (params, grads, optim, activ, comm, temp,
// total) on `device`, one row per rank (from the ledgers):
//   rank       params       grads ...
//   0            0.84        0.84 ...
std::string PerRankMemoryTable(const std::vector<const tensor::MemoryLedger*>& ledgers,
                               tensor::Device device = tensor::Device::Cpu());
// One rank's line: "peak memory of rank 1 by category (MiB, ledger): params
// 0.84 grads 0.84 optim 0.42 activ 1.50 comm 0.10 temp 0.33 total 3.21"
// (" on cuda:0" after "rank 1" for a device other than the CPU).
std::string RankMemoryLine(int rank, const tensor::MemoryLedger& ledger,
                           tensor::Device device = tensor::Device::Cpu());

}  // namespace train

#endif  // MODELS_COMMON_DATA_PARALLEL_H_
