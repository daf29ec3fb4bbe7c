// The rest of a one-process training step (one_process_step.h).
#include "models/common/one_process_step.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "optim/clip_grad.h"
#include "optim/param_ref.h"

namespace train {

absl::StatusOr<StepResult> FinishOneProcessStep(nn::Module& model, nn::MixedPrecision& mixed,
                                                optim::Optimizer& optimizer, double loss,
                                                double scale, int64_t step, double grad_clip,
                                                LossScaling& scaling) {
  // This step's compute copies are kept for the optimizer to overwrite with
  // the next step's (below); a skipped step drops them at the next cast.
  mixed.RestoreMastersKeepingCopies();
  if (!std::isfinite(loss)) {
    return absl::InternalError(
        absl::StrCat("loss is ", loss, " at step ", step + 1, "; lower --lr or check the data"));
  }
  StepResult result;
  result.loss = loss;
  std::vector<optim::ParamRef> refs = optim::FromModule(model);
  // Loss scaling: unscale the fp32 gradients; inf/nan skips the step.
  absl::StatusOr<bool> apply = scaling.FinishStep(
      scale, step + 1, /*log=*/true,
      [&](double inv) -> absl::StatusOr<bool> { return UnscaleGradients(refs, inv); });
  if (!apply.ok()) return apply.status();
  result.skipped = !*apply;
  if (*apply) {
    if (grad_clip > 0) {
      result.grad_norm = optim::ClipGradNorm(refs, grad_clip);
      absl::Status finite = CheckGradNorm(result.grad_norm, step + 1);
      if (!finite.ok()) {
        model.ZeroGrad(/*set_to_none=*/true);
        return finite;
      }
    }
    // The step writes the next step's compute copies as it updates the
    // masters (AdamW on a GPU in the same pass): no cast of every master in
    // the next CastForCompute.
    for (optim::ParamRef& ref : refs) ref.low_precision_copy = mixed.ComputeCopyToWrite(ref.param);
    optimizer.Step(refs);
  }
  // Dropped, not zeroed (PyTorch's zero_grad default): the next backward
  // writes each gradient where it would add to zeros (no memset of every
  // gradient, no GEMM reading zeros), and no gradient is held between steps.
  model.ZeroGrad(/*set_to_none=*/true);
  return result;
}

OneProcessModel::OneProcessModel(nn::Module& model, optim::Optimizer& optimizer,
                                 precision::MixedPrecisionPolicy policy)
    : model_(model), optimizer_(optimizer), policy_(std::move(policy)) {}

nn::MixedPrecision& OneProcessModel::mixed() {
  if (!mixed_.has_value()) mixed_.emplace(model_, policy_);
  return *mixed_;
}

absl::Status OneProcessModel::PrepareToTrain(const std::string& checkpoint_dir,
                                             const std::string& resume, bool auto_fresh,
                                             bool logs) {
  // Checked now, not at the first save; locked for this run until it ends.
  absl::StatusOr<std::optional<CheckpointDirLock>> lock =
      PrepareAndLockCheckpointDir(checkpoint_dir);
  if (!lock.ok()) return lock.status();
  checkpoint_dir_lock_ = *std::move(lock);
  // A fresh start was planned before the lock (PlanResume, before the data
  // and the model): a run that saved into the folder meanwhile is not
  // replaced.
  if (resume.empty() && !checkpoint_dir.empty()) {
    absl::Status fresh = CheckFreshCheckpointDir(checkpoint_dir);
    if (!fresh.ok()) return fresh;
  }
  if (auto_fresh && logs) PrintAutoFreshStart(checkpoint_dir);
  return absl::OkStatus();
}

absl::StatusOr<Resumed> OneProcessModel::Resume(const std::string& resume,
                                                const std::string& checkpoint_dir,
                                                const std::string& config) {
  return ResumeCheckpoint(resume, checkpoint_dir, model_, optimizer_, config);
}

void OneProcessModel::BeginStep() { mixed().CastForCompute(); }

double OneProcessModel::AccumulateGradients(int64_t K,
                                            const std::function<double(int64_t m)>& micro_step) {
  double sum = 0;  // nothing to hold back: every backward adds up locally
  for (int64_t m = 0; m < K; ++m) sum += micro_step(m);
  return sum / K;
}

absl::StatusOr<StepResult> OneProcessModel::FinishTrainingStep(double local_loss, double scale,
                                                               int64_t step, double grad_clip,
                                                               LossScaling& scaling,
                                                               bool /*log*/) {
  return FinishOneProcessStep(model_, mixed(), optimizer_, local_loss, scale, step, grad_clip,
                              scaling);
}

absl::StatusOr<double> OneProcessModel::Evaluate(const std::function<double()>& local_loss) {
  return EvalInOneProcess(model_, mixed(), local_loss);
}

absl::Status OneProcessModel::PrintSample(
    const SampleSchedule& /*schedule*/, bool /*print*/,
    const std::function<absl::StatusOr<std::string>()>& draw) {
  return PrintSampleInOneProcess(model_, mixed(), draw);  // the whole model, printed
}

absl::Status OneProcessModel::SaveCheckpoint(const std::string& checkpoint_dir,
                                             const TrainState& state) {
  return train::SaveCheckpoint(checkpoint_dir, model_, optimizer_, state);
}

}  // namespace train
