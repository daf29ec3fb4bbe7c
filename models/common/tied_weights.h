// Tied weights and FSDP units: a parameter the model reads outside its own
// module's forward (T5's tied shared.weight, which the head multiplies by)
// must stay in the root unit, which is gathered whenever the root runs. The
// train binaries refuse a wrap policy that moves it, and tools/fsdp_plan
// refuses to plan that layout, with the same message.
#ifndef MODELS_COMMON_TIED_WEIGHTS_H_
#define MODELS_COMMON_TIED_WEIGHTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dist/wrap_policy.h"
#include "nn/module.h"

namespace train {

// OK when `policy` leaves every parameter named in `root_params` (full names
// relative to `model`) in the root unit. Otherwise InvalidArgument naming the
// first one moved, its unit and `auto_wrap` (the --auto_wrap flag's value).
// A name the model lacks is an InternalError when `must_exist` (a model's
// own list is wrong), else skipped (the planner passes T5's list to minGPT).
absl::Status CheckTiedWeightsInRoot(nn::Module& model, const dist::WrapPolicy& policy,
                                    const std::string& auto_wrap,
                                    const std::vector<std::string>& root_params,
                                    bool must_exist = true);

}  // namespace train

#endif  // MODELS_COMMON_TIED_WEIGHTS_H_
