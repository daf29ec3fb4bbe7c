// Test helpers over whole modules (module_testing.h).
#include "nn/module_testing.h"

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace nn {
namespace testing {

void ExpectSameParamGrads(Module& got, Module& want) {
  auto g = got.NamedParameters(), w = want.NamedParameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(g[i].first, w[i].first);
    EXPECT_TRUE(tensor::testing::AllClose(g[i].second->grad, w[i].second->grad, 0, 0))
        << g[i].first;
  }
}

void ExpectTrainableGradsAndNoneFrozen(Module& got, Module& want) {
  auto g = got.NamedParameters(), w = want.NamedParameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(g[i].first, w[i].first);
    if (g[i].second->requires_grad) {
      EXPECT_TRUE(tensor::testing::AllClose(g[i].second->grad, w[i].second->grad, 0, 0))
          << g[i].first;
    } else {
      EXPECT_FALSE(g[i].second->grad.defined()) << g[i].first;
    }
  }
}

}  // namespace testing
}  // namespace nn
