// Model-state memory from parameter counts.
#include "models/common/memory_estimate.h"

#include "absl/strings/str_cat.h"

namespace train {

absl::StatusOr<int> OptimizerBytesPerParameter(absl::string_view optimizer) {
  if (optimizer == "adamw") return 8;
  if (optimizer == "sgd") return 4;
  if (optimizer == "sgd-nomomentum") return 0;
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", optimizer,
                                                 "'; expected adamw, sgd or sgd-nomomentum"));
}

ModelStateBytes EstimateModelState(int64_t n, int k, bool mixed) {
  ModelStateBytes b;
  b.parameters = 4 * n + (mixed ? 2 * n : 0);
  b.gradients = 4 * n;
  b.optimizer_state = static_cast<int64_t>(k) * n;
  return b;
}

}  // namespace train
