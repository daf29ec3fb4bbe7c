// The rest of a training step in one process (no data parallelism), once the
// micro-batches' forward and backward have run: the single-process
// counterpart of DataParallelModel::FinishTrainingStep, so that both train
// binaries' plain loops finish a step the same way.
#ifndef MODELS_COMMON_ONE_PROCESS_STEP_H_
#define MODELS_COMMON_ONE_PROCESS_STEP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "models/common/loss_scaling.h"
#include "models/common/train_support.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace train {

// After the micro-batches' ForwardBackward returned their mean `loss` at loss
// scale `scale` (with `mixed`'s compute copies as the parameters), in order:
// the fp32 masters back as the parameters, this step's compute copies kept
// (mixed.RestoreMastersKeepingCopies) -> a loss that is not finite is an
// InternalError naming the 0-based `step` -> unscale the fp32 gradients, where
// an inf or NaN skips the step (`scaling`, which logs it) -> clip to a global
// norm of `grad_clip` (when > 0) -> optimizer step, which also writes the
// kept copies for the next step (optim::ParamRef::low_precision_copy) -> zero
// the gradients.
absl::StatusOr<StepResult> FinishOneProcessStep(nn::Module& model, nn::MixedPrecision& mixed,
                                                optim::Optimizer& optimizer, double loss,
                                                double scale, int64_t step, double grad_clip,
                                                LossScaling& scaling);

}  // namespace train

#endif  // MODELS_COMMON_ONE_PROCESS_STEP_H_
