// Test helpers for the op tests.
#include "tensor/testing.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/random.h"

namespace tensor {
namespace testing {

Tensor RandomTensor(const Shape& shape, uint64_t seed, float lo, float hi, Dtype dtype) {
  Generator gen(seed);
  std::vector<float> v(shape.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * gen.Uniform(i);
  return Tensor::FromVector(v, shape, dtype);
}

::testing::AssertionResult AllClose(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape()) {
    return ::testing::AssertionFailure()
           << "shapes differ: " << a.shape().ToString() << " vs " << b.shape().ToString();
  }
  const std::vector<float> va = a.ToVector<float>();
  const std::vector<float> vb = b.ToVector<float>();
  int64_t worst = -1;
  double worst_excess = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(va[i]) - vb[i]);
    const double allowed = atol + rtol * std::fabs(vb[i]);
    const bool nan_mismatch = std::isnan(va[i]) != std::isnan(vb[i]);
    if (nan_mismatch || diff > allowed) {
      ++bad;
      const double excess = nan_mismatch ? INFINITY : diff - allowed;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << va.size() << " elements differ; worst at flat index " << worst
         << ": " << va[worst] << " vs " << vb[worst] << " (atol " << atol << ", rtol " << rtol
         << ")";
}

Tensor NumericalGradient(const std::function<double(const Tensor&)>& f, const Tensor& x,
                         double eps) {
  OP_CHECK(x.dtype() == Dtype::kF32 && x.is_contiguous(), "numerical_gradient",
           "x must be a contiguous f32 tensor");
  Tensor grad = Tensor::Zeros(x.shape());
  float* px = x.data<float>();
  float* pg = grad.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float saved = px[i];
    px[i] = static_cast<float>(saved + eps);
    const double hi = f(x);
    const double step_hi = static_cast<double>(px[i]) - saved;
    px[i] = static_cast<float>(saved - eps);
    const double lo = f(x);
    const double step_lo = saved - static_cast<double>(px[i]);
    px[i] = saved;
    pg[i] = static_cast<float>((hi - lo) / (step_hi + step_lo));
  }
  return grad;
}

double Dot(const Tensor& a, const Tensor& b) {
  const std::vector<float> va = a.ToVector<float>();
  const std::vector<float> vb = b.ToVector<float>();
  OP_CHECK(va.size() == vb.size(), "dot", "sizes differ: ", va.size(), " and ", vb.size());
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += static_cast<double>(va[i]) * vb[i];
  return s;
}

}  // namespace testing
}  // namespace tensor
