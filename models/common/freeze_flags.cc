// --freeze (freeze_flags.h): which parameters stay fixed while fine-tuning.
#include "models/common/freeze_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nn/freeze.h"

ABSL_FLAG(std::string, freeze, "",
          "parameters to keep fixed while the rest train (fine-tuning), comma-separated: a "
          "parameter's name, a module above names (transformer.wte, transformer.h.0) or a glob "
          "(transformer.h.[0-5].*, *.bias); frozen parameters get no gradient, no optimizer "
          "state and no gradient communication. Empty: everything trains");

namespace train {
namespace {

// "124.44M" from a million on, else the count itself ("1325").
std::string Count(int64_t n) {
  return n >= 1000000 ? absl::StrFormat("%.2fM", n / 1e6) : absl::StrCat(n);
}

}  // namespace

std::string FreezeFlag() { return absl::GetFlag(FLAGS_freeze); }

absl::StatusOr<std::string> ApplyFreeze(nn::Module& model, absl::string_view flag) {
  absl::StatusOr<std::vector<std::string>> patterns = nn::ParseFreezePatterns(flag);
  if (!patterns.ok()) return patterns.status();
  if (patterns->empty()) return std::string();
  absl::StatusOr<std::vector<std::string>> frozen = nn::FreezeParameters(model, *patterns);
  if (!frozen.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--freeze: ", frozen.status().message()));
  }
  const nn::TrainableCount count = nn::CountTrainable(model);
  if (count.trainable == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--freeze='", flag, "' freezes every parameter of the model: nothing would train"));
  }
  return absl::StrCat("frozen: ", absl::StrJoin(*patterns, ", "), " | ", frozen->size(),
                      frozen->size() == 1 ? " tensor, " : " tensors, ",
                      Count(count.total - count.trainable), " of ", Count(count.total),
                      " parameters; ", Count(count.trainable), " train");
}

}  // namespace train
