// LayerNorm layer: forward against a double reference, finite-difference
// gradients (with and without affine parameters), the mixed-precision dtype
// rule and error messages.
#include "nn/layer_norm.h"

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

// LayerNorm over the last dim of x (rows, c) in double.
Tensor Reference(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t c = x.dim(-1);
  const int64_t rows = x.numel() / c;
  std::vector<float> vx = x.ToVector<float>(), vw = w.ToVector<float>(), vb = b.ToVector<float>();
  std::vector<float> out(vx.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < c; ++i) mean += vx[r * c + i];
    mean /= c;
    for (int64_t i = 0; i < c; ++i) var += (vx[r * c + i] - mean) * (vx[r * c + i] - mean);
    var /= c;
    for (int64_t i = 0; i < c; ++i) {
      out[r * c + i] =
          static_cast<float>((vx[r * c + i] - mean) / std::sqrt(var + eps) * vw[i] + vb[i]);
    }
  }
  return Tensor::FromVector(out, x.shape());
}

TEST(LayerNormTest, ForwardMatchesReference) {
  LayerNorm ln(5);
  ln.Materialize(1);
  ln.weight()->value = RandomTensor({5}, 2, 0.5f, 1.5f);
  ln.bias()->value = RandomTensor({5}, 3);
  const Tensor x = RandomTensor({2, 3, 5}, 4, -2.0f, 3.0f);
  Context ctx;
  Tensor y = ln.Run(x, ctx);
  EXPECT_EQ(y.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(y, Reference(x, ln.weight()->value, ln.bias()->value, 1e-5), 1e-5, 1e-5));
}

TEST(LayerNormTest, NamesInitAndOptions) {
  LayerNorm ln(4);
  EXPECT_EQ(ln.class_name(), "LayerNorm");
  auto params = ln.NamedParameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[1].first, "bias");
  EXPECT_FALSE(params[0].second->weight_decay);
  EXPECT_FALSE(params[1].second->weight_decay);
  ln.Materialize(1);
  EXPECT_EQ(ln.weight()->value.ToVector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(ln.bias()->value.ToVector<float>(), std::vector<float>(4, 0.0f));
  LayerNormOptions no_bias;
  no_bias.bias = false;
  EXPECT_EQ(LayerNorm(4, no_bias).NamedParameters().size(), 1u);
  LayerNormOptions plain;
  plain.elementwise_affine = false;
  EXPECT_EQ(LayerNorm(4, plain).NamedParameters().size(), 0u);
}

TEST(LayerNormTest, GradientsMatchFiniteDifferences) {
  LayerNorm ln(6);
  ln.Materialize(1);
  ln.weight()->value = RandomTensor({6}, 5, 0.5f, 1.5f);
  ln.bias()->value = RandomTensor({6}, 6);
  const Tensor x = RandomTensor({2, 3, 6}, 7);
  const Tensor w_out = RandomTensor({2, 3, 6}, 8);
  auto loss = [&](const Tensor&) {
    Context c;
    return Dot(ln.Run(x, c), w_out);
  };
  Context ctx;
  ln.Run(x, ctx);
  Tensor gx = ln.RunBackward(w_out, ctx);
  EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(ln.weight()->grad, NumericalGradient(loss, ln.weight()->value), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(ln.bias()->grad, NumericalGradient(loss, ln.bias()->value), 1e-3, 1e-2));
}

TEST(LayerNormTest, GradientsWithoutAffineOrBias) {
  for (bool affine : {false, true}) {
    LayerNormOptions opts;
    opts.elementwise_affine = affine;
    opts.bias = false;
    LayerNorm ln(5, opts);
    ln.Materialize(1);
    if (affine) ln.weight()->value = RandomTensor({5}, 9, 0.5f, 1.5f);
    const Tensor x = RandomTensor({4, 5}, 10);
    const Tensor w_out = RandomTensor({4, 5}, 11);
    auto loss = [&](const Tensor&) {
      Context c;
      return Dot(ln.Run(x, c), w_out);
    };
    Context ctx;
    ln.Run(x, ctx);
    Tensor gx = ln.RunBackward(w_out, ctx);
    EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2)) << affine;
    if (affine) {
      EXPECT_TRUE(
          AllClose(ln.weight()->grad, NumericalGradient(loss, ln.weight()->value), 1e-3, 1e-2));
    }
  }
}

// f32 weight with bf16 x: x keeps its dtype (no cast), y is bf16, parameter
// gradients are f32. bf16 weight with f32 x: x is cast to bf16 as Linear does,
// the input gradient comes back f32.
TEST(LayerNormTest, MixedPrecisionDtypeRule) {
  LayerNorm ref(8), mixed(8), low(8);
  for (LayerNorm* m : {&ref, &mixed, &low}) m->Materialize(3);
  ref.weight()->value = RandomTensor({8}, 12, 0.5f, 1.5f);
  ref.bias()->value = RandomTensor({8}, 13);
  mixed.weight()->value = ref.weight()->value;
  mixed.bias()->value = ref.bias()->value;
  low.weight()->value = ref.weight()->value.To(Dtype::kBF16);
  low.bias()->value = ref.bias()->value.To(Dtype::kBF16);
  const Tensor x = RandomTensor({3, 8}, 14);
  const Tensor g = RandomTensor({3, 8}, 15);
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
  EXPECT_EQ(gx_mixed.dtype(), Dtype::kBF16);  // the caller's x was bf16
  EXPECT_EQ(gx_low.dtype(), Dtype::kF32);     // the caller's x was f32
  EXPECT_TRUE(AllClose(gx_mixed, gx_ref, 5e-2, 5e-2));
  EXPECT_TRUE(AllClose(gx_low, gx_ref, 5e-2, 5e-2));
  for (LayerNorm* m : {&mixed, &low}) {
    EXPECT_EQ(m->weight()->grad.dtype(), Dtype::kF32);
    EXPECT_EQ(m->bias()->grad.dtype(), Dtype::kF32);
    EXPECT_TRUE(AllClose(m->weight()->grad, ref.weight()->grad, 5e-2, 5e-2));
    EXPECT_TRUE(AllClose(m->bias()->grad, ref.bias()->grad, 5e-2, 5e-2));
  }
}

// RunBackwardAdding: add + RunBackward's gradient (fused when add has the
// compute dtype, else RunBackward then Add), the same parameter gradients.
TEST(LayerNormTest, RunBackwardAddingAddsToTheInputGradient) {
  struct Case {
    const char* name;
    Dtype weight, x, add;
    double tol;
  };
  for (const Case& c :
       {Case{"f32", Dtype::kF32, Dtype::kF32, Dtype::kF32, 1e-6},
        Case{"bf16", Dtype::kBF16, Dtype::kBF16, Dtype::kBF16, 1.6e-2},
        Case{"bf16 compute, f32 x", Dtype::kBF16, Dtype::kF32, Dtype::kF32, 1e-6}}) {
    SCOPED_TRACE(c.name);
    LayerNorm a(6), b(6);
    for (LayerNorm* ln : {&a, &b}) {
      ln->Materialize(1);
      ln->weight()->value = RandomTensor({6}, 2, 0.5f, 1.5f).To(c.weight);
      ln->bias()->value = RandomTensor({6}, 3).To(c.weight);
    }
    const Tensor x = RandomTensor({4, 6}, 4, -1, 1, c.x);
    const Tensor g = RandomTensor({4, 6}, 5, -1, 1, c.weight);
    const Tensor add = RandomTensor({4, 6}, 6, -1, 1, c.add);
    Context ca, cb;
    a.Run(x, ca);
    b.Run(x, cb);
    const Tensor want = tensor::Add(add, a.RunBackward(g, ca).To(c.add));
    const Tensor got = b.RunBackwardAdding(g, add, cb);
    EXPECT_EQ(got.dtype(), c.add);
    EXPECT_TRUE(AllClose(got, want, c.tol, c.tol));
    EXPECT_TRUE(AllClose(b.weight()->grad, a.weight()->grad, 0, 0));
    EXPECT_TRUE(AllClose(b.bias()->grad, a.bias()->grad, 0, 0));
  }
}

TEST(LayerNormTest, WrongInputIsAClearError) {
  LayerNorm ln(3);
  ln.Materialize(1);
  Context ctx;
  try {
    ln.Run(Tensor::Zeros({2, 4}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[layer_norm] input (2,4) does not end in dim 3");
  }
  LayerNorm unmaterialized(3);
  EXPECT_THROW(unmaterialized.Run(Tensor::Zeros({2, 3}), ctx), tensor::OpError);
}

// An output gradient not shaped as x is refused before any gradient buffer
// is touched (testing::ExpectWrongOutputGradientRefused).
TEST(LayerNormTest, WrongOutputGradientIsRefusedAndLeavesNoGradient) {
  testing::ExpectWrongOutputGradientRefused<LayerNorm>(
      "[layer_norm] the output gradient (6,4) is not shaped as x (4,6)");
}

}  // namespace
}  // namespace nn
