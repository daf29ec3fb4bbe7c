// RunToolMain (tool_main.h).
#include "models/common/tool_main.h"

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "tensor/guarded.h"

namespace train {

int RunToolMain(absl::string_view program, const std::function<absl::Status()>& run,
                absl::string_view out_of_memory_hint) {
  const absl::Status s = tensor::Guarded(run);
  if (s.ok()) return 0;
  const std::string name(program);
  std::fprintf(stderr, "%s: error: %s\n", name.c_str(), std::string(s.message()).c_str());
  if (!out_of_memory_hint.empty() && s.code() == absl::StatusCode::kResourceExhausted &&
      absl::StrContains(s.message(), "out of memory")) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(out_of_memory_hint).c_str());
  }
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace train
