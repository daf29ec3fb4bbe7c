// Tests of the fused log-softmax + cross-entropy: forward and backward against
// a plain double reference and finite differences, ignore_index (some and all
// targets), extreme logits, the in-place fused call, low precision and errors.
#include "tensor/ops/loss.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using testing::AllClose;
using testing::NumericalGradient;
using testing::RandomTensor;

Tensor Targets(const std::vector<int64_t>& v, const Shape& shape, Dtype dtype = Dtype::kI64) {
  return Tensor::FromData<int64_t>(v, shape).To(dtype);
}

struct Reference {
  double loss = 0;
  Tensor grad;  // for grad_loss = 1
};

Reference ReferenceCrossEntropy(const Tensor& logits, const std::vector<int64_t>& targets,
                                int64_t ignore_index) {
  const int64_t v = logits.dim(-1);
  const std::vector<float> x = logits.ToVector<float>();
  std::vector<double> grad(x.size(), 0.0);
  double total = 0;
  int64_t count = 0;
  for (size_t r = 0; r < targets.size(); ++r) count += targets[r] != ignore_index;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == ignore_index) continue;
    double m = -INFINITY;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, double{x[r * v + j]});
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(x[r * v + j] - m);
    const double lse = m + std::log(sum);
    total += lse - x[r * v + targets[r]];
    for (int64_t j = 0; j < v; ++j) {
      grad[r * v + j] = (std::exp(x[r * v + j] - lse) - (j == targets[r])) / count;
    }
  }
  Reference ref;
  ref.loss = count == 0 ? 0.0 : total / count;
  ref.grad = Tensor::FromVector(std::vector<float>(grad.begin(), grad.end()), logits.shape());
  return ref;
}

TEST(CrossEntropyTest, MatchesReferenceWithIgnoredTargets) {
  const Tensor logits = RandomTensor({6, 37}, 1, -5.0f, 5.0f);
  const std::vector<int64_t> t = {3, -100, 0, 36, -100, 12};
  for (Dtype idt : {Dtype::kI32, Dtype::kI64}) {
    const Tensor targets = Targets(t, {6}, idt);
    const CrossEntropyResult res = CrossEntropy(logits, targets);
    const Reference ref = ReferenceCrossEntropy(logits, t, -100);
    EXPECT_EQ(res.count, 4);
    EXPECT_EQ(res.loss.shape(), Shape());
    EXPECT_EQ(res.loss.dtype(), Dtype::kF32);
    EXPECT_NEAR(res.loss.Item(), ref.loss, 1e-5 * ref.loss);
    const Tensor grad = CrossEntropyBackward(logits, targets, res);
    EXPECT_TRUE(AllClose(grad, ref.grad, 1e-7, 1e-5));
    // Ignored rows get exactly zero gradient.
    for (int64_t r : {1, 4}) {
      for (float g : grad.Select(0, r).ToVector<float>()) EXPECT_EQ(g, 0.0f);
    }
  }
}

TEST(CrossEntropyTest, BatchTimeShapeAndVocabularySizedRows) {
  const int64_t v = 50257;
  const Tensor logits = RandomTensor({2, 2, v}, 2, -8.0f, 8.0f);
  const std::vector<int64_t> t = {50256, 0, 17, -100};
  const Tensor targets = Targets(t, {2, 2});
  const CrossEntropyResult res = CrossEntropy(logits, targets);
  EXPECT_EQ(res.lse.shape(), Shape({2, 2}));
  const Reference ref = ReferenceCrossEntropy(logits, t, -100);
  EXPECT_NEAR(res.loss.Item(), ref.loss, 1e-5 * ref.loss);
  EXPECT_TRUE(AllClose(CrossEntropyBackward(logits, targets, res), ref.grad, 1e-10, 1e-4));
}

TEST(CrossEntropyTest, BackwardMatchesFiniteDifferences) {
  Tensor logits = RandomTensor({2, 3, 7}, 3, -2.0f, 2.0f);
  const Tensor targets = Targets({6, 0, -100, 3, 3, 1}, {2, 3});
  for (float grad_loss : {1.0f, 2.5f}) {
    auto loss = [&](const Tensor& x) { return grad_loss * CrossEntropy(x, targets).loss.Item(); };
    const Tensor numeric = NumericalGradient(loss, logits, 1e-2);
    const Tensor analytic =
        CrossEntropyBackward(logits, targets, CrossEntropy(logits, targets), grad_loss);
    EXPECT_TRUE(AllClose(analytic, numeric, 2e-4, 1e-2)) << grad_loss;
  }
}

TEST(CrossEntropyTest, ExtremeLogitsStayFinite) {
  const Tensor logits = Tensor::FromVector(
      {1e4f, 0.0f, -1e4f, 5.0f,  //
       1e4f, 0.0f, -1e4f, 5.0f,  //
       -1e4f, -1e4f, -1e4f, -1e4f,  //
       3e4f, 3e4f - 1.0f, -3e4f, 0.0f},
      {4, 4});
  const std::vector<int64_t> t = {0, 2, 1, 1};
  const Tensor targets = Targets(t, {4});
  const CrossEntropyResult res = CrossEntropy(logits, targets);
  // Row losses: ~0, 2e4, log 4, log(1 + e) (since max = 3e4 and target is 1 below it).
  const double expected = (0.0 + 2e4 + std::log(4.0) + std::log1p(std::exp(1.0))) / 4;
  EXPECT_TRUE(std::isfinite(res.loss.Item()));
  EXPECT_NEAR(res.loss.Item(), expected, 1e-3);
  const Tensor grad = CrossEntropyBackward(logits, targets, res);
  for (float g : grad.ToVector<float>()) EXPECT_TRUE(std::isfinite(g));
  EXPECT_TRUE(AllClose(grad, ReferenceCrossEntropy(logits, t, -100).grad, 1e-6, 1e-3));
  // bf16 logits of that size too.
  const CrossEntropyResult rb = CrossEntropy(logits.To(Dtype::kBF16), targets);
  EXPECT_TRUE(std::isfinite(rb.loss.Item()));
}

TEST(CrossEntropyTest, AllTargetsIgnoredGivesZeroLossAndGrads) {
  const Tensor logits = RandomTensor({3, 5}, 4);
  const Tensor targets = Targets({-100, -100, -100}, {3});
  const CrossEntropyResult res = CrossEntropy(logits, targets);
  EXPECT_EQ(res.count, 0);
  EXPECT_EQ(res.loss.Item(), 0.0);
  for (float g : CrossEntropyBackward(logits, targets, res).ToVector<float>()) EXPECT_EQ(g, 0.0f);
  const Tensor in_place = logits.Clone();
  EXPECT_EQ(CrossEntropyForwardBackwardInPlace(in_place, targets).loss.Item(), 0.0);
  for (float g : in_place.ToVector<float>()) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropyTest, CustomIgnoreIndexMayBeAClassId) {
  const Tensor logits = RandomTensor({4, 6}, 5, -3.0f, 3.0f);
  const std::vector<int64_t> t = {0, 2, 0, 5};
  const CrossEntropyResult res = CrossEntropy(logits, Targets(t, {4}), /*ignore_index=*/0);
  EXPECT_EQ(res.count, 2);
  const Reference ref = ReferenceCrossEntropy(logits, t, 0);
  EXPECT_NEAR(res.loss.Item(), ref.loss, 1e-5 * ref.loss);
  EXPECT_TRUE(AllClose(CrossEntropyBackward(logits, Targets(t, {4}), res), ref.grad, 1e-7, 1e-5));
}

TEST(CrossEntropyTest, FusedInPlaceMatchesSeparateCalls) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const Tensor logits = RandomTensor({5, 300}, 6, -6.0f, 6.0f, dtype);
    const Tensor targets = Targets({299, 0, -100, 150, 7}, {5}, Dtype::kI32);
    const CrossEntropyResult res = CrossEntropy(logits, targets);
    const Tensor grad = CrossEntropyBackward(logits, targets, res, 0.5f);
    const Tensor buf = logits.Clone();
    const CrossEntropyResult fused = CrossEntropyForwardBackwardInPlace(buf, targets, 0.5f);
    EXPECT_EQ(fused.loss.Item(), res.loss.Item());
    EXPECT_EQ(fused.count, res.count);
    EXPECT_TRUE(AllClose(fused.lse, res.lse, 0, 0));
    const double tol = dtype == Dtype::kF32 ? 1e-5 : 8e-3;
    EXPECT_TRUE(AllClose(buf, grad, 1e-7, tol)) << DtypeName(dtype);
  }
}

// Row-padded logits (rows of a wider buffer, as an aligned LM head writes
// them on a GPU) are overwritten in place with the gradient contiguous
// logits get; the padding is left alone.
TEST(CrossEntropyTest, FusedInPlaceTakesRowPaddedLogits) {
  const Tensor logits = RandomTensor({5, 300}, 7, -6.0f, 6.0f);
  const Tensor targets = Targets({299, 0, -100, 150, 7}, {5}, Dtype::kI32);
  const Tensor buf = logits.Clone();
  const CrossEntropyResult plain = CrossEntropyForwardBackwardInPlace(buf, targets);
  const Tensor wide = Tensor::Full({5, 320}, 4.0);
  Tensor padded = wide.Narrow(1, 0, 300);
  padded.CopyFrom(logits);
  const CrossEntropyResult res = CrossEntropyForwardBackwardInPlace(padded, targets);
  EXPECT_EQ(res.loss.Item(), plain.loss.Item());
  EXPECT_EQ(padded.Contiguous().ToVector<float>(), buf.ToVector<float>());
  for (float pad : wide.Narrow(1, 300, 20).Contiguous().ToVector<float>()) EXPECT_EQ(pad, 4.0f);
}

TEST(CrossEntropyTest, LowPrecisionLogitsMatchF32) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    const Tensor logits = RandomTensor({8, 100}, 7, -4.0f, 4.0f, dtype);
    const Tensor targets = Targets({1, 2, 3, 4, 5, 6, 7, 99}, {8});
    const CrossEntropyResult res = CrossEntropy(logits, targets);
    const CrossEntropyResult r32 = CrossEntropy(logits.To(Dtype::kF32), targets);
    // The same (rounded) inputs computed in f32: only the gradient's rounding differs.
    EXPECT_NEAR(res.loss.Item(), r32.loss.Item(), 1e-6);
    const Tensor grad = CrossEntropyBackward(logits, targets, res);
    EXPECT_EQ(grad.dtype(), dtype);
    const double tol = dtype == Dtype::kBF16 ? 8e-3 : 1e-3;
    EXPECT_TRUE(AllClose(grad, CrossEntropyBackward(logits.To(Dtype::kF32), targets, r32), 1e-7,
                         tol));
  }
}

TEST(CrossEntropyTest, ErrorsNameTheOpAndShapes) {
  const Tensor logits = Tensor::Zeros({4, 10});
  try {
    CrossEntropy(logits, Targets({1, 2, 10, 3}, {4}));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[cross_entropy] target 10 at position [2] of targets (4) is out of range for 10 "
                 "classes (logits (4,10), ignore_index -100)");
  }
  try {
    CrossEntropy(Tensor::Zeros({2, 3, 10}), Targets({1, 2, 3}, {3}));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(), "[cross_entropy] targets (3) do not match logits (2,3,10): expected "
                           "targets (2,3)");
  }
  EXPECT_THROW(CrossEntropy(logits, Targets({1, -1, 2, 3}, {4})), OpError);
  EXPECT_THROW(CrossEntropy(logits, Tensor::Zeros({4})), OpError);  // f32 targets
  EXPECT_THROW(CrossEntropy(Tensor::Zeros({4, 10}, Dtype::kI32), Targets({1, 2, 3, 4}, {4})),
               OpError);
  const Tensor targets = Targets({1, 2, 3, 4}, {4});
  const CrossEntropyResult res = CrossEntropy(logits, targets);
  EXPECT_THROW(CrossEntropyBackward(logits, Targets({1, -100, 3, 4}, {4}), res), OpError);
  EXPECT_THROW(CrossEntropyBackward(logits, targets, res, NAN), OpError);
  EXPECT_THROW(CrossEntropyForwardBackwardInPlace(Tensor::Zeros({10, 4}).Transpose(0, 1), targets),
               OpError);
}

}  // namespace
}  // namespace tensor
