// What the train binaries share: checkpoints (model + optimizer + training
// state, safetensors, written atomically) and their resume; the per-step log
// lines, JSON-lines metrics and step timer are in step_report.h (included).
//
// A checkpoint directory holds one folder per saved step and a `latest` file
// naming the newest:
//   <dir>/step_000100/model.safetensors      fp32 weights, Hugging Face names
//   <dir>/step_000100/optimizer.safetensors  optimizer state ("<param>.exp_avg", ...)
//   <dir>/latest                             "step_000100"
#ifndef MODELS_COMMON_TRAIN_SUPPORT_H_
#define MODELS_COMMON_TRAIN_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/common/checkpoint_dir.h"
#include "models/common/step_report.h"
#include "models/data/loader_state.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/safetensors.h"

namespace train {

// What besides weights and optimizer state a resumed run needs.
struct TrainState {
  int64_t step = 0;                          // steps completed
  std::string loader_state;                  // data::LoaderState::ToString()
  std::map<std::string, std::string> extra;  // e.g. the model config, the loss scale
};

// Writes <dir>/step_<N>/ and then points <dir>/latest at it (both atomic:
// the step's two files are written into a temporary folder that replaces
// step_<N> as a whole, tensor::ReplaceFolderDurably; a step_<N> that holds
// anything but a checkpoint's files is refused, FailedPrecondition).
absl::Status SaveCheckpoint(const std::string& dir, nn::Module& model,
                            const optim::Optimizer& optimizer, const TrainState& state);
// Runs `save` (a save of step `step` into checkpoint_dir); when it succeeds
// and `log`, says so on stdout: "saved checkpoint <dir>/step_N (S MiB in T s)"
// (S: the step folder's files, as this process sees them).
absl::Status SaveAndSay(const std::string& checkpoint_dir, int64_t step, bool log,
                        const std::function<absl::Status()>& save);
// The first half of SaveCheckpoint: the step folder; SetLatestCheckpoint
// (checkpoint_dir.h) is the second, the `latest` file (data-parallel runs
// point `latest` at a step only once every rank saved).
absl::Status WriteCheckpointStep(const std::string& dir, nn::Module& model,
                                 const optim::Optimizer& optimizer, const TrainState& state);
// model.safetensors' metadata key listing the module buffers among its
// entries (names joined by ','), which WriteCheckpointStep and
// ConsolidateShardedCheckpoint write: the single-process format holds
// parameters and buffers alike (nn::StateDict), and only this tells them
// apart without the model (`checkpoint shard`).
inline constexpr char kBufferNamesKey[] = "fsdp.buffers";

// Both files' metadata key holding one random id per save, so that a step
// folder whose model.safetensors and optimizer.safetensors come from
// different saves (one copied from another step or run) is refused
// (CheckSameSave), not resumed with one's weights and the other's moments.
inline constexpr char kCheckpointIdKey[] = "fsdp.checkpoint_id";
// DataLoss naming step_dir and both ids when the two files' metadata carry
// different checkpoint ids, or only one carries one (files written before
// the ids carry none: accepted).
absl::Status CheckSameSave(const std::string& step_dir,
                           const std::map<std::string, std::string>& model_metadata,
                           const std::map<std::string, std::string>& optimizer_metadata);

// The files of a step folder (which must exist) from named tensors: the
// model's fp32 values as nn::StateDict names them, the optimizer's state as
// optim::Optimizer::StateTensors() names it, and `state` in the metadata
// (and `buffer_names` under kBufferNamesKey when there are any), both files
// under one new checkpoint id.
absl::Status WriteCheckpointFiles(const std::string& step_dir, const tensor::NamedTensors& model,
                                  const tensor::NamedTensors& optimizer_state,
                                  const std::string& optimizer_name, const TrainState& state,
                                  const std::vector<std::string>& buffer_names = {});
// The metadata WriteCheckpointFiles gives model.safetensors (the training
// state) and optimizer.safetensors (the optimizer's name), each with
// `checkpoint_id` (NewSaveId(), one for both files), for writers that stream
// the two files (checkpoint_convert.h).
std::map<std::string, std::string> CheckpointModelMetadata(const TrainState& state,
                                                           const std::string& checkpoint_id);
std::map<std::string, std::string> CheckpointOptimizerMetadata(const std::string& optimizer_name,
                                                               const std::string& checkpoint_id);
// A fresh random id for one save's files.
std::string NewSaveId();

// `resume` is "latest" (the newest checkpoint in checkpoint_dir), the path of
// a step folder, or of a checkpoint directory (what --checkpoint_dir names:
// its latest step, as the sample binary's --checkpoint takes). Returns the
// step folder. A folder that is neither is an error naming the step folders
// it holds, if any. A folder that is missing is an
// error (DataLoss when `latest` names it, with the other checkpoints beside
// it) that names the copy an interrupted save left aside ("<folder>.old-*",
// tensor::ReplaceFolderDurably) and how to put it back.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& resume,
                                              const std::string& checkpoint_dir);

// --resume=auto, what a job restarted by //tools:launch --max_restarts (or
// rerun by a scheduler) gives from its first start: "latest" when
// checkpoint_dir's `latest` names its newest checkpoint; a later step folder
// holding one (a save interrupted before `latest`, or a `latest` set back);
// else its newest step folder (a run killed between its first save's folder
// and `latest`, or a `latest` naming a step that is gone); else "" (a fresh
// start). A `latest` whose save was interrupted with its copy set aside is an
// error saying how to put it back (ResolveCheckpoint's); so is a later
// "step_N" holding no checkpoint one can read (not a folder, unreadable, its
// index lost: FailedPrecondition naming it), which would otherwise be passed
// over and replaced. Other values are returned as they are. InvalidArgument
// for auto without a checkpoint_dir.
absl::StatusOr<std::string> ResolveAutoResume(const std::string& resume,
                                              const std::string& checkpoint_dir);

// The train binaries' --resume, decided before anything else runs:
// ResolveAutoResume, then CheckFreshCheckpointDir for a fresh start. A
// --resume given (not auto) must name a checkpoint ResolveCheckpoint finds
// (its error otherwise), so that a wrong one stops the run before it reads
// data, builds the model or creates checkpoint_dir. Nor may this run's saves
// replace another run's checkpoints: a checkpoint of another folder is
// refused as a fresh start is when checkpoint_dir holds checkpoints; going
// back to an earlier step of checkpoint_dir than its newest (also to the one
// `latest` names, when later step folders are there, with a checkpoint or
// none one can read) is refused, naming them, the newest to resume and the
// `mv`s that move them aside (InvalidArgument). On a restart of a job (attempt.restart > 0)
// whose earlier attempt locked checkpoint_dir (its .lock names the launch:
// LockedForLaunch is attempt.launch), the given --resume (where its first
// attempt started) gives way to the folder's latest checkpoint, as auto
// would take, and ResumePlan::note says so when that is another checkpoint.
// A restart whose earlier attempts were refused gets the same checks, and
// refusal, again (saying --resume=auto continues a job's own checkpoints).
struct ResumePlan {
  std::string resume;       // what to resume ("latest", a folder); "" for a fresh start
  bool auto_fresh = false;  // --resume=auto found no checkpoint (the run says so)
  std::string note;         // for stderr (rank 0): why `resume` is not the flag's
};
// Which attempt of which launch this process is: RESTART_COUNT and
// LAUNCH_ID (//tools:launch: fresh for each launch, the same for its
// restarts, whatever --rdzv_id says), or TORCHELASTIC_RESTART_COUNT and the
// agent's folder for the run in TORCHELASTIC_ERROR_FILE (torchrun, one
// node); restart 0 and no launch when unset, empty or malformed.
struct JobAttempt {
  int restart = 0;
  std::string launch;
};
JobAttempt JobAttemptFromEnvironment();
absl::StatusOr<ResumePlan> PlanResume(const std::string& resume_flag,
                                      const std::string& checkpoint_dir,
                                      const JobAttempt& attempt);
// The launch whose process holds, or last held, checkpoint_dir's lock
// (CheckpointDirLock writes "... for launch <JobAttempt::launch>" when there
// is one); "" when none is named.
std::string LockedForLaunch(const std::string& checkpoint_dir);
// What a run says on stdout when --resume=auto found no checkpoint in
// checkpoint_dir (ResumePlan::auto_fresh): it starts from step 0.
void PrintAutoFreshStart(const std::string& checkpoint_dir);

// Before a run that starts fresh (no --resume) saves into checkpoint_dir:
// InvalidArgument when the folder holds an earlier run's checkpoints (a
// `latest` naming one, or step folders), which this run's saves would
// replace one by one, naming them and the ways on (--resume, --resume=auto,
// or another --checkpoint_dir). OK for an empty or missing folder, or one
// whose `latest` names a step that is gone and holds no step folder.
absl::Status CheckFreshCheckpointDir(const std::string& checkpoint_dir);

// Loads weights into `model` (fp32 values) and state into `optimizer` from a
// step folder; a missing, truncated or corrupted file is a clear error. With
// a `config` (the model's config string), a checkpoint of another model is
// refused first (CheckSameModel), before any tensor is read.
absl::StatusOr<TrainState> LoadCheckpoint(const std::string& step_dir, nn::Module& model,
                                          optim::Optimizer& optimizer,
                                          const std::string& config = "");

// Whether a checkpoint whose config string is `saved` (GptConfig /
// T5Config::ToString: "name(key=value, ...)") can be resumed by a model of
// `config`: the same values of every field but the dropout (which the
// forward alone applies: a resume may change it, as nanoGPT's does) and the
// name (a preset's fields given as flags are the same model). Else
// InvalidArgument naming the fields that differ, both values of each.
absl::Status CheckSameModel(const std::string& saved, const std::string& step_dir,
                            const std::string& config);
// What a resume that CheckSameModel lets through changes (the dropout), one
// line each: "the checkpoint was trained with dropout=0.1; continuing with
// dropout=0"; empty when nothing.
std::vector<std::string> ResumedModelChanges(const std::string& saved, const std::string& config);

// The training state of a model.safetensors file's metadata; DataLoss naming
// `path` when the step is missing.
absl::StatusOr<TrainState> TrainStateFromMetadata(const std::map<std::string, std::string>& meta,
                                                  const std::string& path);


// What a tool given "a step folder or a checkpoint directory" reads: `path`
// itself when it is a step folder (sharded, or holding model.safetensors) or
// no folder at all (reading it then fails, naming what is missing); else the
// step its `latest` file names. A folder that holds no checkpoint is said as
// such (InvalidArgument; was "cannot open '<folder>/model.safetensors'"): an
// empty folder, a --checkpoint_dir before its first save, a `latest` naming
// a step that is gone or no folder (with the checkpoints beside it).
absl::StatusOr<std::string> StepFolderOf(const std::string& path);
// Sharded checkpoints (dist/sharded_checkpoint.h, written by FSDP and ZeRO-1)
// keep the training state in their `extra` map: "step", "loader_state" and
// "extra.<key>" for each TrainState::extra entry.
std::map<std::string, std::string> ShardedCheckpointExtra(const TrainState& state);
// DataLoss naming step_dir when the step is missing or not a count.
absl::StatusOr<TrainState> TrainStateFromShardedExtra(
    const std::map<std::string, std::string>& extra, const std::string& step_dir);

// The loader position to continue from, once a checkpoint's state is loaded:
// InvalidArgument when the checkpoint is of another model (CheckSameModel of
// extra["config"] and `config`) or its loader state does not parse.
absl::StatusOr<data::LoaderState> CheckResumable(const TrainState& state,
                                                 const std::string& step_dir,
                                                 const std::string& config);
// A step folder of checkpoint_dir named "step_N" for another step than the
// `step` it holds (renamed, or another step's files copied in): this run's
// save of step N would replace it. FailedPrecondition naming both and the
// `mv` to its own name; OK for another name, or a folder elsewhere (this
// run saves into checkpoint_dir).
absl::Status CheckStepFolderName(const std::string& step_dir, int64_t step,
                                 const std::string& checkpoint_dir);

// The train binaries' "init_from: <source>" line. A run started from
// --init_from continues with the same flags and --resume: then --init_from
// gives only the configuration, which the line says.
std::string InitFromLine(absl::string_view source, bool resuming);

// A resumed run's state and the loader position to restore (the global batch
// must be the same).
struct Resumed {
  TrainState state;
  data::LoaderState loader;
  std::string step_dir;  // the step folder it was loaded from
};
// A failure to load `step_dir` for --resume=`resume`: the message prefixed
// "--resume=<resume>: ", and when the folder's files are damaged or missing
// (DataLoss: truncated, a checksum that differs; NotFound, Unavailable: a
// file missing or that cannot be opened) followed by the other
// checkpoints beside it, newest first, and how to resume one of them, so
// that the steps they hold are not lost to one bad save.
absl::Status ResumeFailure(const absl::Status& failure, const std::string& resume,
                           const std::string& step_dir);
// --resume in one process: "latest" in checkpoint_dir, a step folder or a
// checkpoint directory (ResolveCheckpoint); LoadCheckpoint into `model` and `optimizer` (its errors
// as ResumeFailure says), then CheckResumable against `config` (the
// model's config string); the caller restores its loader and loss scale,
// then PrintResumed. DataParallelModel::Resume is the same for the ranks of a data-parallel run.
absl::StatusOr<Resumed> ResumeCheckpoint(const std::string& resume,
                                         const std::string& checkpoint_dir, nn::Module& model,
                                         optim::Optimizer& optimizer, const std::string& config);
// Once a resumed run restored everything and has steps to train: when
// resumed.step_dir is a step folder of `checkpoint_dir` (its folder for that
// step) and checkpoint_dir/latest names another (a later step, of the run
// this one branches off), points `latest` at it and says so on stdout, so
// that --resume=latest before this run's first save continues this run, not
// the abandoned one. The later folders stay (a save of this run at their
// step replaces them). Nothing for another directory, or when latest already
// names it; a failure to write is a warning on stderr (the run goes on).
void PointLatestAtResumed(const std::string& checkpoint_dir, const Resumed& resumed);
// "resumed from <step folder> at step N" on stdout: once the loader and the
// loss scale restored too (a refusal of either is the run's error alone).
void PrintResumed(const Resumed& resumed);
// After a resume, for a run of `steps` steps in all: PointLatestAtResumed
// when it trains past the checkpoint's step; otherwise a note on stderr that
// there is nothing to train (--steps is the total, not the steps to add),
// and PointLatestAtResumed only when `latest` names an earlier step, or one
// that is gone (it moves forward, never back).
void AfterResume(const std::string& checkpoint_dir, const Resumed& resumed, int64_t steps);
// A failure to restore what `resumed` holds besides the weights (the data
// loader's position, the loss scale): `failure` with "checkpoint <step_dir>: "
// before its message, so the error names the checkpoint; OK stays OK.
absl::Status InResumedCheckpoint(const Resumed& resumed, const absl::Status& failure);
// Whether to save a checkpoint after step_done (1-based) of `steps` every
// `every` steps (0: never here; the last step's is saved as the last).
bool CheckpointDue(int64_t every, int64_t step_done, int64_t steps);

// One process: loss() in eval mode (no dropout) with `mixed`'s compute copies
// as the parameters; then training mode and the fp32 masters again (also
// when `loss` throws, before the exception goes on).
double EvalInOneProcess(nn::Module& model, nn::MixedPrecision& mixed,
                        const std::function<double()>& loss);
// The same for any forward-only work (generation during training).
void ForwardOnlyInOneProcess(nn::Module& model, nn::MixedPrecision& mixed,
                             const std::function<void()>& work);
// A sample in one process: `draw` inside ForwardOnlyInOneProcess, and what
// it returns printed on stdout.
absl::Status PrintSampleInOneProcess(nn::Module& model, nn::MixedPrecision& mixed,
                                     const std::function<absl::StatusOr<std::string>()>& draw);

}  // namespace train

#endif  // MODELS_COMMON_TRAIN_SUPPORT_H_
