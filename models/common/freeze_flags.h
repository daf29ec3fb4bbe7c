// --freeze, the flag both train binaries take to fine-tune with some
// parameters kept fixed (PyTorch's requires_grad_(False)), defined once here;
// link this library to get it. Patterns are nn::FreezeParameters'.
#ifndef MODELS_COMMON_FREEZE_FLAGS_H_
#define MODELS_COMMON_FREEZE_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nn/module.h"

namespace train {

// The flag's value, after absl::ParseCommandLine.
std::string FreezeFlag();

// Freezes the parameters of `model` that `flag` (comma-separated patterns)
// selects, before the model is wrapped for data parallelism, and returns the
// line the binaries print:
//   "frozen: transformer.wte, transformer.wpe | 2 tensors, 39.38M of 124.44M
//    parameters; 85.06M train"   (counts under a million in full: "1200 of 1325")
// or "" for an empty flag (everything trains). Errors are InvalidArgument
// naming --freeze: an empty pattern, a pattern that selects no parameter, or
// every parameter frozen (nothing would train).
absl::StatusOr<std::string> ApplyFreeze(nn::Module& model, absl::string_view flag);

}  // namespace train

#endif  // MODELS_COMMON_FREEZE_FLAGS_H_
