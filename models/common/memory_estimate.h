// Memory a model's training state needs in one process, from its parameter
// count alone (nothing is allocated): fp32 master weights, fp32 gradients,
// optimizer state, and the low-precision compute copy under mixed precision.
// These are the numbers the memory ledger reports in its parameters,
// gradients and optimizer_state categories for a single-process run.
#ifndef MODELS_COMMON_MEMORY_ESTIMATE_H_
#define MODELS_COMMON_MEMORY_ESTIMATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace train {

struct ModelStateBytes {
  int64_t parameters = 0;       // fp32 masters (+ 2-byte compute copies when mixed)
  int64_t gradients = 0;        // fp32
  int64_t optimizer_state = 0;  // K bytes per parameter
  int64_t total() const { return parameters + gradients + optimizer_state; }
};

// Optimizer state bytes per parameter (K): "adamw" 8 (exp_avg, exp_avg_sq),
// "sgd" 4 (momentum buffer), "sgd-nomomentum" 0.
absl::StatusOr<int> OptimizerBytesPerParameter(absl::string_view optimizer);

ModelStateBytes EstimateModelState(int64_t num_parameters, int optimizer_bytes_per_parameter,
                                   bool mixed_precision);

}  // namespace train

#endif  // MODELS_COMMON_MEMORY_ESTIMATE_H_
