// Test helpers over whole modules.
#ifndef NN_MODULE_TESTING_H_
#define NN_MODULE_TESTING_H_

#include <string>

#include "gtest/gtest.h"
#include "nn/module.h"
#include "tensor/error.h"
#include "tensor/testing.h"

namespace nn {
namespace testing {

// Every parameter of `got` has the gradient of the same-named parameter of
// `want`, to the bit (two copies of one module run two ways).
void ExpectSameParamGrads(Module& got, Module& want);

// As ExpectSameParamGrads for the parameters of `got` that train; its frozen
// ones (requires_grad false) have no gradient at all (`want` trained all).
void ExpectTrainableGradsAndNoneFrozen(Module& got, Module& want);

// A norm layer of width 6 (LayerNorm, RMSNorm): an output gradient not shaped
// as x (the same elements) is refused by RunBackward and RunBackwardAdding
// with OpError `message` before any gradient buffer is touched (no parameter
// has a gradient after); a correct backward afterwards gives a fresh layer's
// input and parameter gradients.
template <typename Norm>
void ExpectWrongOutputGradientRefused(const std::string& message) {
  using tensor::testing::RandomTensor;
  Norm norm(6), fresh(6);
  norm.Materialize(3);
  fresh.Materialize(3);
  const tensor::Tensor x = RandomTensor({4, 6}, 40);
  const tensor::Tensor bad = RandomTensor({6, 4}, 41);
  for (bool adding : {false, true}) {
    Context ctx;
    norm.Run(x, ctx);
    try {
      if (adding) {
        norm.RunBackwardAdding(bad, RandomTensor({4, 6}, 42), ctx);
      } else {
        norm.RunBackward(bad, ctx);
      }
      ADD_FAILURE() << "no error";
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
    for (const auto& [name, p] : norm.NamedParameters()) EXPECT_FALSE(p->grad.defined()) << name;
  }
  const tensor::Tensor g = RandomTensor({4, 6}, 43);
  Context c1, c2;
  norm.Run(x, c1);
  fresh.Run(x, c2);
  EXPECT_TRUE(tensor::testing::AllClose(norm.RunBackward(g, c1), fresh.RunBackward(g, c2), 0, 0));
  ExpectSameParamGrads(norm, fresh);
}

}  // namespace testing
}  // namespace nn

#endif  // NN_MODULE_TESTING_H_
