// BatchNorm1d: forward against a double reference in training and eval,
// running-statistics updates (unbiased variance), finite-difference gradients
// for (N, C) and (N, C, L) inputs in both modes, fp32 compute for bf16 inputs,
// and error messages.
#include "nn/batch_norm.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "precision/policy.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

struct Stats {
  std::vector<double> mean, var;  // biased variance
};

// Per-channel statistics of x (N, C) or (N, C, L).
Stats ChannelStats(const Tensor& x) {
  const int64_t n = x.dim(0), c = x.dim(1), l = x.rank() == 3 ? x.dim(2) : 1;
  std::vector<float> v = x.ToVector<float>();
  Stats s{std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  for (int64_t ci = 0; ci < c; ++ci) {
    for (int64_t ni = 0; ni < n; ++ni)
      for (int64_t li = 0; li < l; ++li) s.mean[ci] += v[(ni * c + ci) * l + li];
    s.mean[ci] /= n * l;
    for (int64_t ni = 0; ni < n; ++ni)
      for (int64_t li = 0; li < l; ++li) {
        const double d = v[(ni * c + ci) * l + li] - s.mean[ci];
        s.var[ci] += d * d;
      }
    s.var[ci] /= n * l;
  }
  return s;
}

Tensor Normalize(const Tensor& x, const std::vector<double>& mean, const std::vector<double>& var,
                 const Tensor& w, const Tensor& b, double eps) {
  const int64_t c = x.dim(1), l = x.rank() == 3 ? x.dim(2) : 1;
  std::vector<float> v = x.ToVector<float>(), vw = w.ToVector<float>(), vb = b.ToVector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t ci = (static_cast<int64_t>(i) / l) % c;
    v[i] = static_cast<float>((v[i] - mean[ci]) / std::sqrt(var[ci] + eps) * vw[ci] + vb[ci]);
  }
  return Tensor::FromVector(v, x.shape());
}

void Randomize(BatchNorm1d& bn, uint64_t seed) {
  bn.Materialize(seed);
  const int64_t c = bn.num_features();
  bn.weight()->value = RandomTensor({c}, seed + 1, 0.5f, 1.5f);
  bn.bias()->value = RandomTensor({c}, seed + 2);
}

TEST(BatchNorm1dTest, NamesBuffersAndFp32Policy) {
  BatchNorm1d bn(3);
  EXPECT_EQ(bn.class_name(), "BatchNorm1d");
  EXPECT_TRUE(precision::MixedPrecisionPolicy::Bf16().KeepsFp32(bn.class_name()));
  auto params = bn.NamedParameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[1].first, "bias");
  EXPECT_FALSE(params[0].second->weight_decay);
  auto buffers = bn.NamedBuffers();
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0].first, "running_mean");
  EXPECT_EQ(buffers[1].first, "running_var");
  EXPECT_EQ(buffers[2].first, "num_batches_tracked");
  EXPECT_EQ(bn.running_var()->ToVector<float>(), std::vector<float>(3, 1.0f));
  EXPECT_EQ(bn.num_batches_tracked()->dtype(), Dtype::kI64);
  BatchNorm1dOptions bare;
  bare.affine = false;
  bare.track_running_stats = false;
  BatchNorm1d plain(3, bare);
  EXPECT_TRUE(plain.NamedParameters().empty());
  EXPECT_TRUE(plain.NamedBuffers().empty());
}

TEST(BatchNorm1dTest, TrainingUsesBatchStatsAndUpdatesRunningStats) {
  for (bool three_d : {false, true}) {
    BatchNorm1d bn(3);
    Randomize(bn, 1);
    const Tensor x =
        three_d ? RandomTensor({4, 3, 5}, 4, -1.0f, 3.0f) : RandomTensor({6, 3}, 5, -1.0f, 3.0f);
    const Stats s = ChannelStats(x);
    Context ctx;
    Tensor y = bn.Run(x, ctx);
    EXPECT_TRUE(AllClose(y, Normalize(x, s.mean, s.var, bn.weight()->value, bn.bias()->value, 1e-5),
                         1e-5, 1e-4));
    const double m = static_cast<double>(x.numel() / 3);
    std::vector<float> rm = bn.running_mean()->ToVector<float>();
    std::vector<float> rv = bn.running_var()->ToVector<float>();
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(rm[c], 0.1 * s.mean[c], 1e-6);
      EXPECT_NEAR(rv[c], 0.9 + 0.1 * s.var[c] * m / (m - 1), 1e-6);  // unbiased
    }
    EXPECT_EQ(bn.num_batches_tracked()->Item(), 1.0);
  }
}

TEST(BatchNorm1dTest, EvalUsesRunningStats) {
  BatchNorm1d bn(2);
  Randomize(bn, 2);
  *bn.running_mean() = Tensor::FromVector({0.5f, -1}, {2});
  *bn.running_var() = Tensor::FromVector({2, 0.25f}, {2});
  bn.Train(false);
  const Tensor x = RandomTensor({3, 2, 4}, 6);
  Context ctx;
  Tensor y = bn.Run(x, ctx);
  EXPECT_TRUE(
      AllClose(y, Normalize(x, {0.5, -1}, {2, 0.25}, bn.weight()->value, bn.bias()->value, 1e-5),
               1e-5, 1e-5));
  EXPECT_EQ(bn.running_mean()->ToVector<float>(), (std::vector<float>{0.5f, -1}));
  EXPECT_EQ(bn.num_batches_tracked()->Item(), 0.0);
}

TEST(BatchNorm1dTest, GradientsMatchFiniteDifferences) {
  for (bool training : {true, false}) {
    for (bool three_d : {false, true}) {
      BatchNorm1d bn(3);
      Randomize(bn, 3);
      *bn.running_mean() = RandomTensor({3}, 7);
      *bn.running_var() = RandomTensor({3}, 8, 0.5f, 2.0f);
      bn.Train(training);
      const Tensor x = three_d ? RandomTensor({3, 3, 4}, 9) : RandomTensor({5, 3}, 10);
      const Tensor w_out = RandomTensor(x.shape(), 11);
      auto loss = [&](const Tensor&) {
        Context c;
        return Dot(bn.Run(x, c), w_out);
      };
      Context ctx;
      bn.Run(x, ctx);
      Tensor gx = bn.RunBackward(w_out, ctx);
      const std::string where =
          std::string(training ? "train" : "eval") + (three_d ? " 3d" : " 2d");
      EXPECT_TRUE(AllClose(gx, NumericalGradient(loss, x), 1e-3, 1e-2)) << where;
      EXPECT_TRUE(
          AllClose(bn.weight()->grad, NumericalGradient(loss, bn.weight()->value), 1e-3, 1e-2))
          << where;
      EXPECT_TRUE(AllClose(bn.bias()->grad, NumericalGradient(loss, bn.bias()->value), 1e-3, 1e-2))
          << where;
    }
  }
}

TEST(BatchNorm1dTest, ComputesInFp32ForBf16InputsAndParameters) {
  BatchNorm1d ref(4), low(4);
  Randomize(ref, 4);
  Randomize(low, 4);
  low.weight()->value = ref.weight()->value.To(Dtype::kBF16);  // a policy that cast it anyway
  low.bias()->value = ref.bias()->value.To(Dtype::kBF16);
  const Tensor x = RandomTensor({6, 4}, 12).To(Dtype::kBF16).To(Dtype::kF32);  // bf16-exact
  const Tensor g = RandomTensor({6, 4}, 13);
  ref.weight()->value = low.weight()->value.To(Dtype::kF32);
  ref.bias()->value = low.bias()->value.To(Dtype::kF32);
  Context c_ref, c_low;
  Tensor y_ref = ref.Run(x, c_ref);
  Tensor y_low = low.Run(x.To(Dtype::kBF16), c_low);
  EXPECT_EQ(y_low.dtype(), Dtype::kF32);  // fp32 out; the next layer casts
  EXPECT_TRUE(AllClose(y_low, y_ref, 0, 0));
  Tensor gx_ref = ref.RunBackward(g, c_ref);
  Tensor gx_low = low.RunBackward(g, c_low);
  EXPECT_EQ(gx_low.dtype(), Dtype::kBF16);  // the caller's dtype
  EXPECT_TRUE(AllClose(gx_low, gx_ref, 1e-2, 1e-2));
  EXPECT_EQ(low.weight()->grad.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(low.weight()->grad, ref.weight()->grad, 0, 0));
  EXPECT_TRUE(AllClose(low.bias()->grad, ref.bias()->grad, 0, 0));
}

TEST(BatchNorm1dTest, WithoutRunningStatsEvalUsesBatchStats) {
  BatchNorm1dOptions opts;
  opts.track_running_stats = false;
  BatchNorm1d bn(2, opts);
  Randomize(bn, 5);
  bn.Train(false);
  const Tensor x = RandomTensor({5, 2}, 14);
  const Stats s = ChannelStats(x);
  Context ctx;
  EXPECT_TRUE(AllClose(bn.Run(x, ctx),
                       Normalize(x, s.mean, s.var, bn.weight()->value, bn.bias()->value, 1e-5),
                       1e-5, 1e-4));
}

TEST(BatchNorm1dTest, BadInputsAreClearErrors) {
  BatchNorm1d bn(3);
  bn.Materialize(1);
  Context ctx;
  try {
    bn.Run(Tensor::Zeros({2, 4}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[batch_norm1d] input (2,4) must be (N, C) or (N, C, L) with C = 3");
  }
  try {
    bn.Run(Tensor::Zeros({1, 3}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[batch_norm1d] training needs more than 1 value per channel; got input (1,3)");
  }
  bn.Train(false);
  EXPECT_NO_THROW(bn.Run(Tensor::Zeros({1, 3}), ctx));  // eval: running stats
}

}  // namespace
}  // namespace nn
