// In-place tensor initialization: constant fills and random initializers
// (uniform, normal, truncated normal) drawn from a counter-based Generator.
//
// Each random initializer reserves numel counters from the generator
// (gen.Reserve(numel)) and gives element i, in row-major order of t's shape,
// the numbers of counter base + i only. So results do not depend on the
// thread count, a strided view gets the values a contiguous tensor of its
// shape would, and filling a tensor in consecutive slices along dim 0 with one
// generator gives the same values as filling it in one call.
//
// Destinations are `const Tensor&`: a Tensor is a handle, and these write
// through it (views included). Random initializers need f32, bf16 or f16;
// values are computed in float (double for the truncated normal's inverse
// CDF) and rounded once to the storage type.
#ifndef TENSOR_OPS_INIT_H_
#define TENSOR_OPS_INIT_H_

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace tensor {

// Every element of t = value (converted to t's dtype; any dtype).
void Fill(const Tensor& t, double value);
// Fill(t, 0).
void Zero(const Tensor& t);

// (n,) 0, 1, ..., n - 1 in an integer dtype (i32 or i64) on `device`: on a
// GPU made there (position ids with no copy from the host).
Tensor Arange(int64_t n, Dtype dtype = Dtype::kI64, Device device = Device::Cpu());

// Uniform in [lo, hi).
void UniformInit(const Tensor& t, Generator& gen, double lo, double hi);

// Normal with the given mean and standard deviation (std >= 0).
void NormalInit(const Tensor& t, Generator& gen, double mean, double std);

// Normal(mean, std) restricted to [a, b], as PyTorch's trunc_normal_: sampled by
// the inverse CDF of the truncated distribution (no rejection loop, so one
// counter per element), then clamped to [a, b] against rounding. Requires
// std > 0 and a < b; a and b may be infinite.
void TruncatedNormalInit(const Tensor& t, Generator& gen, double mean, double std, double a,
                         double b);

}  // namespace tensor

#endif  // TENSOR_OPS_INIT_H_
