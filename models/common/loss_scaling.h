// Loss scaling in the train binaries (--loss_scale, --init_loss_scale), as
// torch.cuda.amp.GradScaler: the backward starts from loss * scale(); the
// gradients are unscaled and checked for inf/nan (on every rank: the flag is
// agreed); a step with a non-finite gradient is skipped and, with "dynamic",
// the scale backs off (x0.5), growing (x2) after 2000 good steps in a row.
//
//   --loss_scale=auto     dynamic for fp16 (--precision=fp16 needs it), none
//                         otherwise (the default)
//   --loss_scale=none     no scaling
//   --loss_scale=dynamic  precision::DynamicLossScaler from --init_loss_scale
//   --loss_scale=<x>      a fixed scale x > 0 (steps with inf/nan still skipped)
//
// Scaling by a power of two is exact in floating point: an fp32 run with
// --loss_scale=1024 trains bit for bit like one without (barring overflow).
#ifndef MODELS_COMMON_LOSS_SCALING_H_
#define MODELS_COMMON_LOSS_SCALING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/param_ref.h"
#include "precision/loss_scaler.h"

namespace train {

class LossScaling {
 public:
  // `needs_scaling`: the precision policy asks for it (fp16). `init_scale`:
  // --init_loss_scale when given (dynamic's first scale; unset: 65536).
  // Errors name the flag: an unknown spec, a scale that is not a positive
  // finite number, --loss_scale=none with fp16, --init_loss_scale with a
  // mode that is not dynamic (it would be ignored).
  static absl::StatusOr<LossScaling> FromFlags(const std::string& spec,
                                               std::optional<double> init_scale,
                                               bool needs_scaling);

  bool enabled() const { return enabled_; }
  // The factor of this step's backward (1 when disabled).
  double scale() const;
  // After the gradients were unscaled by 1 / scale() and checked
  // (`found_non_finite` agreed by every rank): whether to apply the step.
  bool Update(bool found_non_finite);
  // The train loops' use of the above after a backward from loss * `scale`:
  // `unscale(1 / scale)` multiplies the gradients and says whether any rank
  // found an inf or NaN; then Update. Returns whether to apply the step
  // (always true when disabled, without calling `unscale`); a skipped step is
  // printed when `log` ("step 3: inf/nan gradients at loss scale 65536:
  // skipped; loss scale dynamic (now 32768)"). The kMaxSkippedInARow-th
  // step skipped in a row is an InternalError naming the 1-based `step`
  // instead: the run is not training (a dynamic scale halved that many times
  // is far below any use), rather than going on to its end doing nothing.
  absl::StatusOr<bool> FinishStep(double scale, int64_t step, bool log,
                                  const std::function<absl::StatusOr<bool>(double)>& unscale);
  int64_t skipped_steps() const { return skipped_; }
  static constexpr int kMaxSkippedInARow = 50;
  // "none", "dynamic (init 65536)", "fixed 1024".
  std::string Describe() const;

  // Checkpoints: the scale and its run of good steps under "loss_scale" and
  // "loss_scale_good_steps" in TrainState::extra (nothing when disabled),
  // and the steps skipped in a row, when any, under
  // "loss_scale_skipped_in_a_row" (a resumed run stops where an
  // uninterrupted one would);
  // Restore reads them when present (DataLoss unless the scale is a positive
  // finite number and the count a count). A scale above what this run's
  // precision may start from (a bf16 run's grown past 2^64, resumed with
  // fp16: 50 halvings would not bring it into fp16's range) is not
  // continued: the run starts from its initial scale (RestoreNote says so).
  void Save(std::map<std::string, std::string>& extra) const;
  absl::Status Restore(const std::map<std::string, std::string>& extra);
  // What Restore(extra) would change that the run's flags did not say, for a
  // note on resume; "" when nothing: a dynamic scale that continues from the
  // checkpoint's in place of this run's initial one ("the dynamic loss scale
  // continues from the checkpoint's 65536 in place of the initial 1024
  // (--init_loss_scale applies to a fresh start)"), a checkpoint's dynamic
  // scale that a fixed or no scale replaces, or one too high to continue.
  std::string RestoreNote(const std::map<std::string, std::string>& extra) const;

 private:
  LossScaling() = default;
  bool enabled_ = false;
  double fixed_ = 1.0;
  std::optional<precision::DynamicLossScaler> dynamic_;
  // The largest dynamic scale this run starts from: 2^64 with fp16, 2^150
  // otherwise (FromFlags' bounds); a checkpoint's above it is not continued.
  double max_start_scale_ = 0;
  int64_t skipped_ = 0;
  int64_t skipped_in_a_row_ = 0;  // by FinishStep
};

// One process: multiplies every gradient by `inv_scale` in place and returns
// whether any is inf or NaN.
bool UnscaleGradients(const std::vector<optim::ParamRef>& refs, double inv_scale);

}  // namespace train

#endif  // MODELS_COMMON_LOSS_SCALING_H_
