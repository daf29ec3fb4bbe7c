// Freezing parameters by name.
#include "nn/freeze.h"

#include <fnmatch.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace nn {

bool FreezePatternMatches(absl::string_view pattern, absl::string_view name) {
  if (pattern.empty()) return false;
  if (name == pattern) return true;
  if (absl::StartsWith(name, pattern) && name[pattern.size()] == '.') return true;  // a module
  const std::string p(pattern), n(name);
  return fnmatch(p.c_str(), n.c_str(), /*flags=*/0) == 0;  // `*` crosses dots
}

absl::StatusOr<std::vector<std::string>> FreezeParameters(
    Module& root, const std::vector<std::string>& patterns) {
  const std::vector<std::pair<std::string, Parameter*>> params = root.NamedParameters();
  std::vector<bool> selected(params.size(), false);
  for (const std::string& pattern : patterns) {
    bool any = false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (FreezePatternMatches(pattern, params[i].first)) selected[i] = any = true;
    }
    if (!any) {
      std::vector<std::string> examples;
      for (size_t i = 0; i < params.size() && examples.size() < 4; ++i) {
        examples.push_back(params[i].first);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "freeze pattern '", pattern, "' selects no parameter of the model (names such as ",
          absl::StrJoin(examples, ", "), ", ...; a pattern is a name, a module above names, ",
          "or a glob such as transformer.h.[0-5].*)"));
    }
  }
  std::vector<std::string> frozen;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!selected[i]) continue;
    params[i].second->requires_grad = false;
    params[i].second->DropGrad();  // a frozen parameter has no gradient
    frozen.push_back(params[i].first);
  }
  return frozen;
}

absl::StatusOr<std::vector<std::string>> ParseFreezePatterns(absl::string_view flag) {
  std::vector<std::string> patterns;
  if (absl::StripAsciiWhitespace(flag).empty()) return patterns;
  for (absl::string_view part : absl::StrSplit(flag, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--freeze='", flag, "' has an empty pattern (patterns are comma-separated)"));
    }
    patterns.emplace_back(part);
  }
  return patterns;
}

bool HasTrainableParameters(Module& module) {
  for (const auto& [name, p] : module.NamedParameters()) {
    if (p->requires_grad) return true;
  }
  return false;
}

size_t FirstTrainableChild(Container& children) {
  size_t i = 0;
  while (i < children.size() && !HasTrainableParameters(*children.at(i))) ++i;
  return i;
}

TrainableCount CountTrainable(Module& root) {
  TrainableCount count;
  for (const auto& [name, p] : root.NamedParameters()) {
    count.total += p->numel();
    if (p->requires_grad) count.trainable += p->numel();
  }
  return count;
}

}  // namespace nn
