// Tied weights must stay in the root FSDP unit (tied_weights.h).
#include "models/common/tied_weights.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace train {

absl::Status CheckTiedWeightsInRoot(nn::Module& model, const dist::WrapPolicy& policy,
                                    const std::string& auto_wrap,
                                    const std::vector<std::string>& root_params,
                                    bool must_exist) {
  const std::vector<dist::UnitPlan> plan = dist::PlanUnits(model, policy);
  for (const std::string& name : root_params) {
    const dist::UnitPlan* holder = nullptr;
    for (const dist::UnitPlan& unit : plan) {
      for (const auto& [param_name, param] : unit.params) {
        if (param_name == name) holder = &unit;
      }
    }
    if (holder == nullptr) {
      if (!must_exist) continue;
      return absl::InternalError(
          absl::StrCat("DataParallelModel: the model has no parameter '", name, "'"));
    }
    if (!holder->name.empty()) {
      // A unit of the tied weights alone (T5's `shared`) is wrapped by size:N
      // for every N up to its parameters; a unit holding more may be wrapped
      // anew above that, or not below it (its children wrapped apart).
      int64_t held = 0;
      bool tied_only = true;
      for (const auto& [param_name, param] : holder->params) {
        held += param->numel();
        tied_only = tied_only && std::find(root_params.begin(), root_params.end(),
                                           param_name) != root_params.end();
      }
      std::string larger;
      if (absl::StartsWith(auto_wrap, "size:")) {
        larger = tied_only ? absl::StrCat(" (a size:N keeps it in the root only for N above ",
                                          held, ", the parameters of '", holder->name,
                                          "', and then wraps only modules larger than that)")
                           : " or another size:N";
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "--auto_wrap=", auto_wrap, " puts '", name, "' into the FSDP unit '", holder->name,
          "', but it must stay in the root unit (the model reads it outside ", holder->name,
          "'s forward: a tied weight); use --auto_wrap=transformer", larger));
    }
  }
  return absl::OkStatus();
}

}  // namespace train
