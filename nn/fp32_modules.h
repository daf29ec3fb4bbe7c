// The parameters a mixed-precision policy keeps fp32 (its
// fp32_module_classes): those of every module of a listed class and of every
// module inside one, as PyTorch FSDP keeps a whole module of its
// _module_classes_to_ignore in full precision. The layers compute in their
// weights' dtype (Linear and LayerNorm cast their input to it; BatchNorm
// computes in fp32 whatever comes in), so such a module computes in fp32.
#ifndef NN_FP32_MODULES_H_
#define NN_FP32_MODULES_H_

#include <set>
#include <string>
#include <vector>

#include "nn/module.h"

namespace nn {

std::set<const Parameter*> KeptFp32Parameters(Module& root,
                                              const std::vector<std::string>& classes);

}  // namespace nn

#endif  // NN_FP32_MODULES_H_
