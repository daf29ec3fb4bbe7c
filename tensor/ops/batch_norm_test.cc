// tensor::BatchNorm on the CPU: training forward against a double reference,
// running-statistics updates (unbiased variance, counter), eval with running
// statistics, finite-difference gradients with and without weight, and
// argument errors.
#include "tensor/ops/batch_norm.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using testing::AllClose;
using testing::Dot;
using testing::NumericalGradient;
using testing::RandomTensor;

// Per-channel mean and biased variance of x (N, C) or (N, C, L), in double.
void Reference(const Tensor& x, std::vector<double>* mean, std::vector<double>* var) {
  const int64_t n = x.dim(0), c = x.dim(1), l = x.rank() == 3 ? x.dim(2) : 1;
  const std::vector<float> v = x.ToVector<float>();
  mean->assign(c, 0.0);
  var->assign(c, 0.0);
  for (int64_t ci = 0; ci < c; ++ci) {
    for (int64_t ni = 0; ni < n; ++ni)
      for (int64_t li = 0; li < l; ++li) (*mean)[ci] += v[(ni * c + ci) * l + li];
    (*mean)[ci] /= n * l;
    for (int64_t ni = 0; ni < n; ++ni)
      for (int64_t li = 0; li < l; ++li) {
        const double d = v[(ni * c + ci) * l + li] - (*mean)[ci];
        (*var)[ci] += d * d;
      }
    (*var)[ci] /= n * l;
  }
}

TEST(BatchNormTest, TrainingNormalizesAndUpdatesRunningStats) {
  for (const Shape& shape : {Shape{7, 3}, Shape{4, 3, 5}}) {
    SCOPED_TRACE(shape.ToString());
    const Tensor x = RandomTensor(shape, 1, -1.0f, 3.0f);
    const Tensor w = RandomTensor({3}, 2, 0.5f, 1.5f), b = RandomTensor({3}, 3);
    BatchNormRunningStats running{Tensor::Zeros({3}), Tensor::Full({3}, 1.0),
                                  Tensor::Zeros({}, Dtype::kI64)};
    const BatchNormResult r = BatchNorm(x, w, b, running, /*training=*/true, 0.1f, 1e-5f);
    std::vector<double> mean, var;
    Reference(x, &mean, &var);
    const int64_t l = x.rank() == 3 ? x.dim(2) : 1, m = x.dim(0) * l;
    const std::vector<float> xv = x.ToVector<float>(), yv = r.y.ToVector<float>();
    for (size_t i = 0; i < xv.size(); ++i) {
      const int64_t c = (static_cast<int64_t>(i) / l) % 3;
      const double want = (xv[i] - mean[c]) / std::sqrt(var[c] + 1e-5) * w.ToVector<float>()[c] +
                          b.ToVector<float>()[c];
      EXPECT_NEAR(yv[i], want, 1e-5 + 1e-4 * std::abs(want)) << i;
    }
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(r.mean.ToVector<float>()[c], mean[c], 1e-6);
      EXPECT_NEAR(r.rstd.ToVector<float>()[c], 1.0 / std::sqrt(var[c] + 1e-5), 1e-5);
      EXPECT_NEAR(running.mean.ToVector<float>()[c], 0.1 * mean[c], 1e-6);
      EXPECT_NEAR(running.var.ToVector<float>()[c], 0.9 + 0.1 * var[c] * m / (m - 1), 1e-6);
    }
    EXPECT_EQ(running.num_batches_tracked.Item(), 1.0);
  }
}

TEST(BatchNormTest, EvalUsesRunningStatsAndLeavesThemAlone) {
  const Tensor x = RandomTensor({3, 2, 4}, 4);
  const BatchNormRunningStats running{Tensor::FromVector({0.5f, -1}, {2}),
                                      Tensor::FromVector({2, 0.25f}, {2}),
                                      Tensor::Zeros({}, Dtype::kI64)};
  const BatchNormResult r = BatchNorm(x, Tensor(), Tensor(), running, /*training=*/false);
  const std::vector<float> xv = x.ToVector<float>(), yv = r.y.ToVector<float>();
  const double mu[2] = {0.5, -1}, var[2] = {2, 0.25};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = (i / 4) % 2;
    EXPECT_NEAR(yv[i], (xv[i] - mu[c]) / std::sqrt(var[c] + 1e-5), 1e-5);
  }
  EXPECT_EQ(running.mean.ToVector<float>(), (std::vector<float>{0.5f, -1}));
  EXPECT_EQ(running.num_batches_tracked.Item(), 0.0);
}

TEST(BatchNormTest, GradientsMatchFiniteDifferences) {
  for (bool training : {true, false}) {
    for (bool affine : {true, false}) {
      for (const Shape& shape : {Shape{5, 3}, Shape{3, 3, 4}}) {
        const std::string where = std::string(training ? "train " : "eval ") +
                                  (affine ? "affine " : "plain ") + shape.ToString();
        const Tensor x = RandomTensor(shape, 5);
        const Tensor w = affine ? RandomTensor({3}, 6, 0.5f, 1.5f) : Tensor();
        const Tensor b = affine ? RandomTensor({3}, 7) : Tensor();
        const BatchNormRunningStats running{RandomTensor({3}, 8), RandomTensor({3}, 9, 0.5f, 2.0f),
                                            Tensor()};
        const Tensor gy = RandomTensor(shape, 10);
        // Running statistics are read, not updated: the eval loss stays fixed.
        const BatchNormRunningStats read = training ? BatchNormRunningStats{} : running;
        auto loss = [&](const Tensor&) { return Dot(BatchNorm(x, w, b, read, training).y, gy); };
        const BatchNormResult r = BatchNorm(x, w, b, read, training);
        const BatchNormGrads g = BatchNormBackward(gy, x, w, r.mean, r.rstd, training);
        EXPECT_TRUE(AllClose(g.grad_x, NumericalGradient(loss, x), 1e-3, 1e-2)) << where;
        if (affine) {
          EXPECT_TRUE(AllClose(g.grad_weight, NumericalGradient(loss, w), 1e-3, 1e-2)) << where;
          EXPECT_TRUE(AllClose(g.grad_bias, NumericalGradient(loss, b), 1e-3, 1e-2)) << where;
        }
      }
    }
  }
}

TEST(BatchNormTest, BadArgumentsAreClearErrors) {
  const Tensor x = RandomTensor({4, 3}, 11);
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const OpError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { BatchNorm(x, Tensor(), Tensor(), {}, /*training=*/false); }),
            "[batch_norm] eval needs running_mean and running_var");
  EXPECT_EQ(message([&] {
              BatchNorm(RandomTensor({1, 3, 1}, 12), Tensor(), Tensor(), {}, true);
            }),
            "[batch_norm] training needs more than 1 value per channel; got x (1,3,1)");
  EXPECT_EQ(message([&] { BatchNorm(x, Tensor::Full({4}, 1.0), Tensor(), {}, true); }),
            "[batch_norm] weight (4) f32 does not match x (4,3): expected (3) f32");
  EXPECT_EQ(message([&] { BatchNorm(x.To(Dtype::kBF16), Tensor(), Tensor(), {}, true); }),
            "[batch_norm] x (4,3) bf16 must be f32");
  EXPECT_EQ(message([&] { BatchNorm(Tensor::Zeros({4}), Tensor(), Tensor(), {}, true); }),
            "[batch_norm] x (4) must be (N, C) or (N, C, L) with C > 0");
}

}  // namespace
}  // namespace tensor
