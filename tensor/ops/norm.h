// Normalization over the last dimension: LayerNorm (with optional weight and
// bias) and RMSNorm (T5 style: no mean subtraction, no bias), forward and
// backward. Forward saves per-row statistics (f32) for the backward.
//
// Dtypes: x is f32, bf16 or f16; weight and bias are f32 (mixed precision keeps
// norm parameters in fp32) or x's dtype. Compute is f32; y has x's dtype;
// parameter gradients have the parameters' dtype and are summed over rows in
// f32/f64, deterministically (independent of the thread count).
#ifndef TENSOR_OPS_NORM_H_
#define TENSOR_OPS_NORM_H_

#include "tensor/tensor.h"

namespace tensor {

struct LayerNormResult {
  Tensor y;     // (..., C), x's dtype
  Tensor mean;  // (...) f32: mean of each row of x
  Tensor rstd;  // (...) f32: 1 / sqrt(var + eps) of each row (biased variance)
};

struct LayerNormGrads {
  Tensor grad_x;       // (..., C), x's dtype
  Tensor grad_weight;  // (C), weight's dtype; undefined when weight is
  // (C): sum of grad_y over rows, weight's dtype (f32 without weight). It does
  // not depend on the bias, so it is always computed; ignore it without a bias.
  Tensor grad_bias;
};

// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension.
// weight and bias are (C) or undefined (then 1 and 0).
LayerNormResult LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          float eps = 1e-5f);

// Where a norm's backward puts its parameter gradients: each one defined here
// (f32, (C), contiguous, on x's device: a Parameter's gradient buffer) gets
// its gradient added in place (in f32, the bits of a separate AddInPlace of
// the returned one) and the returned one stays undefined: no (C) tensor made
// and no add launched per parameter. Undefined ones are returned as without.
// With add_weight / add_bias false the gradient is written instead (the old
// contents, even NaN, ignored: a gradient buffer just allocated).
struct NormGradsInto {
  Tensor weight;
  Tensor bias;  // LayerNorm only
  bool add_weight = true;
  bool add_bias = true;
};

// From the forward's x, weight, mean and rstd. With `grad_x_add` (x's shape
// and dtype), grad_x is grad_x_add + the gradient, summed in fp32 as the
// gradient is written: a pre-norm block's residual, whose gradient is both
// the block output's and this norm's input's, in one pass instead of two
// (the sum of a separate Add up to one rounding).
LayerNormGrads LayerNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd,
                                 const Tensor& grad_x_add = Tensor(),
                                 const NormGradsInto& into = {});

struct RmsNormResult {
  Tensor y;     // (..., C), x's dtype
  Tensor rstd;  // (...) f32: 1 / sqrt(mean(x^2) + eps) of each row
};

struct RmsNormGrads {
  Tensor grad_x;       // (..., C), x's dtype
  Tensor grad_weight;  // (C), weight's dtype; undefined when weight is
};

// y = x / sqrt(mean(x^2) + eps) * weight over the last dimension; weight is (C)
// or undefined (then 1).
RmsNormResult RmsNorm(const Tensor& x, const Tensor& weight, float eps = 1e-6f);

// grad_x_add, into (its weight): as LayerNormBackward's.
RmsNormGrads RmsNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                             const Tensor& rstd, const Tensor& grad_x_add = Tensor(),
                             const NormGradsInto& into = {});

}  // namespace tensor

#endif  // TENSOR_OPS_NORM_H_
