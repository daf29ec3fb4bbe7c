// The parameters kept fp32; see fp32_modules.h.
#include "nn/fp32_modules.h"

#include <algorithm>

namespace nn {

std::set<const Parameter*> KeptFp32Parameters(Module& root,
                                              const std::vector<std::string>& classes) {
  std::set<const Parameter*> kept;
  if (classes.empty()) return kept;
  for (auto& [prefix, module] : root.NamedModules()) {
    if (std::find(classes.begin(), classes.end(), module->class_name()) == classes.end()) {
      continue;
    }
    for (auto& [name, p] : module->NamedParameters()) kept.insert(p);  // its own and inside
  }
  return kept;
}

}  // namespace nn
