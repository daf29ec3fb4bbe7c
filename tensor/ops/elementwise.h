// Elementwise ops and their backward passes: broadcasting add / sub / mul,
// scaling, in-place accumulation (axpy, for gradients and optimizer updates),
// bias add, GELU (tanh approximation, as GPT-2) and ReLU.
//
// Broadcasting follows numpy: shapes are aligned at the end and a dimension of
// size 1 (or a missing leading one) repeats; the common case is b's shape being
// a suffix of a's, e.g. (B,T,C) + (C). Floating dtypes only (f32, bf16, f16),
// computed in float. Operands must share a dtype, except that Axpy and
// AddInPlace accumulate a bf16/f16 x into an f32 y (mixed precision).
//
// Ops return new contiguous tensors; inputs may be any strided views. In-place
// ops take the destination as `const Tensor&`: a Tensor is a handle to shared
// storage, so writing through it (or through a view of it) is what they do.
// Backward functions may return grad_out itself (no copy) where the gradient
// is the identity; callers must not write into such a result in place.
#ifndef TENSOR_OPS_ELEMENTWISE_H_
#define TENSOR_OPS_ELEMENTWISE_H_

#include <vector>

#include "tensor/tensor.h"

namespace tensor {

// The numpy broadcast of two shapes; throws OpError "[op] shapes (2,3) and
// (4,3) cannot be broadcast: ..." when they do not match.
Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b);

// ---- Binary arithmetic: out = a (op) b, shape BroadcastShapes(a, b) ----
Tensor Add(const Tensor& a, const Tensor& b);
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);

// Gradients with respect to both operands, each summed back to its operand's
// shape over the broadcast dims.
struct BinaryGrads {
  Tensor grad_a;  // a's shape
  Tensor grad_b;  // b's shape
};
BinaryGrads AddBackward(const Tensor& grad_out, const Shape& a_shape, const Shape& b_shape);
BinaryGrads SubBackward(const Tensor& grad_out, const Shape& a_shape, const Shape& b_shape);
BinaryGrads MulBackward(const Tensor& grad_out, const Tensor& a, const Tensor& b);

// ---- Scaling ----
// alpha * x.
Tensor Scale(const Tensor& x, double alpha);
// d(alpha x)/dx applied to grad_out: alpha * grad_out.
Tensor ScaleBackward(const Tensor& grad_out, double alpha);
// x *= alpha in place (gradient clipping, loss-scale unscaling).
void ScaleInPlace(const Tensor& x, double alpha);

// ---- In-place accumulation (same shapes) ----
// y += alpha * x. y may be f32 while x is bf16/f16; otherwise dtypes match.
void Axpy(double alpha, const Tensor& x, const Tensor& y);
// y += x (Axpy with alpha 1): gradient accumulation.
void AddInPlace(const Tensor& y, const Tensor& x);

// ---- Sums across dtypes ----
// xs[0] + xs[1] (+ xs[2] (+ xs[3])): 2 to 4 tensors of one shape on one
// device, of any floating dtypes, added in float from left to right and
// rounded once to the floating `dtype` -- what casting each to f32, adding
// and casting the sum gives, in one pass on a GPU (mixed precision's sums of
// gradients that arrive in bf16).
Tensor SumAs(const std::vector<Tensor>& xs, Dtype dtype);

// ---- Bias ----
// x (..., C) + bias (C).
Tensor AddBias(const Tensor& x, const Tensor& bias);
// grad_bias (C) = grad_out (..., C) summed over the leading dims; grad_x is
// grad_out itself.
Tensor AddBiasBackward(const Tensor& grad_out);
// grad_bias (C) += sum of grad_out (..., C) over the leading dims (= with
// accumulate false: the old contents, even NaN, ignored). grad_bias may be f32
// while grad_out is bf16/f16 (summed in double either way).
void AddBiasBackwardInto(const Tensor& grad_out, const Tensor& grad_bias, bool accumulate = true);

// ---- Activations ----
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor Gelu(const Tensor& x);
// grad_out * gelu'(x); x is the forward input.
Tensor GeluBackward(const Tensor& grad_out, const Tensor& x);
// gelu(x + bias) for x (..., C), bias (C), fused (no x + bias temporary).
Tensor BiasGelu(const Tensor& x, const Tensor& bias);
struct BiasGeluGrads {
  Tensor grad_x;     // (..., C)
  Tensor grad_bias;  // (C)
};
BiasGeluGrads BiasGeluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& bias);
// max(x, 0); NaN propagates.
Tensor Relu(const Tensor& x);
// grad_out where x > 0, else 0.
Tensor ReluBackward(const Tensor& grad_out, const Tensor& x);

}  // namespace tensor

#endif  // TENSOR_OPS_ELEMENTWISE_H_
