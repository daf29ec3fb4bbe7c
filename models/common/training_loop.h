// train::RunTrainingLoop: the steps of a training run, the same in both
// train binaries (//models/mingpt:train, //models/t5:train), in one process
// (train::OneProcessModel) and on each rank of a data-parallel run
// (train::DataParallelModel). The binaries build the model, its Trainer and
// its loaders and say how a micro-batch runs. In order:
//   - --checkpoint_dir prepared and locked; --resume loaded (each rank its
//     part, any world size), with the loader's position and the loss scale;
//   - each step: this rank's batch -> the learning rate -> forward and
//     backward of each of its K micro-batches (only the last communicates)
//     -> FinishTrainingStep (mean loss over the ranks -> gradients ->
//     unscale, an inf or NaN on any rank skipping the step on all -> clip ->
//     optimizer step -> zero grads) -> rank 0's report -> a checkpoint
//     (every --checkpoint_every steps, and after the last: before the work
//     that may fail after it) -> evaluation -> a sample;
//   - rank 0's summary.
#ifndef MODELS_COMMON_TRAINING_LOOP_H_
#define MODELS_COMMON_TRAINING_LOOP_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/common/data_parallel.h"  // SampleSchedule
#include "models/common/loss_scaling.h"
#include "models/common/train_setup.h"
#include "models/common/train_support.h"
#include "models/common/trainer.h"
#include "models/data/loader_state.h"
#include "nn/checkpoint.h"
#include "nn/module.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "tensor/device.h"
#include "tensor/memory_ledger.h"

namespace train {

// What the loop needs from the command line and the run's setup.
struct TrainingLoopSettings {
  int rank = 0;                  // this process's or thread's; rank 0 logs
  int world_size = 1;            // the ranks that share each global batch
  uint64_t seed = 0;             // with the step, seeds each micro-batch's dropout
  int64_t steps = 0;             // the step the run ends after
  int64_t micro_batches = 1;     // K, --grad_accum_steps
  int64_t log_every = 1;
  int64_t checkpoint_every = 0;  // 0: a checkpoint after the last step only
  std::string checkpoint_dir;    // "": no checkpoints
  double grad_clip = 0;          // the global norm to clip to; 0: none
  std::string resume;            // --resume, auto resolved: "" for a fresh start
  bool auto_fresh = false;       // --resume=auto found no checkpoint
  std::string resume_note;       // why `resume` is not --resume's (ResumePlan::note), or ""
  std::string config;            // the model's config string, which checkpoints record
  std::string tokenizer;         // recorded in checkpoints; "" for none
  std::string precision;         // the policy (MixedPrecisionPolicy::ToString()), recorded too
  double tokens_per_step = 0;    // global: every rank's micro-batches
  double flops_per_step = 0;     // global, for the MFU
  double peak_flops = 0;         // of the job's devices; 0: no MFU
  std::string summary_note;      // after "tokens/s" in rank 0's summary
  EvalFlags eval;                // when to evaluate (with TrainingLoopParts::eval_loss)
  tensor::Device device = tensor::Device::Cpu();  // the model's
  const tensor::MemoryLedger* ledger = nullptr;   // this rank's, for the step lines
  const optim::LrSchedule* schedule = nullptr;
  MetricsWriter* metrics = nullptr;
  const SampleSchedule* sample_schedule = nullptr;
  const LossScaling* scaling = nullptr;  // the run's; each rank updates a copy alike
  bool logs() const { return rank == 0; }
};

// What the loop needs from the model's binary. Loader: data::LmLoader or
// data::SpanCorruptionLoader (Next(), state(), Restore()).
template <typename Loader>
struct TrainingLoopParts {
  using Batch = decltype(std::declval<Loader&>().Next());
  nn::Module* model = nullptr;
  Trainer* trainer = nullptr;
  Loader* loader = nullptr;  // this rank's rows of the global batch, K micro-batches
  // Moves a batch Next() returned to the model's device (queued on a GPU:
  // no wait for the previous step's kernels).
  std::function<void(Batch& batch)> to_device;
  // Forward, loss and backward of micro-batch m (0 .. K-1) of `batch`, the
  // gradient weighted by `scale`; returns the loss (unscaled).
  std::function<double(const Batch& batch, int64_t m, double scale)> forward_backward;
  // This rank's mean loss over its rows of the evaluation batches (forward
  // passes only); null: no evaluation.
  std::function<double()> eval_loss;
  // The evaluation loader's configuration (data::LoaderState::config),
  // agreed over the ranks with the training loader's; "": no evaluation.
  std::string eval_config;
  // A sample after step `step_done`, drawn alike on every rank.
  std::function<absl::StatusOr<std::string>(int64_t step_done)> draw;
};

template <typename Loader>
absl::Status RunTrainingLoop(const TrainingLoopSettings& s,
                             const TrainingLoopParts<Loader>& parts) {
  using Batch = typename TrainingLoopParts<Loader>::Batch;
  if (s.ledger == nullptr || s.schedule == nullptr || s.metrics == nullptr ||
      s.sample_schedule == nullptr || s.scaling == nullptr || parts.model == nullptr ||
      parts.trainer == nullptr || parts.loader == nullptr || !parts.to_device ||
      !parts.forward_backward || !parts.draw) {
    return absl::InternalError("RunTrainingLoop: a setting or part it needs was not given");
  }
  Trainer& trainer = *parts.trainer;
  optim::Optimizer& opt = trainer.optimizer();
  Loader& loader = *parts.loader;
  const int64_t K = s.micro_batches;
  const int64_t W = s.world_size;

  // ---- Resume (every rank loads its part; any world size) ----
  LossScaling scaling = *s.scaling;  // this rank's copy; all ranks update alike
  int64_t start = 0;
  absl::Status ready =
      trainer.PrepareToTrain(s.checkpoint_dir, s.resume, s.auto_fresh, s.logs());
  if (ready.ok()) {
    ready = trainer.AgreeOnData(parts.eval_config.empty()
                                    ? loader.state().config
                                    : loader.state().config + " | eval " + parts.eval_config);
  }
  if (!ready.ok()) return ready;
  if (!s.resume.empty()) {
    if (s.logs() && !s.resume_note.empty()) {
      std::fprintf(stderr, "train: note: %s\n", s.resume_note.c_str());
    }
    absl::StatusOr<Resumed> resumed = trainer.Resume(s.resume, s.checkpoint_dir, s.config);
    if (!resumed.ok()) return resumed.status();
    // The same global batch, the same loss scale.
    const std::string scale_note = scaling.RestoreNote(resumed->state.extra);
    absl::Status restored = loader.Restore(resumed->loader);
    if (restored.ok()) restored = scaling.Restore(resumed->state.extra);
    restored = trainer.AgreeOnRestore(restored);
    if (!restored.ok()) return InResumedCheckpoint(*resumed, restored);
    if (s.logs()) {
      PrintResumed(*resumed);
      if (!scale_note.empty()) std::fprintf(stderr, "train: note: %s\n", scale_note.c_str());
      NoteRunSettingsChanges(resumed->state, *s.schedule, opt, s.config, s.precision);
      DropMetricsAfter(*s.metrics, resumed->state.step);  // steps run again
      AfterResume(s.checkpoint_dir, *resumed, s.steps);
    }
    start = resumed->state.step;
  }
  auto save = [&](int64_t step_done) -> absl::Status {
    if (s.checkpoint_dir.empty()) return absl::OkStatus();
    TrainState state;
    state.step = step_done;
    state.loader_state = loader.state().ToString();
    state.extra["config"] = s.config;
    RecordRunSettings(*s.schedule, opt, s.precision, state.extra);
    if (!s.tokenizer.empty()) state.extra["tokenizer"] = s.tokenizer;
    scaling.Save(state.extra);
    return SaveAndSay(s.checkpoint_dir, step_done, s.logs(),
                      [&] { return trainer.SaveCheckpoint(s.checkpoint_dir, state); });
  };

  // A fresh start with --steps=0 trains nothing: no step, evaluation, sample
  // or checkpoint follows, which is said rather than left silent.
  if (s.logs() && s.resume.empty() && s.steps == 0) {
    std::fprintf(stderr, "train: note: --steps=0: nothing to train (no step, evaluation, sample "
                         "or checkpoint follows)\n");
  }

  // ---- Training loop (rank 0 reports; global tokens per step) ----
  StepReporter reporter(*s.ledger, *s.metrics, start, s.steps, s.log_every, s.tokens_per_step,
                        s.device);
  reporter.SetMfu(s.flops_per_step, s.peak_flops);
  StepTimer timer;
  for (int64_t step = start; step < s.steps; ++step) {
    timer.Start();
    Batch batch = loader.Next();  // this rank's K micro-batches
    parts.to_device(batch);
    opt.set_lr(s.schedule->LrAt(step));
    trainer.BeginStep();
    const double scale = scaling.scale();
    // Forward, loss and backward of each micro-batch; only the last one's
    // backward communicates (the others under no_sync).
    const double local_loss = trainer.AccumulateGradients(K, [&](int64_t m) {
      // Dropout masks: a function of the step and the global row (this
      // micro-batch is part m * W + r of the global batch, whatever W).
      nn::SeedRandomSources(*parts.model, s.seed * 1000003 + step, m * W + s.rank, K * W);
      return parts.forward_backward(batch, m, scale / K);
    });
    // Mean loss over ranks -> gradient communication -> unscale (inf/nan on
    // any rank skips the step on all) -> clip by the global norm -> optimizer
    // step -> zero grads.
    absl::StatusOr<StepResult> done =
        trainer.FinishTrainingStep(local_loss, scale, step, s.grad_clip, scaling, s.logs());
    if (!done.ok()) return done.status();
    if (s.logs()) {
      // (Before the checkpoint: a --metrics_out that fails leaves no saved
      // step without its line, for a resume to continue after.)
      absl::Status reported = reporter.Report(step + 1, *done, opt.lr(), timer.ElapsedMs(),
                                              scaling.enabled() ? scale : 0);
      if (!reported.ok()) return reported;
    }
    // The step's checkpoint (every --checkpoint_every steps, and the last)
    // before the work that may fail after it (an evaluation, a sample running
    // out of memory): what the run trained is kept whatever follows. Neither
    // changes anything saved; one that failed is not run again on resume.
    if (step + 1 == s.steps || CheckpointDue(s.checkpoint_every, step + 1, s.steps)) {
      absl::Status saved = save(step + 1);
      if (!saved.ok()) return saved;
    }
    if (parts.eval_loss && EvalAfter(s.eval, step + 1, s.steps)) {
      // Every rank evaluates its rows; the mean over the ranks.
      absl::Status evaluated = reporter.TimedEval(
          step + 1, s.logs(), [&] { return trainer.Evaluate(parts.eval_loss); });
      if (!evaluated.ok()) return evaluated;
    }
    if (s.sample_schedule->Due(step + 1, s.steps)) {
      // Every rank draws alike (FSDP: the units held as --sample_gather
      // says); rank 0 prints.
      absl::Status sampled = trainer.PrintSample(*s.sample_schedule, s.logs(),
                                                 [&] { return parts.draw(step + 1); });
      if (!sampled.ok()) return sampled;
    }
  }
  if (s.logs()) reporter.PrintSummary(s.summary_note);
  return absl::OkStatus();
}

}  // namespace train

#endif  // MODELS_COMMON_TRAINING_LOOP_H_
