// RMSNorm layer: forward against a double reference, finite-difference
// gradients, the mixed-precision dtype rule and error messages.
#include "nn/rms_norm.h"

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

TEST(RMSNormTest, ForwardMatchesReference) {
  RMSNorm norm(4);
  norm.Materialize(1);
  norm.weight()->value = Tensor::FromVector({1, 2, 0.5f, -1}, {4});
  Context ctx;
  Tensor y = norm.Run(Tensor::FromVector({1, 2, 3, 4, 0, 0, 0, 2}, {2, 4}), ctx);
  const double r0 = 1.0 / std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  const double r1 = 1.0 / std::sqrt(4 / 4.0 + 1e-6);
  const std::vector<float> want = {static_cast<float>(1 * r0),
                                   static_cast<float>(4 * r0),
                                   static_cast<float>(1.5 * r0),
                                   static_cast<float>(-4 * r0),
                                   0,
                                   0,
                                   0,
                                   static_cast<float>(-2 * r1)};
  EXPECT_TRUE(AllClose(y, Tensor::FromVector(want, {2, 4}), 1e-6, 1e-5));
}

TEST(RMSNormTest, NamesAndInit) {
  RMSNorm norm(3);
  EXPECT_EQ(norm.class_name(), "RMSNorm");
  EXPECT_EQ(norm.eps(), 1e-6f);
  auto params = norm.NamedParameters();
  ASSERT_EQ(params.size(), 1u);  // T5: weight only
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_FALSE(params[0].second->weight_decay);
  norm.Materialize(1);
  EXPECT_EQ(norm.weight()->value.ToVector<float>(), std::vector<float>(3, 1.0f));
}

TEST(RMSNormTest, GradientsMatchFiniteDifferences) {
  RMSNorm norm(6);
  norm.Materialize(1);
  norm.weight()->value = RandomTensor({6}, 2, 0.5f, 1.5f);
  const Tensor x = RandomTensor({2, 3, 6}, 3);
  const Tensor w_out = RandomTensor({2, 3, 6}, 4);
  auto loss = [&](const Tensor&) {
    Context c;
    return Dot(norm.Run(x, c), w_out);
  };
  Context ctx;
  norm.Run(x, ctx);
  Tensor gx = norm.RunBackward(w_out, ctx);
  EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2));
  EXPECT_TRUE(
      AllClose(norm.weight()->grad, NumericalGradient(loss, norm.weight()->value), 1e-3, 1e-2));
}

TEST(RMSNormTest, MixedPrecisionDtypeRule) {
  RMSNorm ref(8), mixed(8), low(8);
  for (RMSNorm* m : {&ref, &mixed, &low}) m->Materialize(3);
  ref.weight()->value = RandomTensor({8}, 5, 0.5f, 1.5f);
  mixed.weight()->value = ref.weight()->value;                 // f32 weight, bf16 x
  low.weight()->value = ref.weight()->value.To(Dtype::kBF16);  // bf16 weight, f32 x
  const Tensor x = RandomTensor({3, 8}, 6);
  const Tensor g = RandomTensor({3, 8}, 7);
  Context c_ref, c_mixed, c_low;
  Tensor y_ref = ref.Run(x, c_ref);
  Tensor y_mixed = mixed.Run(x.To(Dtype::kBF16), c_mixed);
  Tensor y_low = low.Run(x, c_low);
  EXPECT_EQ(y_mixed.dtype(), Dtype::kBF16);
  EXPECT_EQ(y_low.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(y_mixed, y_ref, 3e-2, 3e-2));
  EXPECT_TRUE(AllClose(y_low, y_ref, 3e-2, 3e-2));
  Tensor gx_ref = ref.RunBackward(g, c_ref);
  Tensor gx_mixed = mixed.RunBackward(g.To(Dtype::kBF16), c_mixed);
  Tensor gx_low = low.RunBackward(g, c_low);
  EXPECT_EQ(gx_mixed.dtype(), Dtype::kBF16);
  EXPECT_EQ(gx_low.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(gx_mixed, gx_ref, 5e-2, 5e-2));
  EXPECT_TRUE(AllClose(gx_low, gx_ref, 5e-2, 5e-2));
  for (RMSNorm* m : {&mixed, &low}) {
    EXPECT_EQ(m->weight()->grad.dtype(), Dtype::kF32);
    EXPECT_TRUE(AllClose(m->weight()->grad, ref.weight()->grad, 5e-2, 5e-2));
  }
}

// RunBackwardAdding: add + RunBackward's gradient, the same weight gradient;
// an add of another shape is an error naming both shapes.
TEST(RMSNormTest, RunBackwardAddingAddsToTheInputGradient) {
  for (Dtype d : {Dtype::kF32, Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(d));
    RMSNorm a(6), b(6);
    for (RMSNorm* n : {&a, &b}) {
      n->Materialize(1);
      n->weight()->value = RandomTensor({6}, 2, 0.5f, 1.5f).To(d);
    }
    const Tensor x = RandomTensor({4, 6}, 3, -1, 1, d);
    const Tensor g = RandomTensor({4, 6}, 4, -1, 1, d);
    const Tensor add = RandomTensor({4, 6}, 5, -1, 1, d);
    const double tol = d == Dtype::kF32 ? 1e-6 : 1.6e-2;
    Context ca, cb;
    a.Run(x, ca);
    b.Run(x, cb);
    const Tensor want = tensor::Add(add, a.RunBackward(g, ca));
    const Tensor got = b.RunBackwardAdding(g, add, cb);
    EXPECT_EQ(got.dtype(), d);
    EXPECT_TRUE(AllClose(got, want, tol, tol));
    EXPECT_TRUE(AllClose(b.weight()->grad, a.weight()->grad, 0, 0));
  }
  RMSNorm n(6);
  n.Materialize(1);
  Context ctx;
  n.Run(RandomTensor({4, 6}, 6), ctx);
  try {
    n.RunBackwardAdding(RandomTensor({4, 6}, 7), RandomTensor({2, 6}, 8), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[rms_norm] the gradient to add (2,6) is not shaped as x (4,6)");
  }
}

TEST(RMSNormTest, WrongInputIsAClearError) {
  RMSNorm norm(3);
  norm.Materialize(1);
  Context ctx;
  try {
    norm.Run(Tensor::Zeros({2, 5}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[rms_norm] input (2,5) does not end in dim 3");
  }
}

// An output gradient not shaped as x is refused before any gradient buffer
// is touched (testing::ExpectWrongOutputGradientRefused).
TEST(RMSNormTest, WrongOutputGradientIsRefusedAndLeavesNoGradient) {
  testing::ExpectWrongOutputGradientRefused<RMSNorm>(
      "[rms_norm] the output gradient (6,4) is not shaped as x (4,6)");
}

}  // namespace
}  // namespace nn
