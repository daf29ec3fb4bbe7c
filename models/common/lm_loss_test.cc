// train::ScaledCrossEntropyInPlace: the loss scale enters the fused
// cross-entropy's gradient before it is rounded to fp16, so gradients too small
// for fp16 unscaled keep their bits (scaling the rounded gradient afterwards,
// the way the models did, loses them: checked below as the counter-example);
// fp32 gradients scale bit for bit; a scale beyond fp32 overflows instead of
// being refused; a bad scale is named.
#include "models/common/lm_loss.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace train {
namespace {

using tensor::Dtype;
using tensor::Tensor;

constexpr int64_t kRows = 2048;  // the count the mean divides by: gradients of ~1/(64 * 2048)
constexpr int64_t kVocab = 64;

Tensor Targets() {
  std::vector<int64_t> t(kRows);
  for (int64_t i = 0; i < kRows; ++i) t[i] = (i * 37 + 5) % kVocab;
  return Tensor::FromData<int64_t>(t, {kRows});
}

// The largest |a - b| / |b| over entries (a, b as f32), b never 0 here.
double MaxRelativeError(const Tensor& a, const Tensor& b) {
  const Tensor af = tensor::Cast(a, Dtype::kF32).Contiguous();
  const Tensor bf = tensor::Cast(b, Dtype::kF32).Contiguous();
  double worst = 0;
  for (int64_t i = 0; i < bf.numel(); ++i) {
    const double x = af.data<float>()[i], y = bf.data<float>()[i];
    worst = std::max(worst, std::abs(x - y) / std::abs(y));
  }
  return worst;
}

TEST(ScaledCrossEntropyTest, Fp16GradientsKeepTheirBitsWhereUnscaledOnesWouldNot) {
  constexpr double kScale =
      65536;  // dynamic scaling's usual start: every entry becomes an fp16 normal
  const Tensor targets = Targets();
  // Logits exactly representable in fp16, so fp32 and fp16 see the same values.
  const Tensor logits16 = tensor::testing::RandomTensor({kRows, kVocab}, 7, -4, 4, Dtype::kF16);
  const Tensor logits32 = tensor::Cast(logits16, Dtype::kF32);

  // Reference: the scaled gradient in fp32.
  const Tensor want = logits32.Clone();
  const double want_loss = ScaledCrossEntropyInPlace(want, targets, kScale).loss.Item();

  const Tensor got = logits16.Clone();
  const double got_loss = ScaledCrossEntropyInPlace(got, targets, kScale).loss.Item();
  EXPECT_NEAR(got_loss, want_loss, 1e-6 * want_loss);
  // One fp16 rounding of each entry: half an ulp, 2^-11 relative.
  EXPECT_LE(MaxRelativeError(got, want), 1.0 / 2048 * 1.01);

  // The counter-example: round to fp16 first, then scale. Entries of
  // ~1/(64 * 2048) are fp16 subnormals; the smallest keep a few bits.
  const Tensor late = logits16.Clone();
  tensor::CrossEntropyForwardBackwardInPlace(late, targets);
  tensor::ScaleInPlace(late, kScale);
  const double early_error = MaxRelativeError(got, want);
  const double late_error = MaxRelativeError(late, want);
  std::printf("fp16 logits gradient, worst relative error: scaled as formed %.2g, after %.2g\n",
              early_error, late_error);
  EXPECT_GT(late_error, 0.05);
}

TEST(ScaledCrossEntropyTest, Fp32GradientsScaleBitForBitByAPowerOfTwo) {
  const Tensor targets = Targets();
  const Tensor logits = tensor::testing::RandomTensor({kRows, kVocab}, 3, -4, 4);
  const Tensor plain = logits.Clone();
  const double plain_loss = ScaledCrossEntropyInPlace(plain, targets, 1.0).loss.Item();
  const Tensor scaled = logits.Clone();
  const double scaled_loss = ScaledCrossEntropyInPlace(scaled, targets, 65536).loss.Item();
  EXPECT_EQ(scaled_loss, plain_loss);  // the loss itself is never scaled
  tensor::ScaleInPlace(plain, 65536);
  EXPECT_TRUE(tensor::testing::AllClose(scaled, plain, 0, 0));
}

TEST(ScaledCrossEntropyTest, AScaleBeyondFp32OverflowsEveryGradient) {
  const Tensor targets = Targets();
  const Tensor logits = tensor::testing::RandomTensor({kRows, kVocab}, 5, -4, 4);
  const Tensor plain = logits.Clone();
  const double plain_loss = ScaledCrossEntropyInPlace(plain, targets, 1.0).loss.Item();
  const Tensor grad = logits.Clone();
  const double loss = ScaledCrossEntropyInPlace(grad, targets, 1e40).loss.Item();
  EXPECT_EQ(loss, plain_loss);
  const Tensor g = grad.Contiguous();
  for (int64_t i = 0; i < g.numel(); ++i) {
    ASSERT_FALSE(std::isfinite(g.data<float>()[i])) << "entry " << i;
  }
}

TEST(ScaledCrossEntropyTest, ABadScaleIsNamed) {
  const Tensor targets = Targets();
  const Tensor logits = tensor::testing::RandomTensor({kRows, kVocab}, 5);
  for (double bad : {0.0, -2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const Tensor before = logits.Clone();
    try {
      ScaledCrossEntropyInPlace(logits, targets, bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("loss_scale must be finite and > 0"), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(tensor::testing::AllClose(logits, before, 0, 0)) << "logits changed";
  }
}

}  // namespace
}  // namespace train
