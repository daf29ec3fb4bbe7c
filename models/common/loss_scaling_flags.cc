// The train binaries' loss-scaling flags (loss_scaling_flags.h).
#include "models/common/loss_scaling_flags.h"

#include <optional>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, loss_scale, "auto",
          "auto (dynamic for fp16, else none), none, dynamic, or a fixed scale: the backward "
          "starts from loss x scale; steps with inf/nan gradients are skipped");
ABSL_FLAG(std::optional<double>, init_loss_scale, std::nullopt,
          "--loss_scale=dynamic: the first scale (unset: 65536); an error with other modes");

namespace train {

absl::StatusOr<LossScaling> LossScalingFromCommandLine(bool needs_scaling) {
  return LossScaling::FromFlags(absl::GetFlag(FLAGS_loss_scale),
                                absl::GetFlag(FLAGS_init_loss_scale), needs_scaling);
}

}  // namespace train
