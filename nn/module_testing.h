// Test helpers over whole modules.
#ifndef NN_MODULE_TESTING_H_
#define NN_MODULE_TESTING_H_

#include "nn/module.h"

namespace nn {
namespace testing {

// Every parameter of `got` has the gradient of the same-named parameter of
// `want`, to the bit (two copies of one module run two ways).
void ExpectSameParamGrads(Module& got, Module& want);

// As ExpectSameParamGrads for the parameters of `got` that train; its frozen
// ones (requires_grad false) have no gradient at all (`want` trained all).
void ExpectTrainableGradsAndNoneFrozen(Module& got, Module& want);

}  // namespace testing
}  // namespace nn

#endif  // NN_MODULE_TESTING_H_
