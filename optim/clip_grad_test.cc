// Global-norm clipping: the norm, the scaling, the no-op case, and the
// all-reduce hook that sums shards' squared norms across ranks.
#include "optim/clip_grad.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace optim {
namespace {

using tensor::Tensor;
using tensor::testing::RandomTensor;

double ReferenceSquared(const std::vector<Tensor>& grads) {
  double s = 0;
  for (const Tensor& g : grads) {
    for (float v : g.ToVector<float>()) s += static_cast<double>(v) * v;
  }
  return s;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(ClipGradTest, GradNormSquaredKnownValues) {
  std::vector<Tensor> grads = {Tensor::FromVector({3, 4}, {2}), Tensor::FromVector({12}, {1})};
  EXPECT_EQ(GradNormSquared(grads), 169.0);
  EXPECT_EQ(GradNormSquared({}), 0.0);
}

TEST(ClipGradTest, GradNormSquaredIsAccurateOnLargeTensors) {
  // Sizes around and above the summation block, so several blocks and threads share the work.
  std::vector<Tensor> grads = {RandomTensor({200001}, 1), RandomTensor({8192}, 2),
                               RandomTensor({3}, 3), Tensor::Zeros({0})};
  const double want = ReferenceSquared(grads);
  EXPECT_NEAR(GradNormSquared(grads), want, 1e-12 * want);
  // A sum in float would be visibly off here; double accumulation is not.
  std::vector<Tensor> many = {Tensor::Full({1 << 22}, 1.0)};  // 4M ones
  EXPECT_EQ(GradNormSquared(many), static_cast<double>(1 << 22));
}

TEST(ClipGradTest, ClipsToMaxNorm) {
  Tensor a = Tensor::FromVector({3, 0, 0}, {3});
  Tensor b = Tensor::FromVector({4}, {1});
  std::vector<ParamRef> refs = {MakeParamRef("a", Tensor::Zeros({3}), a, true),
                                MakeParamRef("b", Tensor::Zeros({1}), b, false)};
  const double total = ClipGradNorm(refs, 1.0);
  EXPECT_DOUBLE_EQ(total, 5.0);
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{3 * coef, 0, 0}));
  EXPECT_EQ(b.ToVector<float>(), (std::vector<float>{4 * coef}));
  // The norm after clipping is max_norm (up to the 1e-6 guard).
  EXPECT_NEAR(std::sqrt(GradNormSquared({a, b})), 1.0, 1e-6);
}

TEST(ClipGradTest, NoOpUnderMaxNorm) {
  Tensor g = RandomTensor({1000}, 5);
  Tensor before = g.Clone();
  std::vector<ParamRef> refs = {MakeParamRef("g", Tensor::Zeros({1000}), g, true)};
  const double norm = std::sqrt(ReferenceSquared({g}));
  EXPECT_NEAR(ClipGradNorm(refs, norm * 1.5), norm, 1e-9 * norm);
  EXPECT_TRUE(BitwiseEqual(g, before));
  // Exactly at the max norm the coefficient is just under 1 (PyTorch's 1e-6 guard)...
  // ...but far under it nothing moves at all.
  EXPECT_NEAR(ClipGradNorm(refs, 1e6), norm, 1e-9 * norm);
  EXPECT_TRUE(BitwiseEqual(g, before));
}

// Two "ranks" hold halves of a gradient; each clips its shard with a hook
// that adds the other's squared norm. Both see the global norm and together
// end up exactly as clipping the whole gradient.
TEST(ClipGradTest, AllReduceHookGivesGlobalNorm) {
  const int64_t n = 5000, half = 2000;
  Tensor whole = RandomTensor({n}, 9, -3, 3);
  Tensor shard0 = whole.Narrow(0, 0, half).Clone();
  Tensor shard1 = whole.Narrow(0, half, n - half).Clone();
  const double sq0 = ReferenceSquared({shard0}), sq1 = ReferenceSquared({shard1});

  std::vector<ParamRef> whole_refs = {MakeParamRef("w", Tensor::Zeros({n}), whole, true)};
  const double norm = ClipGradNorm(whole_refs, 2.0);

  int calls = 0;
  double seen = -1;
  std::vector<ParamRef> r0 = {MakeParamRef("w", Tensor::Zeros({half}), shard0, true)};
  const double norm0 = ClipGradNorm(r0, 2.0, [&](double local) {
    ++calls;
    seen = local;
    return local + sq1;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_NEAR(seen, sq0, 1e-12 * sq0);
  std::vector<ParamRef> r1 = {MakeParamRef("w", Tensor::Zeros({n - half}), shard1, true)};
  const double norm1 = ClipGradNorm(r1, 2.0, [&](double local) { return local + sq0; });

  EXPECT_NEAR(norm0, norm, 1e-12 * norm);
  EXPECT_NEAR(norm1, norm, 1e-12 * norm);
  EXPECT_GT(norm, 2.0);
  std::vector<float> w = whole.ToVector<float>(), a = shard0.ToVector<float>(),
                     b = shard1.ToVector<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float got = i < half ? a[i] : b[i - half];
    ASSERT_NEAR(got, w[i], 1e-6f * std::abs(w[i])) << i;
  }
}

TEST(ClipGradTest, NonFiniteNormChangesNothing) {
  Tensor g = Tensor::FromVector({1, INFINITY, 2}, {3});
  Tensor before = g.Clone();
  std::vector<ParamRef> refs = {MakeParamRef("g", Tensor::Zeros({3}), g, true)};
  EXPECT_TRUE(std::isinf(ClipGradNorm(refs, 1.0)));
  EXPECT_TRUE(BitwiseEqual(g, before));
}

TEST(ClipGradTest, ScaleGrads) {
  std::vector<Tensor> grads = {RandomTensor({70000}, 1), RandomTensor({5}, 2)};
  std::vector<Tensor> before = {grads[0].Clone(), grads[1].Clone()};
  ScaleGrads(absl::MakeSpan(grads), 0.25f);
  for (int k = 0; k < 2; ++k) {
    std::vector<float> got = grads[k].ToVector<float>(), was = before[k].ToVector<float>();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], was[i] * 0.25f);
  }
}

TEST(ClipGradTest, RejectsBadInput) {
  std::vector<ParamRef> refs = {MakeParamRef("g", Tensor::Zeros({3}), Tensor::Zeros({3}), true)};
  EXPECT_THROW(ClipGradNorm(refs, 0.0), tensor::OpError);
  EXPECT_THROW(ClipGradNorm(refs, -1.0), tensor::OpError);
  std::vector<Tensor> bf16 = {Tensor::Zeros({3}, tensor::Dtype::kBF16)};
  EXPECT_THROW(GradNormSquared(bf16), tensor::OpError);
}

}  // namespace
}  // namespace optim
