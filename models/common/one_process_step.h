// Training in one process (no data parallelism): FinishOneProcessStep, the
// rest of a step once the micro-batches' forward and backward have run (the
// single-process counterpart of DataParallelModel::FinishTrainingStep), and
// OneProcessModel, the train::Trainer that the training loop drives in one
// process.
#ifndef MODELS_COMMON_ONE_PROCESS_STEP_H_
#define MODELS_COMMON_ONE_PROCESS_STEP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "models/common/checkpoint_dir_lock.h"
#include "models/common/loss_scaling.h"
#include "models/common/train_support.h"
#include "models/common/trainer.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "precision/policy.h"

namespace train {

// After the micro-batches' ForwardBackward returned their mean `loss` at loss
// scale `scale` (with `mixed`'s compute copies as the parameters), in order:
// the fp32 masters back as the parameters, this step's compute copies kept
// (mixed.RestoreMastersKeepingCopies) -> a loss that is not finite is an
// InternalError naming the step (`step` is 0-based; said from 1, as the
// step lines count) -> unscale the fp32 gradients, where
// an inf or NaN skips the step (`scaling`, which logs it) -> clip to a global
// norm of `grad_clip` (when > 0) -> optimizer step, which also writes the
// kept copies for the next step (optim::ParamRef::low_precision_copy) -> zero
// the gradients.
absl::StatusOr<StepResult> FinishOneProcessStep(nn::Module& model, nn::MixedPrecision& mixed,
                                                optim::Optimizer& optimizer, double loss,
                                                double scale, int64_t step, double grad_clip,
                                                LossScaling& scaling);

// A model trained in one process, as the training loop (training_loop.h)
// drives it: --checkpoint_dir locked for the run (CheckpointDirLock); the
// model's nn::MixedPrecision made at the first step (after a resume loaded
// the weights), its compute copies cast at each step's start; the step
// finished by FinishOneProcessStep; evaluation and samples with the compute
// copies (EvalInOneProcess, PrintSampleInOneProcess); single-process
// checkpoints (SaveCheckpoint, ResumeCheckpoint).
class OneProcessModel : public Trainer {
 public:
  // `model` (materialized) and `optimizer` must outlive this object.
  OneProcessModel(nn::Module& model, optim::Optimizer& optimizer,
                  precision::MixedPrecisionPolicy policy);

  optim::Optimizer& optimizer() override { return optimizer_; }
  absl::Status PrepareToTrain(const std::string& checkpoint_dir, const std::string& resume,
                              bool auto_fresh, bool logs) override;
  absl::StatusOr<Resumed> Resume(const std::string& resume, const std::string& checkpoint_dir,
                                 const std::string& config) override;
  void BeginStep() override;
  double AccumulateGradients(int64_t K,
                             const std::function<double(int64_t m)>& micro_step) override;
  absl::StatusOr<StepResult> FinishTrainingStep(double local_loss, double scale, int64_t step,
                                                double grad_clip, LossScaling& scaling,
                                                bool log) override;
  absl::StatusOr<double> Evaluate(const std::function<double()>& local_loss) override;
  absl::Status PrintSample(const SampleSchedule& schedule, bool print,
                           const std::function<absl::StatusOr<std::string>()>& draw) override;
  absl::Status SaveCheckpoint(const std::string& checkpoint_dir,
                              const TrainState& state) override;

 private:
  nn::MixedPrecision& mixed();  // made on first use
  nn::Module& model_;
  optim::Optimizer& optimizer_;
  const precision::MixedPrecisionPolicy policy_;
  std::optional<nn::MixedPrecision> mixed_;
  std::optional<CheckpointDirLock> checkpoint_dir_lock_;
};

}  // namespace train

#endif  // MODELS_COMMON_ONE_PROCESS_STEP_H_
