// ParamRefs from modules, decay ranges of slices, and ref validation.
#include "optim/param_ref.h"

#include <memory>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace optim {
namespace {

using nn::Context;
using nn::InitSpec;
using nn::Tensors;
using tensor::Tensor;

// A module with a decayed weight, an undecayed bias and a child.
class Leaf : public nn::Module {
 public:
  Leaf() : Module("Leaf") {
    RegisterParameter("weight", {2, 3}, InitSpec::Normal(0, 0.02f));
    RegisterParameter("bias", {3}, InitSpec::Zeros(), /*weight_decay=*/false);
  }

 protected:
  Tensors Forward(const Tensors& in, Context&) override { return in; }
  Tensors Backward(const Tensors& g, Context&) override { return g; }
};

class Net : public nn::Module {
 public:
  Net() : Module("Net") {
    RegisterParameter("scale", {4}, InitSpec::Ones(), /*weight_decay=*/false);
    leaf = RegisterModule("leaf", std::make_unique<Leaf>());
  }
  Leaf* leaf;

 protected:
  Tensors Forward(const Tensors& in, Context&) override { return in; }
  Tensors Backward(const Tensors& g, Context&) override { return g; }
};

TEST(ParamRefTest, FromModuleNamesDecayAndSharing) {
  Net net;
  EXPECT_TRUE(FromModule(net).empty());  // no values yet
  net.Materialize(1);
  EXPECT_TRUE(FromModule(net).empty());  // no gradients yet
  for (auto& [name, p] : net.NamedParameters()) {
    if (name != "scale") p->GradBuffer();
  }
  std::vector<ParamRef> refs = FromModule(net);
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].name, "leaf.weight");
  EXPECT_EQ(refs[0].decay_ranges, (ElementRanges{{0, 6}}));
  EXPECT_EQ(refs[1].name, "leaf.bias");
  EXPECT_TRUE(refs[1].decay_ranges.empty());
  auto params = net.NamedParameters();
  EXPECT_EQ(refs[0].param.raw_data(), params[1].second->value.raw_data());
  EXPECT_EQ(refs[0].grad.raw_data(), params[1].second->grad.raw_data());
  EXPECT_NO_THROW(CheckParamRefs("test", refs));
  // A frozen parameter is not the optimizer's, even with a gradient left over.
  params[1].second->requires_grad = false;
  refs = FromModule(net);
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0].name, "leaf.bias");
}

TEST(ParamRefTest, SliceRanges) {
  const ElementRanges r = {{0, 10}, {20, 30}, {40, 50}};
  EXPECT_EQ(SliceRanges(r, 0, 50), r);
  EXPECT_EQ(SliceRanges(r, 5, 25), (ElementRanges{{0, 5}, {15, 20}}));
  EXPECT_EQ(SliceRanges(r, 10, 20), ElementRanges{});
  EXPECT_EQ(SliceRanges(r, 45, 100), (ElementRanges{{0, 5}}));
}

TEST(ParamRefTest, CheckParamRefsNamesTheProblem) {
  Tensor p = Tensor::Zeros({4});
  Tensor g = Tensor::Zeros({4});
  auto message = [](const std::vector<ParamRef>& refs) -> std::string {
    try {
      CheckParamRefs("sgd", refs);
    } catch (const tensor::OpError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message({MakeParamRef("x", p, g, true)}), "");
  EXPECT_EQ(message({{"x", p, g, {{0, 2}, {2, 4}}}}), "");
  EXPECT_NE(message({MakeParamRef("x", p, Tensor::Zeros({5}), true)}).find("[sgd] parameter 'x'"),
            std::string::npos);
  EXPECT_NE(message({MakeParamRef("x", p, Tensor(), true)}).find("'x' has no gradient"),
            std::string::npos);
  EXPECT_NE(message({MakeParamRef("x", p.To(tensor::Dtype::kF16), g, true)}).find("must be f32"),
            std::string::npos);
  EXPECT_NE(message({{"x", p, g, {{2, 4}, {0, 2}}}}).find("decay range [0, 2)"), std::string::npos);
  EXPECT_NE(message({{"x", p, g, {{0, 5}}}}).find("decay range [0, 5)"), std::string::npos);
  EXPECT_NE(message({MakeParamRef("x", p, g, true), MakeParamRef("x", p, g, true)})
                .find("'x' appears twice"),
            std::string::npos);
}

}  // namespace
}  // namespace optim
