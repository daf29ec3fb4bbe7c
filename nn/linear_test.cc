// Linear: forward against a reference, gradients by finite differences,
// accumulation over calls, the bf16 compute path with fp32 gradients, and
// the residual added in the GEMM, and refused arguments (no gradient left).
#include "nn/linear.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tensor/ops/elementwise.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

TEST(LinearTest, ForwardMatchesReference) {
  Linear lin(3, 2);
  lin.Materialize(1);
  lin.weight()->value = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {2, 3});
  lin.bias()->value = Tensor::FromVector({0.5f, -1}, {2});
  Context ctx;
  Tensor y = lin.Run(Tensor::FromVector({1, 0, -1, 2, 2, 2}, {2, 3}), ctx);
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{-1.5f, -3, 12.5f, 29}));
  EXPECT_EQ(lin.class_name(), "Linear");
  EXPECT_EQ(lin.NamedParameters()[1].first, "bias");
  EXPECT_FALSE(lin.NamedParameters()[1].second->weight_decay);
}

TEST(LinearTest, GradientsMatchFiniteDifferences) {
  Linear lin(5, 4);
  lin.Materialize(2);
  lin.weight()->value = RandomTensor({4, 5}, 3);
  lin.bias()->value = RandomTensor({4}, 4);
  Tensor x = RandomTensor({2, 3, 5}, 5);
  Tensor w_out = RandomTensor({2, 3, 4}, 6);
  auto loss = [&](const Tensor&) {
    Context c;
    return Dot(lin.Run(x, c), w_out);
  };
  Context ctx;
  lin.Run(x, ctx);
  Tensor gx = lin.RunBackward(w_out, ctx);
  EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(lin.weight()->grad, NumericalGradient(loss, lin.weight()->value), 1e-3,
                       1e-2));
  EXPECT_TRUE(AllClose(lin.bias()->grad, NumericalGradient(loss, lin.bias()->value), 1e-3, 1e-2));
  // A second backward accumulates.
  Tensor g1 = lin.weight()->grad.Clone();
  Tensor b1 = lin.bias()->grad.Clone();
  lin.Run(x, ctx);
  lin.RunBackward(w_out, ctx);
  EXPECT_TRUE(AllClose(lin.weight()->grad, tensor::Scale(g1, 2.0), 1e-5, 1e-5));
  // Dropped (ZeroGrad(set_to_none)), the next backward writes them anew: the
  // first one's bits, whatever the new buffers held (the allocator's cache
  // hands back the dropped ones, holding twice that).
  for (bool frozen_weight : {false, true}) {
    lin.ZeroGrad(/*set_to_none=*/true);
    lin.weight()->requires_grad = !frozen_weight;
    lin.Run(x, ctx);
    lin.RunBackward(w_out, ctx);
    if (!frozen_weight) {
      EXPECT_TRUE(AllClose(lin.weight()->grad, g1, 0, 0));
    }
    EXPECT_TRUE(AllClose(lin.bias()->grad, b1, 0, 0)) << "frozen weight " << frozen_weight;
  }
}

TEST(LinearTest, Bf16ComputeKeepsFp32Gradients) {
  Linear ref(8, 6), low(8, 6);
  ref.Materialize(9);
  low.Materialize(9);
  low.weight()->value = ref.weight()->value.To(Dtype::kBF16);
  low.bias()->value = ref.bias()->value.To(Dtype::kBF16);
  Tensor x = RandomTensor({4, 8}, 10);
  Tensor g = RandomTensor({4, 6}, 11);
  Context c1, c2;
  Tensor y_ref = ref.Run(x, c1);
  Tensor y_low = low.Run(x, c2);  // f32 input cast to bf16
  EXPECT_EQ(y_low.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(y_low, y_ref, 2e-2, 2e-2));
  Tensor gx = low.RunBackward(g, c2);
  ref.RunBackward(g, c1);
  EXPECT_EQ(gx.dtype(), Dtype::kF32);  // back in the caller's dtype
  EXPECT_EQ(low.weight()->grad.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(low.weight()->grad, ref.weight()->grad, 3e-2, 3e-2));
  EXPECT_TRUE(AllClose(low.bias()->grad, ref.bias()->grad, 3e-2, 3e-2));
}

// RunResidual: the residual plus Run's output (fused in the residual's dtype,
// Run then Add in another), the hooks fired once each, and the same
// gradients as Run's.
TEST(LinearTest, RunResidualAddsTheResidualAsRunThenAdd) {
  class Counter : public ModuleHooks {
   public:
    void PreForward(Module&) override { ++forwards; }
    void PreBackward(Module&) override { ++backwards; }
    int forwards = 0, backwards = 0;
  };
  for (Dtype residual_dtype : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(residual_dtype));
    Linear a(3, 4), b(3, 4);
    a.Materialize(5);
    b.Materialize(5);
    Counter hooks;
    b.set_hooks(&hooks);
    const Tensor x = RandomTensor({2, 5, 3}, 6);
    const Tensor r = RandomTensor({2, 5, 4}, 7, -1, 1, residual_dtype);
    Context ca, cb;
    const Tensor want = tensor::Add(r, a.Run(x, ca).To(residual_dtype));
    const Tensor got = b.RunResidual(x, r, cb);
    EXPECT_EQ(got.dtype(), residual_dtype);
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_TRUE(AllClose(got, want, 1e-6, 1e-6));
    const Tensor g = RandomTensor({2, 5, 4}, 8);
    EXPECT_TRUE(AllClose(b.RunBackward(g, cb), a.RunBackward(g, ca), 0, 0));
    EXPECT_TRUE(AllClose(b.weight()->grad, a.weight()->grad, 0, 0));
    EXPECT_TRUE(AllClose(b.bias()->grad, a.bias()->grad, 0, 0));
    EXPECT_EQ(hooks.forwards, 1);
    EXPECT_EQ(hooks.backwards, 1);
    b.set_hooks(nullptr);
  }
}

TEST(LinearTest, WrongInputIsAClearError) {
  Linear lin(3, 2);
  lin.Materialize(1);
  Context ctx;
  try {
    lin.Run(Tensor::Zeros({2, 4}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[linear] input (2,4) does not end in in_features 3");
  }
  try {
    lin.RunResidual(Tensor::Zeros({2, 3}), Tensor::Zeros({2, 3}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[linear] the residual (2,3) is not shaped as the output (2,2)");
  }
  // Integer input: refused (it would compute, and its gradient be truncated).
  try {
    lin.Run(Tensor::Zeros({2, 3}, tensor::Dtype::kI64), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[linear] input (2,3) has dtype i64; expected f32, bf16 or f16");
  }
  try {
    lin.Run(Tensors{}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[linear] takes one input, got 0");
  }
}

TEST(LinearTest, NonPositiveFeaturesAreRefusedAtConstruction) {
  for (auto [in, out] : {std::pair<int64_t, int64_t>{-1, 5}, {4, 0}, {0, 3}}) {
    try {
      Linear lin(in, out);
      FAIL() << in << "," << out;
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()), "[linear] in_features and out_features must be > 0; got (" +
                                           std::to_string(in) + "," + std::to_string(out) + ")");
    }
  }
}

// An output gradient not shaped as the output (here the same elements, the
// leading dims swapped) is refused by every backward entry point before any
// gradient buffer is touched; a correct backward afterwards gives a fresh
// layer's gradients.
TEST(LinearTest, WrongOutputGradientIsRefusedAndLeavesNoGradient) {
  const Tensor x = RandomTensor({2, 3, 4}, 21);
  const Tensor good = RandomTensor({2, 3, 5}, 22);
  const Tensor bad = RandomTensor({3, 2, 5}, 23);
  const std::string want =
      "[linear] the output gradient (3,2,5) is not shaped as the output (2,3,5) (input (2,3,4))";
  Linear lin(4, 5), fresh(4, 5);
  lin.Materialize(7);
  fresh.Materialize(7);
  auto expect_refused = [&](auto&& backward) {
    Context ctx;
    try {
      backward(ctx);
      FAIL();
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
    EXPECT_FALSE(lin.weight()->grad.defined());
    EXPECT_FALSE(lin.bias()->grad.defined());
  };
  expect_refused([&](Context& ctx) {
    lin.Run(x, ctx);
    lin.RunBackward(bad, ctx);
  });
  expect_refused([&](Context& ctx) {
    lin.Run(x, ctx);
    lin.RunBackwardWithBiasGrad(bad, ctx, RandomTensor({5}, 24));
  });
  expect_refused([&](Context& ctx) {
    const Tensor pre = RandomTensor({2, 3, 4}, 25);
    lin.Run(tensor::Gelu(pre), ctx);
    lin.RunBackwardThroughGelu(bad, ctx, pre);
  });
  {  // a bias gradient of the wrong shape: refused before the weight's too
    Context ctx;
    lin.Run(x, ctx);
    EXPECT_THROW(lin.RunBackwardWithBiasGrad(good, ctx, RandomTensor({4}, 26)), tensor::OpError);
    EXPECT_FALSE(lin.weight()->grad.defined());
    EXPECT_FALSE(lin.bias()->grad.defined());
  }
  Context c1, c2;
  lin.Run(x, c1);
  fresh.Run(x, c2);
  EXPECT_TRUE(AllClose(lin.RunBackward(good, c1), fresh.RunBackward(good, c2), 0, 0));
  EXPECT_TRUE(AllClose(lin.weight()->grad, fresh.weight()->grad, 0, 0));
  EXPECT_TRUE(AllClose(lin.bias()->grad, fresh.bias()->grad, 0, 0));
}

}  // namespace
}  // namespace nn
