// The rest of a one-process training step (one_process_step.h).
#include "models/common/one_process_step.h"

#include <cmath>
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
        absl::StrCat("loss is ", loss, " at step ", step, "; lower --lr or check the data"));
  }
  StepResult result;
  result.loss = loss;
  std::vector<optim::ParamRef> refs = optim::FromModule(model);
  // Loss scaling: unscale the fp32 gradients; inf/nan skips the step.
  absl::StatusOr<bool> apply = scaling.FinishStep(
      scale, step + 1, /*log=*/true,
      [&](double inv) -> absl::StatusOr<bool> { return UnscaleGradients(refs, inv); });
  if (!apply.ok()) return apply.status();
  if (*apply) {
    if (grad_clip > 0) {
      result.grad_norm = optim::ClipGradNorm(refs, grad_clip);
      absl::Status finite = CheckGradNorm(result.grad_norm, step);
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

}  // namespace train
