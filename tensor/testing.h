// Test helpers shared by the op tests: random tensors, closeness checks and
// finite-difference gradients.
#ifndef TENSOR_TESTING_H_
#define TENSOR_TESTING_H_

#include <cstdint>
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace tensor {
namespace testing {

// A CPU tensor of uniform values in [lo, hi), converted to dtype; deterministic in seed.
Tensor RandomTensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f,
                    Dtype dtype = Dtype::kF32);

// Passes when |a - b| <= atol + rtol * |b| elementwise (shapes must match;
// both converted to f32). The failure message names the worst element.
::testing::AssertionResult AllClose(const Tensor& a, const Tensor& b, double atol, double rtol);

// The gradient of the scalar function f at x, by central differences with step
// eps, computed in double from f's double result. x must be a contiguous f32
// CPU tensor; it is perturbed in place and restored.
Tensor NumericalGradient(const std::function<double(const Tensor&)>& f, const Tensor& x,
                         double eps = 1e-3);

// sum(a * b) in double, for building scalar losses L = <f(x), w> in gradient checks.
double Dot(const Tensor& a, const Tensor& b);

}  // namespace testing
}  // namespace tensor

#endif  // TENSOR_TESTING_H_
