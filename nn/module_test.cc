// Module structure, hooks, contexts and deterministic, sliceable initialization.
#include "nn/module.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::Shape;

// y = x * w (elementwise, w broadcast over rows), to exercise Run/RunBackward.
class Scale : public Module {
 public:
  explicit Scale(int64_t n) : Module("Scale") {
    w_ = RegisterParameter("weight", {n}, InitSpec::Ones(), /*weight_decay=*/false);
    RegisterBuffer("steps", Tensor::Zeros({1}));
  }
  Parameter* w_;

 protected:
  Tensors Forward(const Tensors& in, Context& ctx) override {
    ctx.Save(in[0]);
    const int64_t n = w_->numel();
    Tensor x = in[0].Contiguous();
    Tensor y = Tensor::Empty(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      y.data<float>()[i] = x.data<float>()[i] * w_->value.data<float>()[i % n];
    }
    return {y};
  }
  Tensors Backward(const Tensors& grad, Context& ctx) override {
    Tensor x = ctx.Saved<Tensor>().Contiguous();
    const int64_t n = w_->numel();
    Tensor g = grad[0].Contiguous();
    Tensor gx = Tensor::Empty(x.shape());
    Tensor& gw = w_->GradBuffer();
    for (int64_t i = 0; i < x.numel(); ++i) {
      gx.data<float>()[i] = g.data<float>()[i] * w_->value.data<float>()[i % n];
      gw.data<float>()[i % n] += g.data<float>()[i] * x.data<float>()[i];
    }
    return {gx};
  }
};

class Pair : public Module {
 public:
  Pair() : Module("Pair") {
    a_ = RegisterModule("a", std::make_unique<Scale>(3));
    b_ = RegisterModule("b", std::make_unique<Scale>(3));
    RegisterParameter("bias", {3}, InitSpec::Normal(0.0f, 0.02f));
  }
  Scale* a_;
  Scale* b_;

 protected:
  Tensors Forward(const Tensors& in, Context& ctx) override {
    return b_->Run(a_->Run(in, ctx.Child(0)), ctx.Child(1));
  }
  Tensors Backward(const Tensors& grad, Context& ctx) override {
    return a_->RunBackward(b_->RunBackward(grad, ctx.Child(1)), ctx.Child(0));
  }
};

class Recorder : public ModuleHooks {
 public:
  void PreForward(Module& m) override { log += "F<" + m.class_name(); }
  void PostForward(Module& m) override { log += ">"; }
  void PreBackward(Module& m) override { log += "B<" + m.class_name(); }
  void PostBackward(Module& m) override { log += ">"; }
  std::string log;
};

TEST(ModuleTest, NamesAndCounts) {
  Pair p;
  std::vector<std::string> names;
  for (auto& [n, param] : p.NamedParameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"bias", "a.weight", "b.weight"}));
  EXPECT_EQ(p.NumParameters(), 9);
  EXPECT_EQ(p.NamedBuffers()[1].first, "b.steps");
  auto modules = p.NamedModules();
  ASSERT_EQ(modules.size(), 3u);
  EXPECT_EQ(modules[0].first, "");
  EXPECT_EQ(modules[2].second->class_name(), "Scale");
  EXPECT_FALSE(p.NamedParameters()[0].second->value.defined());  // not materialized yet
}

TEST(ModuleTest, RunBackwardChainsChildrenAndRunsHooks) {
  Pair p;
  p.Materialize(1);
  p.b_->w_->value.data<float>()[1] = 3.0f;
  Recorder rec;
  p.set_hooks(&rec);
  p.a_->set_hooks(&rec);
  Context ctx;
  Tensor x = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = p.Run(x, ctx);
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{1, 6, 3, 4, 15, 6}));
  EXPECT_TRUE(ctx.Child(0).has_saved());
  Tensor gx = p.RunBackward(Tensor::Full({2, 3}, 1.0), ctx);
  EXPECT_EQ(gx.ToVector<float>(), (std::vector<float>{1, 3, 1, 1, 3, 1}));
  EXPECT_EQ(p.b_->w_->grad.ToVector<float>(), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(rec.log, "F<PairF<Scale>>B<PairB<Scale>>");
  EXPECT_FALSE(ctx.has_saved());  // backward released the activations
  p.ZeroGrad();
  EXPECT_EQ(p.b_->w_->grad.ToVector<float>(), (std::vector<float>{0, 0, 0}));
  p.ZeroGrad(/*set_to_none=*/true);
  EXPECT_FALSE(p.b_->w_->grad.defined());
}

TEST(ModuleTest, BackwardWithoutForwardIsAnError) {
  Pair p;
  p.Materialize(1);
  Context ctx;
  EXPECT_THROW(p.RunBackward(Tensor::Zeros({2, 3}), ctx), tensor::OpError);
}

TEST(ModuleTest, MaterializeIsDeterministicAndChargesParameters) {
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger use(&ledger);
  Pair p1, p2, p3;
  p1.Materialize(7);
  p2.Materialize(7);
  p3.Materialize(8);
  Tensor b1 = p1.NamedParameters()[0].second->value;
  EXPECT_EQ(b1.ToVector<float>(), p2.NamedParameters()[0].second->value.ToVector<float>());
  EXPECT_NE(b1.ToVector<float>(), p3.NamedParameters()[0].second->value.ToVector<float>());
  EXPECT_EQ(ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters).current,
            3 * 9 * 4);
}

// GradToWrite: without a gradient, a new f32 buffer (charged as gradients)
// that the caller overwrites; with one, that buffer, added to; frozen: an error.
TEST(ParameterTest, GradToWriteMakesANewBufferOrAddsToTheOldOne) {
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger use(&ledger);
  Pair p;
  p.Materialize(1);
  Parameter& w = *p.a_->w_;
  ASSERT_FALSE(w.grad.defined());
  const Parameter::GradSink fresh = w.GradToWrite();
  EXPECT_FALSE(fresh.accumulate);
  ASSERT_TRUE(w.grad.defined());
  EXPECT_TRUE(fresh.grad.SharesStorageWith(w.grad));
  EXPECT_EQ(w.grad.shape(), Shape({3}));
  EXPECT_EQ(w.grad.dtype(), Dtype::kF32);
  EXPECT_EQ(ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kGradients).current,
            3 * 4);
  const Parameter::GradSink again = w.GradToWrite();
  EXPECT_TRUE(again.accumulate);
  EXPECT_TRUE(again.grad.SharesStorageWith(fresh.grad));
  // A view marked unwritten (FSDP's): written by GradToWrite, zeroed by
  // GradBuffer, the mark cleared either way, and by ZeroGrad.
  w.grad.CopyFrom(Tensor::Full({3}, std::nan("")));
  w.grad_unwritten = true;
  const Parameter::GradSink view = w.GradToWrite();
  EXPECT_FALSE(view.accumulate);
  EXPECT_TRUE(view.grad.SharesStorageWith(fresh.grad));
  EXPECT_FALSE(w.grad_unwritten);
  w.grad_unwritten = true;
  EXPECT_EQ(w.GradBuffer().ToVector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_FALSE(w.grad_unwritten);
  w.grad_unwritten = true;
  p.ZeroGrad();
  EXPECT_FALSE(w.grad_unwritten);
  w.requires_grad = false;
  EXPECT_THROW(w.GradToWrite(), tensor::OpError);
}

TEST(InitSliceTest, SlicesEqualTheWholeAndMomentsAreRight) {
  for (InitSpec spec : {InitSpec::Normal(0.5f, 0.02f), InitSpec::Uniform(-2, 2),
                        InitSpec::TruncatedNormal(0, 1)}) {
    Tensor whole = Tensor::Empty({10000});
    InitSlice(spec, 3, "h.0.mlp.c_fc.weight", 0, whole);
    Tensor part = Tensor::Empty({1234});
    InitSlice(spec, 3, "h.0.mlp.c_fc.weight", 5000, part);
    EXPECT_EQ(part.ToVector<float>(), whole.Narrow(0, 5000, 1234).ToVector<float>());
    const std::vector<float> v = whole.ToVector<float>();
    double mean = 0, var = 0, lo = 1e9, hi = -1e9;
    for (float x : v) {
      mean += x;
      lo = std::min<double>(lo, x);
      hi = std::max<double>(hi, x);
    }
    mean /= v.size();
    for (float x : v) var += (x - mean) * (x - mean);
    var /= v.size();
    if (spec.kind == InitSpec::Kind::kNormal) {
      EXPECT_NEAR(mean, 0.5, 0.002);
      EXPECT_NEAR(std::sqrt(var), 0.02, 0.001);
    } else if (spec.kind == InitSpec::Kind::kUniform) {
      EXPECT_NEAR(mean, 0.0, 0.05);
      EXPECT_GE(lo, -2.0);
      EXPECT_LT(hi, 2.0);
    } else {
      EXPECT_GE(lo, -2.0);
      EXPECT_LE(hi, 2.0);
      EXPECT_NEAR(std::sqrt(var), 0.88, 0.03);  // std of N(0,1) truncated at +-2
    }
  }
  // Different names give different values.
  Tensor a = Tensor::Empty({8}), b = Tensor::Empty({8});
  InitSlice(InitSpec::Normal(0, 1), 3, "x", 0, a);
  InitSlice(InitSpec::Normal(0, 1), 3, "y", 0, b);
  EXPECT_NE(a.ToVector<float>(), b.ToVector<float>());
}

}  // namespace
}  // namespace nn
