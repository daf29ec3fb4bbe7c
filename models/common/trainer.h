// train::Trainer: what the training loop (training_loop.h) drives, so that
// one loop serves a run in one process (OneProcessModel, one_process_step.h)
// and each rank of a data-parallel run (DataParallelModel, data_parallel.h):
// preparing and resuming, the micro-batches' gradients, the rest of a step,
// evaluation, samples and checkpoints.
#ifndef MODELS_COMMON_TRAINER_H_
#define MODELS_COMMON_TRAINER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/common/loss_scaling.h"
#include "models/common/train_support.h"
#include "optim/optimizer.h"

namespace train {

struct SampleSchedule;  // data_parallel.h

class Trainer {
 public:
  virtual ~Trainer() = default;

  // The optimizer that steps the model (its learning rate is set per step).
  virtual optim::Optimizer& optimizer() = 0;
  // Before resuming or starting fresh: checkpoint_dir ("" for none) created,
  // checked and locked for this run; a fresh --resume=auto start said where
  // `logs`.
  virtual absl::Status PrepareToTrain(const std::string& checkpoint_dir,
                                      const std::string& resume, bool auto_fresh, bool logs) = 0;
  // --resume ("latest", a step folder, a checkpoint directory) loaded into
  // the model and the optimizer; a checkpoint of another model (`config`)
  // is refused.
  virtual absl::StatusOr<Resumed> Resume(const std::string& resume,
                                         const std::string& checkpoint_dir,
                                         const std::string& config) = 0;
  // Before resuming or starting: every rank's data loaders are configured
  // alike (`loader_config`: their data::LoaderState::config, the training
  // loader's and any evaluation loader's: the data's size, content digest,
  // global batch, ...); each rank reads the data on its own host.
  virtual absl::Status AgreeOnData(const std::string& /*loader_config*/) {
    return absl::OkStatus();
  }
  // After Resume: `local`, this rank's restoring of the data loader and loss
  // scale (its data may differ from another host's copy), agreed over the
  // ranks, so that a failure on one stops every rank before the first step.
  virtual absl::Status AgreeOnRestore(const absl::Status& local) { return local; }
  // Before a step's micro-batches (one process: mixed precision's compute
  // copies).
  virtual void BeginStep() {}
  // micro_step(m) for m = 0 .. K-1, the gradients adding up (only the last
  // communicates); the mean of what it returns (AccumulateGradients).
  virtual double AccumulateGradients(int64_t K,
                                     const std::function<double(int64_t m)>& micro_step) = 0;
  // The rest of the step once the micro-batches' mean loss is `local_loss` at
  // loss scale `scale`: gradients -> unscale (an inf or NaN skips the step)
  // -> clip to `grad_clip` (> 0) -> optimizer step -> zero grads.
  virtual absl::StatusOr<StepResult> FinishTrainingStep(double local_loss, double scale,
                                                        int64_t step, double grad_clip,
                                                        LossScaling& scaling, bool log) = 0;
  // `local_loss` (forward passes only) in eval mode, then training mode
  // again; the mean over the ranks.
  virtual absl::StatusOr<double> Evaluate(const std::function<double()>& local_loss) = 0;
  // A sample: `draw` (forward passes only) in eval mode, what it returns
  // printed on stdout where `print`.
  virtual absl::Status PrintSample(const SampleSchedule& schedule, bool print,
                                   const std::function<absl::StatusOr<std::string>()>& draw) = 0;
  // <checkpoint_dir>/step_<N>, then `latest` pointed at it.
  virtual absl::Status SaveCheckpoint(const std::string& checkpoint_dir,
                                      const TrainState& state) = 0;
};

}  // namespace train

#endif  // MODELS_COMMON_TRAINER_H_
