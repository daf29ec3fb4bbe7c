// Dropout layer: identity in eval and for p == 0, masks that change from call
// to call but replay from a seed, finite-difference gradients with a fixed
// mask, and error messages.
#include "nn/dropout.h"

#include <string>
#include <vector>

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

TEST(DropoutTest, IdentityInEvalAndForZeroP) {
  const Tensor x = RandomTensor({4, 8}, 1);
  Dropout off(0.0f);
  Dropout eval(0.5f);
  eval.Train(false);
  for (Dropout* d : {&off, &eval}) {
    EXPECT_FALSE(d->active());
    Context ctx;
    Tensor y = d->Run(x, ctx);
    EXPECT_TRUE(y.SharesStorageWith(x));  // no copy
    const Tensor g = RandomTensor({4, 8}, 2);
    EXPECT_TRUE(d->RunBackward(g, ctx).SharesStorageWith(g));
    EXPECT_EQ(d->generator().offset(), 0u);  // no counters used
  }
  EXPECT_EQ(off.class_name(), "Dropout");
  EXPECT_TRUE(off.NamedParameters().empty());
  eval.Train(true);
  EXPECT_TRUE(eval.active());
}

TEST(DropoutTest, DropsAboutPAndScalesTheRest) {
  Dropout d(0.25f, /*seed=*/7);
  const Tensor x = Tensor::Full({100, 100}, 1.0);
  Context ctx;
  std::vector<float> y = d.Run(x, ctx).ToVector<float>();
  int dropped = 0;
  for (float v : y) {
    if (v == 0.0f) {
      ++dropped;
    } else {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
    }
  }
  EXPECT_NEAR(dropped / 10000.0, 0.25, 0.02);
  // The backward applies the same mask.
  std::vector<float> g = d.RunBackward(x, ctx).ToVector<float>();
  EXPECT_EQ(g, y);
}

TEST(DropoutTest, MasksChangePerCallAndReplayFromTheSeed) {
  const Tensor x = RandomTensor({64}, 3);
  Dropout a(0.5f, 11), b(0.5f, 11), c(0.5f, 12);
  Context ctx;
  Tensor a1 = a.Run(x, ctx), a2 = a.Run(x, ctx);
  Tensor b1 = b.Run(x, ctx), c1 = c.Run(x, ctx);
  EXPECT_EQ(a1.ToVector<float>(), b1.ToVector<float>());  // same seed, same stream
  EXPECT_NE(a1.ToVector<float>(), a2.ToVector<float>());  // next call, next counters
  EXPECT_NE(a1.ToVector<float>(), c1.ToVector<float>());  // other seed
  a.set_seed(11);
  EXPECT_EQ(a.Run(x, ctx).ToVector<float>(), a1.ToVector<float>());
}

TEST(DropoutTest, GradientsMatchFiniteDifferences) {
  Dropout d(0.3f, 5);
  const Tensor x = RandomTensor({3, 7}, 4);
  const Tensor w_out = RandomTensor({3, 7}, 5);
  const uint64_t offset = d.generator().offset();
  auto loss = [&](const Tensor&) {
    d.generator().set_offset(offset);  // the same mask at every evaluation
    Context c;
    return Dot(d.Run(x, c), w_out);
  };
  Context ctx;
  d.generator().set_offset(offset);
  d.Run(x, ctx);
  Tensor gx = d.RunBackward(w_out, ctx);
  EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2));
}

// With a residual input: residual + dropout(x) (the mask of a layer of the
// same seed without one), the residual's dtype; the backward gives x's
// gradient through the mask and the residual's, the gradient itself. In
// eval mode: residual + x.
TEST(DropoutTest, ResidualInputJoinsTheStream) {
  const Tensor x = RandomTensor({5, 9}, 8).To(Dtype::kBF16);
  const Tensor residual = RandomTensor({5, 9}, 9);
  Dropout plain(0.4f, 21), joined(0.4f, 21);
  Context plain_ctx, ctx;
  const Tensor dropped = plain.Run(x, plain_ctx);
  const Tensors y = joined.Run({x, residual}, ctx);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].dtype(), Dtype::kF32);
  // The mask: where the plain layer kept x (x has no zeros).
  std::vector<float> want = residual.ToVector<float>();
  const std::vector<float> d = dropped.ToVector<float>(), xv = x.ToVector<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NE(xv[i], 0.0f);
    // A select between the product and the sum, as the kernel: no fused multiply-add.
    want[i] += d[i] != 0.0f ? xv[i] * static_cast<float>(1.0 / (1.0 - 0.4f)) : 0.0f;
  }
  EXPECT_TRUE(AllClose(y[0], Tensor::FromVector(want, x.shape()), 0, 0));
  const Tensor g = RandomTensor({5, 9}, 10);
  const Tensors grads = joined.RunBackward(Tensors{g}, ctx);
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads[0].dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(grads[0], plain.RunBackward(g, plain_ctx).To(Dtype::kBF16), 0, 0));
  EXPECT_TRUE(grads[1].SharesStorageWith(g));
  joined.Train(false);
  Context eval_ctx;
  EXPECT_TRUE(AllClose(joined.Run({x, residual}, eval_ctx).at(0),
                       tensor::Add(residual, x.To(Dtype::kF32)), 0, 0));
}

TEST(DropoutTest, Bf16StaysBf16) {
  Dropout d(0.5f, 3);
  Context ctx;
  Tensor y = d.Run(RandomTensor({16}, 6).To(Dtype::kBF16), ctx);
  EXPECT_EQ(y.dtype(), Dtype::kBF16);
  EXPECT_EQ(d.RunBackward(RandomTensor({16}, 7).To(Dtype::kBF16), ctx).dtype(), Dtype::kBF16);
}

TEST(DropoutTest, BadArgumentsAreClearErrors) {
  try {
    Dropout d(1.5f);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[dropout] p must be in [0, 1]; got 1.5");
  }
  Dropout d(0.5f);
  Context ctx;
  try {
    d.Run(Tensor::Zeros({2, 3}, Dtype::kI64), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[dropout] input must be a defined floating tensor; got (2,3) i64");
  }
}

}  // namespace
}  // namespace nn
