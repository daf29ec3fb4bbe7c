// The loss-scaling flags both train binaries take (--loss_scale,
// --init_loss_scale), defined once here; link this library to get them.
#ifndef MODELS_COMMON_LOSS_SCALING_FLAGS_H_
#define MODELS_COMMON_LOSS_SCALING_FLAGS_H_

#include "absl/status/statusor.h"
#include "models/common/loss_scaling.h"

namespace train {

// LossScaling::FromFlags of the flags, after absl::ParseCommandLine.
// `needs_scaling`: the precision policy asks for it (fp16).
absl::StatusOr<LossScaling> LossScalingFromCommandLine(bool needs_scaling);

}  // namespace train

#endif  // MODELS_COMMON_LOSS_SCALING_FLAGS_H_
