// FeedForward: Hugging Face child names, the fused GELU path against the plain
// composition of its children, finite-difference gradients for every form and
// parameter (with and without dropout), bf16 compute with fp32 gradients,
// hooks on the fused c_fc, the residual input, and error messages.
#include "nn/feed_forward.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/module_testing.h"
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

FeedForwardOptions Form(FfnActivation act, bool bias, float dropout = 0.0f,
                        bool on_hidden = false) {
  FeedForwardOptions o;
  o.activation = act;
  o.bias = bias;
  o.dropout = dropout;
  o.dropout_on_hidden = on_hidden;
  o.dropout_seed = 3;
  return o;
}

// Gives every parameter random values of a useful size (biases included).
void Randomize(Module& m, uint64_t seed) {
  m.Materialize(seed);
  for (auto& [name, p] : m.NamedParameters())
    p->value = RandomTensor(p->shape, seed++, -0.5f, 0.5f);
}

TEST(FeedForwardTest, HuggingFaceNames) {
  FeedForward gpt(8, 32, FeedForwardOptions::Gpt2(12, 0.1f));
  EXPECT_EQ(ParamNames(gpt),
            (std::vector<std::string>{"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"}));
  EXPECT_EQ(gpt.class_name(), "FeedForward");
  EXPECT_EQ(gpt.NamedModules().back().first, "dropout");
  EXPECT_FLOAT_EQ(gpt.out_proj()->weight()->init.b, 0.02f / std::sqrt(24.0f));
  FeedForward t5(8, 32, FeedForwardOptions::T5(8, 32, /*gated=*/false));
  EXPECT_EQ(ParamNames(t5), (std::vector<std::string>{"wi.weight", "wo.weight"}));
  EXPECT_FLOAT_EQ(t5.in_proj()->weight()->init.b, 1.0f / std::sqrt(8.0f));
  EXPECT_FLOAT_EQ(t5.out_proj()->weight()->init.b, 1.0f / std::sqrt(32.0f));
  FeedForward t5_11(8, 32, FeedForwardOptions::T5(8, 32, /*gated=*/true));
  EXPECT_EQ(ParamNames(t5_11),
            (std::vector<std::string>{"wi_0.weight", "wi_1.weight", "wo.weight"}));
}

// The fused bias+GELU path equals c_proj(gelu(c_fc(x))) run through the children.
TEST(FeedForwardTest, FusedGeluMatchesComposition) {
  FeedForward ffn(6, 12, Form(FfnActivation::kGelu, true));
  Randomize(ffn, 1);
  const Tensor x = RandomTensor({2, 3, 6}, 2);
  Context c1, c2, c3;
  Tensor y = ffn.Run(x, c1);
  Tensor want = ffn.out_proj()->Run(tensor::Gelu(ffn.in_proj()->Run(x, c2)), c3);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_TRUE(AllClose(y, want, 1e-6, 1e-5));
}

TEST(FeedForwardTest, GatedGeluMatchesComposition) {
  FeedForward ffn(6, 10, Form(FfnActivation::kGatedGelu, false));
  Randomize(ffn, 3);
  const Tensor x = RandomTensor({4, 6}, 4);
  Context c, c0, c1, c2;
  Tensor want = ffn.out_proj()->Run(
      tensor::Mul(tensor::Gelu(ffn.in_proj(0)->Run(x, c0)), ffn.in_proj(1)->Run(x, c1)), c2);
  EXPECT_TRUE(AllClose(ffn.Run(x, c), want, 1e-6, 1e-5));
}

struct Case {
  FfnActivation act;
  bool bias;
  float dropout;
  bool on_hidden;
};

TEST(FeedForwardTest, GradientsMatchFiniteDifferences) {
  const Case cases[] = {
      {FfnActivation::kGelu, true, 0.0f, false},
      {FfnActivation::kGelu, false, 0.0f, false},
      {FfnActivation::kRelu, false, 0.0f, false},
      {FfnActivation::kGatedGelu, false, 0.0f, false},
      {FfnActivation::kGelu, true, 0.3f, false},
      {FfnActivation::kRelu, true, 0.3f, true},
      {FfnActivation::kGatedGelu, false, 0.3f, true},
  };
  for (const Case& k : cases) {
    const std::string where = "act " + std::to_string(static_cast<int>(k.act)) + " bias " +
                              std::to_string(k.bias) + " dropout " + std::to_string(k.dropout);
    FeedForward ffn(4, 6, Form(k.act, k.bias, k.dropout, k.on_hidden));
    Randomize(ffn, 10);
    const Tensor x = RandomTensor({2, 3, 4}, 20);
    const Tensor w_out = RandomTensor({2, 3, 4}, 21);
    const uint64_t offset = ffn.dropout() ? ffn.dropout()->generator().offset() : 0;
    auto run = [&](Context& c) {
      if (ffn.dropout()) ffn.dropout()->generator().set_offset(offset);  // same mask each time
      return ffn.Run(x, c);
    };
    auto loss = [&](const Tensor&) {
      Context c;
      return Dot(run(c), w_out);
    };
    Context ctx;
    run(ctx);
    Tensor gx = ffn.RunBackward(w_out, ctx);
    EXPECT_EQ(gx.shape(), x.shape());
    EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2)) << where;
    for (auto& [name, p] : ffn.NamedParameters()) {
      ASSERT_TRUE(p->grad.defined()) << where << " " << name;
      EXPECT_TRUE(AllClose(p->grad, NumericalGradient(loss, p->value), 1e-3, 1e-2))
          << where << " " << name;
    }
  }
}

TEST(FeedForwardTest, Bf16ComputeKeepsFp32Gradients) {
  for (FfnActivation act :
       {FfnActivation::kGelu, FfnActivation::kRelu, FfnActivation::kGatedGelu}) {
    FeedForward ref(8, 16, Form(act, true)), low(8, 16, Form(act, true));
    Randomize(ref, 30);
    Randomize(low, 30);
    auto ref_params = ref.NamedParameters();
    auto low_params = low.NamedParameters();
    for (size_t i = 0; i < ref_params.size(); ++i) {
      low_params[i].second->value = ref_params[i].second->value.To(Dtype::kBF16);
    }
    const Tensor x = RandomTensor({5, 8}, 31);
    const Tensor g = RandomTensor({5, 8}, 32);
    Context c1, c2;
    Tensor y_ref = ref.Run(x, c1);
    Tensor y_low = low.Run(x, c2);
    EXPECT_EQ(y_low.dtype(), Dtype::kBF16);
    EXPECT_TRUE(AllClose(y_low, y_ref, 3e-2, 5e-2));
    Tensor gx_ref = ref.RunBackward(g, c1);
    Tensor gx_low = low.RunBackward(g, c2);
    EXPECT_EQ(gx_low.dtype(), Dtype::kF32);
    EXPECT_TRUE(AllClose(gx_low, gx_ref, 3e-2, 5e-2));
    for (size_t i = 0; i < ref_params.size(); ++i) {
      EXPECT_EQ(low_params[i].second->grad.dtype(), Dtype::kF32);
      EXPECT_TRUE(AllClose(low_params[i].second->grad, ref_params[i].second->grad, 5e-2, 5e-2))
          << low_params[i].first;
    }
  }
}

class Recorder : public ModuleHooks {
 public:
  void PreForward(Module& m) override { log += "F<" + m.class_name(); }
  void PostForward(Module& m) override { log += ">"; }
  void PreBackward(Module& m) override { log += "B<" + m.class_name(); }
  void PostBackward(Module& m) override { log += ">"; }
  std::string log;
};

// The fused path runs c_fc's GEMM itself but still fires c_fc's hooks in order
// (an FSDP unit around c_fc would all-gather its weight there).
TEST(FeedForwardTest, FusedPathRunsTheHooksOfCFc) {
  FeedForward ffn(4, 8, Form(FfnActivation::kGelu, true));
  Randomize(ffn, 40);
  Recorder fc, proj;
  ffn.in_proj()->set_hooks(&fc);
  ffn.out_proj()->set_hooks(&proj);
  Context ctx;
  ffn.Run(RandomTensor({3, 4}, 41), ctx);
  ffn.RunBackward(RandomTensor({3, 4}, 42), ctx);
  EXPECT_EQ(fc.log, "F<Linear>B<Linear>");
  EXPECT_EQ(proj.log, "F<Linear>B<Linear>");
}

// The residual as a second input: residual + the output, with gradients
// {the input's, the output's}, and the parameters' gradients unchanged. In
// the fused path (no output dropout running) the residual joins in c_proj's
// GEMM; with output dropout in training it is added after the dropout, with
// the same masks.
TEST(FeedForwardTest, ResidualInputEqualsAddingTheOutput) {
  struct Variant {
    const char* name;
    FeedForwardOptions options;
    bool train;
  };
  for (const Variant& v :
       {Variant{"gelu", Form(FfnActivation::kGelu, true), true},
        Variant{"gelu, output dropout", Form(FfnActivation::kGelu, true, 0.3f), true},
        Variant{"gelu, output dropout, eval", Form(FfnActivation::kGelu, true, 0.3f), false},
        Variant{"relu, hidden dropout", Form(FfnActivation::kRelu, false, 0.3f, true), true}}) {
    SCOPED_TRACE(v.name);
    FeedForward a(4, 8, v.options), b(4, 8, v.options);
    Randomize(a, 50);
    Randomize(b, 50);
    a.Train(v.train);
    b.Train(v.train);
    const Tensor x = RandomTensor({2, 3, 4}, 51), r = RandomTensor({2, 3, 4}, 52);
    const Tensor g = RandomTensor({2, 3, 4}, 53);
    Context ca, cb;
    const Tensor want = tensor::Add(r, a.Run(x, ca));
    const Tensor got = b.Run({x, r}, cb).at(0);
    EXPECT_TRUE(AllClose(got, want, 1e-6, 1e-6));
    const Tensor want_gx = a.RunBackward(g, ca);
    const Tensors got_grads = b.RunBackward(Tensors{g}, cb);
    ASSERT_EQ(got_grads.size(), 2u);
    EXPECT_TRUE(AllClose(got_grads[0], want_gx, 0, 0));
    EXPECT_TRUE(AllClose(got_grads[1], g, 0, 0));
    testing::ExpectSameParamGrads(b, a);
  }
  // bf16 compute copies: the sum in the residual's dtype (bf16), within its rounding.
  FeedForward a(4, 8), b(4, 8);
  Randomize(a, 60);
  Randomize(b, 60);
  for (FeedForward* f : {&a, &b}) {
    for (auto& [name, p] : f->NamedParameters()) p->value = p->value.To(Dtype::kBF16);
  }
  const Tensor x = RandomTensor({3, 4}, 61, -1, 1, Dtype::kBF16);
  const Tensor r = RandomTensor({3, 4}, 62, -1, 1, Dtype::kBF16);
  Context ca, cb;
  const Tensor want = tensor::Add(r, a.Run(x, ca));
  const Tensor got = b.Run({x, r}, cb).at(0);
  EXPECT_EQ(got.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(got, want, 2e-2, 2e-2));
}

TEST(FeedForwardTest, WrongInputIsAClearError) {
  FeedForward ffn(4, 8);
  ffn.Materialize(1);
  Context ctx;
  try {
    ffn.Run(Tensor::Zeros({2, 5}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[feed_forward] input (2,5) does not end in dim 4");
  }
  try {
    ffn.Run({Tensor::Zeros({2, 4}), Tensor::Zeros({2, 3})}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[feed_forward] expects x and optionally a residual shaped as x (2,4); got 2 inputs");
  }
}

// An output gradient not shaped as the output (the same elements, the leading
// dims swapped) is refused before any child's gradient is touched; a correct
// backward afterwards gives a fresh module's gradients.
TEST(FeedForwardTest, WrongOutputGradientIsRefusedAndLeavesNoGradient) {
  for (FfnActivation act :
       {FfnActivation::kGelu, FfnActivation::kRelu, FfnActivation::kGatedGelu}) {
    SCOPED_TRACE(static_cast<int>(act));
    FeedForward ffn(4, 8, Form(act, /*bias=*/true)), fresh(4, 8, Form(act, /*bias=*/true));
    Randomize(ffn, 30);
    Randomize(fresh, 30);
    const Tensor x = RandomTensor({2, 3, 4}, 31);
    Context ctx;
    ffn.Run(x, ctx);
    try {
      ffn.RunBackward(RandomTensor({3, 2, 4}, 32), ctx);
      FAIL();
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()),
                "[feed_forward] the output gradient (3,2,4) is not shaped as the output (2,3,4)");
    }
    for (auto& [name, p] : ffn.NamedParameters()) EXPECT_FALSE(p->grad.defined()) << name;
    const Tensor g = RandomTensor({2, 3, 4}, 33);
    Context c1, c2;
    ffn.Run(x, c1);
    fresh.Run(x, c2);
    EXPECT_TRUE(AllClose(ffn.RunBackward(g, c1), fresh.RunBackward(g, c2), 0, 0));
    const auto got = ffn.NamedParameters(), want = fresh.NamedParameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(AllClose(got[i].second->grad, want[i].second->grad, 0, 0)) << got[i].first;
    }
  }
}

}  // namespace
}  // namespace nn
