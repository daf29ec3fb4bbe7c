// Containers: Sequential order and names, ModuleList access, Residual's two
// gradient paths, all with finite-difference gradients; ApplyCheckpointing
// flags and its errors.
#include "nn/containers.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/dropout.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

std::vector<std::string> ParamNames(Module& m) {
  std::vector<std::string> out;
  for (auto& [name, p] : m.NamedParameters()) out.push_back(name);
  return out;
}

void Randomize(Module& m, uint64_t seed) {
  m.Materialize(seed);
  for (auto& [name, p] : m.NamedParameters())
    p->value = RandomTensor(p->shape, seed++, -0.5f, 0.5f);
}

// Checks d<f(x), w_out>/d{x, every parameter} of `m` against finite differences.
void ExpectGradientsMatch(Module& m, const Tensor& x, const Tensor& w_out) {
  auto loss = [&](const Tensor&) {
    Context c;
    return Dot(m.Run(x, c), w_out);
  };
  m.ZeroGrad();
  Context ctx;
  m.Run(x, ctx);
  Tensor gx = m.RunBackward(w_out, ctx);
  EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2)) << "x";
  for (auto& [name, p] : m.NamedParameters()) {
    EXPECT_TRUE(AllClose(p->grad, NumericalGradient(loss, p->value), 1e-3, 1e-2)) << name;
  }
}

std::unique_ptr<Sequential> SmallStack() {
  auto seq = std::make_unique<Sequential>();
  seq->Append(std::make_unique<Linear>(4, 6));
  seq->Append(std::make_unique<LayerNorm>(6));
  seq->Append(std::make_unique<Linear>(6, 3));
  return seq;
}

TEST(SequentialTest, RunsChildrenInOrderWithIndexNames) {
  auto seq = SmallStack();
  EXPECT_EQ(seq->class_name(), "Sequential");
  EXPECT_EQ(ParamNames(*seq), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                        "2.weight", "2.bias"}));
  Randomize(*seq, 1);
  const Tensor x = RandomTensor({5, 4}, 2);
  Context c, c0, c1, c2;
  Tensor want = seq->at(2)->Run(seq->at(1)->Run(seq->at(0)->Run(x, c0), c1), c2);
  EXPECT_TRUE(AllClose(seq->Run(x, c), want, 0, 0));
}

TEST(SequentialTest, GradientsMatchFiniteDifferences) {
  auto seq = SmallStack();
  Randomize(*seq, 3);
  ExpectGradientsMatch(*seq, RandomTensor({2, 5, 4}, 4), RandomTensor({2, 5, 3}, 5));
}

TEST(SequentialTest, EmptyIsTheIdentity) {
  Sequential seq;
  const Tensor x = RandomTensor({3}, 6);
  Context ctx;
  EXPECT_TRUE(seq.Run(x, ctx).SharesStorageWith(x));
  EXPECT_TRUE(seq.RunBackward(x, ctx).SharesStorageWith(x));
}

TEST(ModuleListTest, HoldsChildrenForTheParent) {
  std::vector<std::unique_ptr<Module>> layers;
  layers.push_back(std::make_unique<Linear>(3, 3));
  layers.push_back(std::make_unique<Linear>(3, 2));
  ModuleList list(std::move(layers));
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.class_name(), "ModuleList");
  EXPECT_EQ(ParamNames(list),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(list.at(1), list.NamedChildren()[1].second);
  EXPECT_THROW(list.at(2), tensor::OpError);
  Randomize(list, 7);
  const Tensor x = RandomTensor({4, 3}, 8);
  Context ctx;
  try {
    list.Run(x, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[module_list] a ModuleList holds children", 0), 0u);
  }
  // The parent's loop, plain and with child 1 checkpointed: same results.
  const Tensor g = RandomTensor({4, 2}, 9);
  Tensor gx[2];
  std::vector<float> grads[2];
  for (int pass = 0; pass < 2; ++pass) {
    list.set_checkpointed(1, pass == 1);
    list.ZeroGrad(/*set_to_none=*/true);
    Context c0, c1;
    Tensor y = list.RunAt(1, list.RunAt(0, x, c0), c1);
    gx[pass] = list.RunBackwardAt(0, list.RunBackwardAt(1, g, c1), c0);
    grads[pass] = list.at(1)->NamedParameters()[0].second->grad.ToVector<float>();
  }
  EXPECT_TRUE(list.checkpointed(1));
  EXPECT_TRUE(AllClose(gx[1], gx[0], 0, 0));
  EXPECT_EQ(grads[1], grads[0]);
}

// f: (..., 4) -> (..., 4).
std::unique_ptr<Sequential> SquareStack() {
  auto seq = std::make_unique<Sequential>();
  seq->Append(std::make_unique<LayerNorm>(4));
  seq->Append(std::make_unique<Linear>(4, 4));
  return seq;
}

TEST(ResidualTest, AddsTheInput) {
  Residual res(SquareStack());
  EXPECT_EQ(res.class_name(), "Residual");
  EXPECT_EQ(ParamNames(res),
            (std::vector<std::string>{"fn.0.weight", "fn.0.bias", "fn.1.weight", "fn.1.bias"}));
  Randomize(res, 10);
  const Tensor x = RandomTensor({3, 4}, 11);
  Context c, cf;
  std::vector<float> fx = res.fn()->Run(x, cf).ToVector<float>();
  std::vector<float> vx = x.ToVector<float>();
  for (size_t i = 0; i < fx.size(); ++i) fx[i] += vx[i];
  EXPECT_TRUE(AllClose(res.Run(x, c), Tensor::FromVector(fx, x.shape()), 1e-7, 1e-6));
}

TEST(ResidualTest, GradientsMatchFiniteDifferences) {
  Residual res(SquareStack());
  Randomize(res, 12);
  ExpectGradientsMatch(res, RandomTensor({2, 3, 4}, 13), RandomTensor({2, 3, 4}, 14));
}

// f returning the incoming gradient itself (Dropout in eval): the residual
// must not add into the caller's gradient tensor.
TEST(ResidualTest, DoesNotWriteIntoTheCallersGradient) {
  Residual res(std::make_unique<Dropout>(0.5f));
  res.Train(false);
  const Tensor x = RandomTensor({5}, 15);
  const Tensor g = RandomTensor({5}, 16);
  const std::vector<float> g_before = g.ToVector<float>();
  Context ctx;
  EXPECT_TRUE(AllClose(res.Run(x, ctx), tensor::Scale(x, 2.0), 0, 0));  // x + x
  Tensor gx = res.RunBackward(g, ctx);
  EXPECT_EQ(g.ToVector<float>(), g_before);
  std::vector<float> want = g_before;
  for (float& v : want) v *= 2;
  EXPECT_EQ(gx.ToVector<float>(), want);
}

// x f32 with a bf16 f: y and the input gradient stay f32.
TEST(ResidualTest, KeepsTheInputsDtype) {
  auto lin = std::make_unique<Linear>(4, 4);
  Linear* raw = lin.get();
  Residual res(std::move(lin));
  Randomize(res, 17);
  raw->weight()->value = raw->weight()->value.To(Dtype::kBF16);
  raw->bias()->value = raw->bias()->value.To(Dtype::kBF16);
  Context ctx;
  Tensor y = res.Run(RandomTensor({2, 4}, 18), ctx);
  EXPECT_EQ(y.dtype(), Dtype::kF32);
  EXPECT_EQ(res.RunBackward(RandomTensor({2, 4}, 19), ctx).dtype(), Dtype::kF32);
}

TEST(ResidualTest, ShapeMismatchIsAClearError) {
  Residual res(std::make_unique<Linear>(4, 3));
  res.Materialize(1);
  Context ctx;
  try {
    res.Run(Tensor::Zeros({2, 4}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[residual] fn (Linear) output (2,3) does not match the input (2,4)");
  }
}

TEST(ApplyCheckpointingTest, FlagsMatchingChildrenAndKeepsNames) {
  Sequential seq;
  seq.Append(std::make_unique<Residual>(SquareStack()));
  seq.Append(std::make_unique<Linear>(4, 4));
  seq.Append(std::make_unique<Residual>(SquareStack()));
  const std::vector<std::string> names = ParamNames(seq);
  const int n = ApplyCheckpointing(
      seq, [](const std::string&, Module& m) { return m.class_name() == "Residual"; });
  EXPECT_EQ(n, 2);
  EXPECT_TRUE(seq.checkpointed(0));
  EXPECT_FALSE(seq.checkpointed(1));
  EXPECT_TRUE(seq.checkpointed(2));
  EXPECT_EQ(ParamNames(seq), names);
  // By name, deeper down: the Linear inside the first residual's Sequential.
  EXPECT_EQ(
      ApplyCheckpointing(seq, [](const std::string& name, Module&) { return name == "0.fn.1"; }),
      1);
  auto* inner = dynamic_cast<Sequential*>(dynamic_cast<Residual*>(seq.at(0))->fn());
  ASSERT_NE(inner, nullptr);
  EXPECT_TRUE(inner->checkpointed(1));
  EXPECT_FALSE(inner->checkpointed(0));
}

// A module that calls its child itself (not a Container).
class Wrapper : public Module {
 public:
  Wrapper() : Module("Wrapper") {
    inner_ = RegisterModule("inner", std::make_unique<Linear>(2, 2));
  }

 protected:
  Tensors Forward(const Tensors& in, Context& ctx) override {
    return inner_->Run(in, ctx.Child(0));
  }
  Tensors Backward(const Tensors& g, Context& ctx) override {
    return inner_->RunBackward(g, ctx.Child(0));
  }

 private:
  Linear* inner_;
};

TEST(ApplyCheckpointingTest, RefusesWhatItCannotFlag) {
  Sequential seq;
  seq.Append(std::make_unique<Wrapper>());
  seq.Append(std::make_unique<Linear>(2, 2));
  try {
    ApplyCheckpointing(seq,
                       [](const std::string&, Module& m) { return m.class_name() == "Linear"; });
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[apply_checkpointing] module '0.inner' (Linear) matches but its parent '0' "
              "(Wrapper) is not a Container; call CheckpointedRun for it in the parent's Forward");
  }
  EXPECT_FALSE(seq.checkpointed(1));  // nothing flagged when refused
  Linear root(2, 2);
  try {
    ApplyCheckpointing(root, [](const std::string&, Module&) { return true; });
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[apply_checkpointing] the root module (Linear)", 0), 0u)
        << e.what();
  }
}

}  // namespace
}  // namespace nn
