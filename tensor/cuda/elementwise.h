// CUDA kernels: elementwise ops (see common.cuh for the conventions). The
// counterparts of tensor/cpu/elementwise.h with the same signatures, called by
// tensor/ops/elementwise.cc for tensors on a CUDA device.
//
// Unlike most kernel families these take operands of any strides, and an
// input whose shape is smaller than the output's is broadcast numpy-style
// (trailing-aligned, size-1 dims repeat): every broadcast the CPU accepts
// works on the GPU. Dims are merged where every operand allows it; a layout
// that still has more than 8 dims throws OpError. The op layer has checked
// shapes, dtypes and devices (all operands on one CUDA device).
//
// Arithmetic is float, rounded once to the output dtype. Add/Sub/Mul/Scale/
// Relu are single operations and give the CPU's results bit for bit; Axpy is
// one fused multiply-add (what GCC contracts the CPU loop to at -O2 on x86-64-v3,
// not guaranteed); GELU uses expf, within an ulp or two of the CPU's exp.
#ifndef TENSOR_CUDA_ELEMENTWISE_H_
#define TENSOR_CUDA_ELEMENTWISE_H_

#include <vector>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

enum class BinaryOp { kAdd, kSub, kMul };

// out = a (op) b, with a and b broadcast to out's shape; one floating dtype.
void Binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);

// out = alpha * x; one shape and dtype (out may be x itself: in place).
void Scale(const Tensor& x, float alpha, const Tensor& out);

// y += alpha * x (same shape). y has x's dtype, or is f32 while x is bf16/f16.
void Axpy(float alpha, const Tensor& x, const Tensor& y);

// out = gelu(x + bias) (tanh approximation); bias (broadcast to x) may be
// undefined, meaning no bias.
void BiasGelu(const Tensor& x, const Tensor& bias, const Tensor& out);

// grad_in = grad_out * gelu'(x + bias); bias may be undefined.
void BiasGeluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                      const Tensor& grad_in);

// out = xs[0] + xs[1] + ... (2 to 4 tensors of out's shape, any floating
// dtypes and strides), added in float from left to right and rounded once to
// out's dtype.
void SumAs(const std::vector<Tensor>& xs, const Tensor& out);

// out = max(x, 0); NaN propagates.
void Relu(const Tensor& x, const Tensor& out);

// grad_in = grad_out where x > 0, else 0.
void ReluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& grad_in);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ELEMENTWISE_H_
