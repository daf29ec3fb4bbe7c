// The main of the tools that run a model outside training (minGPT's sample,
// T5's generate): the run's failure, thrown or returned, said on stderr as
// "<program>: error: <message>" with its exit code, and after running out of
// memory the tool's own flags that ask for less.
#ifndef MODELS_COMMON_TOOL_MAIN_H_
#define MODELS_COMMON_TOOL_MAIN_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace train {

// Runs `run`, turning what it throws into a status (running out of memory,
// tensor::OutOfMemoryError, into ResourceExhausted). On a failure prints
// "<program>: error: <message>", and after running out of memory
// "<program>: <out_of_memory_hint>" when one is given. Returns the exit
// code: 0, 2 for InvalidArgument (bad flags), else 1.
int RunToolMain(absl::string_view program, const std::function<absl::Status()>& run,
                absl::string_view out_of_memory_hint = "");

}  // namespace train

#endif  // MODELS_COMMON_TOOL_MAIN_H_
