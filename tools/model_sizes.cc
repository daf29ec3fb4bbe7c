// Prints every minGPT and T5 preset's parameter count and the memory its
// training state needs in one process (fp32 and bf16 mixed precision, AdamW
// and SGD), computed from shapes alone: nothing is allocated, so gpt-1t is as
// quick as gpt-nano. `./bazelw run //tools:model_sizes [-- --json]`
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "models/common/command_line.h"
#include "models/common/memory_estimate.h"
#include "models/mingpt/config.h"
#include "models/t5/config.h"

ABSL_FLAG(bool, json, false, "print one JSON object per preset instead of a table");

namespace {

void Print(const std::string& family, const std::string& name, int64_t params) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const int adamw = *train::OptimizerBytesPerParameter("adamw");
  const int sgd = *train::OptimizerBytesPerParameter("sgd");
  const double fp32_adamw = train::EstimateModelState(params, adamw, false).total() / kGiB;
  const double bf16_adamw = train::EstimateModelState(params, adamw, true).total() / kGiB;
  const double fp32_sgd = train::EstimateModelState(params, sgd, false).total() / kGiB;
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"family\":\"%s\",\"preset\":\"%s\",\"parameters\":%lld,\"gib_fp32_adamw\":%.3f,"
        "\"gib_bf16_adamw\":%.3f,\"gib_fp32_sgd\":%.3f}\n",
        family.c_str(), name.c_str(), static_cast<long long>(params), fp32_adamw, bf16_adamw,
        fp32_sgd);
  } else {
    std::printf("%-7s %-12s %16lld %12.3f %12.3f %12.3f\n", family.c_str(), name.c_str(),
                static_cast<long long>(params), fp32_adamw, bf16_adamw, fp32_sgd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(
      argc, argv, "Parameters and memory of every preset: model_sizes [--json].");
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%-7s %-12s %16s %12s %12s %12s\n", "family", "preset", "parameters",
                "fp32+AdamW", "bf16+AdamW", "fp32+SGD");
    std::printf("%-7s %-12s %16s %12s %12s %12s\n", "", "", "", "GiB", "GiB", "GiB");
  }
  for (const std::string& name : mingpt::PresetNames()) {
    Print("mingpt", name, mingpt::CountParameters(*mingpt::Preset(name)).total);
  }
  for (const std::string& name : t5::PresetNames()) {
    Print("t5", name, t5::CountParameters(*t5::Preset(name)).total);
  }
  return 0;
}
