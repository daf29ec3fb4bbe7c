// Freezing parameters by name (PyTorch's `p.requires_grad_(False)` over
// `named_parameters()`): fine-tuning a pretrained model with its embeddings,
// its first blocks or all but its head kept fixed. A frozen parameter has no
// gradient, no optimizer state and no gradient communication (see
// nn::Parameter::requires_grad).
#ifndef NN_FREEZE_H_
#define NN_FREEZE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nn/containers.h"
#include "nn/module.h"

namespace nn {

// Whether `pattern` selects the parameter named `name` (a full dotted name, as
// NamedParameters() gives it): the name itself ("transformer.wte.weight"), a
// module above it ("transformer.h.0" selects every parameter of block 0), or
// a shell glob over the whole name ("transformer.h.[0-5].*", "*.bias";
// `*` crosses dots).
bool FreezePatternMatches(absl::string_view pattern, absl::string_view name);

// Sets requires_grad = false on every parameter of `root` that one of
// `patterns` selects, and returns their names in registration order. Each
// pattern must select at least one parameter: one that selects none (a typo,
// another model's names) is an InvalidArgument naming it, and then nothing is
// frozen.
absl::StatusOr<std::vector<std::string>> FreezeParameters(Module& root,
                                                          const std::vector<std::string>& patterns);

// The patterns of a --freeze flag: comma-separated, spaces around each
// trimmed, empty entries an InvalidArgument naming the flag. "" gives none.
absl::StatusOr<std::vector<std::string>> ParseFreezePatterns(absl::string_view flag);

// Whether any parameter of `module`'s subtree trains (requires_grad). A
// model's backward need not reach a module below its lowest trainable one: no
// gradient is wanted there (PyTorch's autograd never gets there either).
bool HasTrainableParameters(Module& module);
// The index of the first child of `children` (a model's blocks) with a
// trainable parameter, or children.size() when none has one: the lowest block
// a backward must reach when nothing below the blocks trains.
size_t FirstTrainableChild(Container& children);

// Elements of the parameters of `root` that train (requires_grad), and of all.
struct TrainableCount {
  int64_t trainable = 0;
  int64_t total = 0;
};
TrainableCount CountTrainable(Module& root);

}  // namespace nn

#endif  // NN_FREEZE_H_
