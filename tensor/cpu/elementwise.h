// CPU kernels of the elementwise ops (tensor/ops/elementwise.h): binary
// arithmetic with broadcasting, scaling, axpy accumulation, GELU and ReLU with
// their backward passes.
//
// Kernels take operands of any strides; an input whose shape is smaller than
// the output's is broadcast numpy-style (trailing-aligned, size-1 dims
// repeat). The op layer has checked shapes, dtypes and devices; these
// functions only compute. Float storage types (f32, bf16, f16) are loaded as
// float, computed in float and rounded once on store.
#ifndef TENSOR_CPU_ELEMENTWISE_H_
#define TENSOR_CPU_ELEMENTWISE_H_

#include "tensor/tensor.h"

namespace tensor {
namespace cpu {

enum class BinaryOp { kAdd, kSub, kMul };

// out = a (op) b, with a and b broadcast to out's shape; one dtype for all three.
void Binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);

// out = alpha * x; x and out have one shape and dtype (out may be x itself).
void Scale(const Tensor& x, float alpha, const Tensor& out);

// y += alpha * x (same shape). y has x's dtype, or is f32 while x is bf16/f16.
void Axpy(float alpha, const Tensor& x, const Tensor& y);

// out = gelu(x + bias) with the tanh approximation; bias (broadcast to x) may
// be undefined, meaning no bias.
void BiasGelu(const Tensor& x, const Tensor& bias, const Tensor& out);

// grad_in = grad_out * gelu'(x + bias); bias may be undefined.
void BiasGeluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                      const Tensor& grad_in);

// out = max(x, 0).
void Relu(const Tensor& x, const Tensor& out);

// grad_in = grad_out where x > 0, else 0.
void ReluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& grad_in);

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_ELEMENTWISE_H_
