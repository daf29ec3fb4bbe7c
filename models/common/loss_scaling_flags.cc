// The train binaries' loss-scaling flags (loss_scaling_flags.h).
#include "models/common/loss_scaling_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, loss_scale, "auto",
          "auto (dynamic for fp16, else none), none, dynamic, or a fixed scale: the backward "
          "starts from loss x scale; steps with inf/nan gradients are skipped");
ABSL_FLAG(double, init_loss_scale, 65536, "--loss_scale=dynamic: the first scale");

namespace train {

absl::StatusOr<LossScaling> LossScalingFromCommandLine(bool needs_scaling) {
  return LossScaling::FromFlags(absl::GetFlag(FLAGS_loss_scale),
                                absl::GetFlag(FLAGS_init_loss_scale), needs_scaling);
}

}  // namespace train
