// The Linear layer's GEMMs with their bias and GELU fused in: on a
// CUDA device cuBLASLt adds them in the GEMM's epilogue, so the output is
// written once instead of written, read back and written again. On the CPU
// the bias goes into oneDNN's GEMM (its bias argument) where oneDNN takes
// the operands (f32 / bf16, non-empty, GEMM-friendly strides), and Gelu
// follows the GEMM; otherwise (those cases, or one cuBLASLt has no fused
// kernel for: see cuda::GemmWithEpilogue) Matmul is followed by AddBias /
// Gelu. All paths give the same values up to rounding (the fused GELU reads
// its fp32 input before it is rounded to the output dtype).
#ifndef TENSOR_OPS_LINEAR_H_
#define TENSOR_OPS_LINEAR_H_

#include "tensor/tensor.h"

namespace tensor {

// x (N, K) @ w^T + bias: w (M, K), bias (M) -> (N, M). x, w and bias share
// dtype (f32, bf16, or f16 on CUDA) and device. The bias is added inside the
// GEMM (cuBLASLt's epilogue; on the CPU oneDNN's bias argument), so a 16-bit
// result is rounded once, from the f32 sum.
Tensor LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias);

// x (N, K) @ w^T (+ bias) + residual: a Linear layer whose output joins a
// residual stream (a transformer block's attention and MLP output
// projections). bias may be undefined (a layer without one); residual (N, M)
// has w's dtype and device. On a GPU the residual is cuBLASLt's C (D = A B +
// C + bias, D a new tensor), so the sum is written once; elsewhere residual +
// bias is written first and the GEMM adds its product into it (beta 1). The
// values are those of LinearForward then Add up to rounding: the product is
// not rounded to the dtype before the residual is added.
Tensor LinearResidualForward(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& residual);

struct LinearGeluResult {
  Tensor out;  // (N, M) gelu(pre), the tanh form (tensor::Gelu)
  Tensor pre;  // (N, M) x @ w^T + bias: what GeluBackward takes
};
// gelu(x @ w^T + bias), keeping the GELU's input for the backward.
LinearGeluResult LinearGeluForward(const Tensor& x, const Tensor& w, const Tensor& bias);

// For y = gelu(pre) @ w^T (+ bias), the gradient of pre from the gradient
// of y: gelu'(pre) * (grad_y @ w). grad_y (N, M), w (M, K), pre (N, K), all
// one dtype -> (N, K). On a GPU the GELU's backward runs in the GEMM's
// epilogue (cuBLASLt's DGELU), so grad_y @ w is never written out; elsewhere
// Matmul then GeluBackward (which rounds the product to the dtype first).
// With pre_bias_grad, and cuda::MatmulDGeluBiasGrad on, the same GEMM also
// sums the result's columns (DGELU_BGRAD, from the f32 values before their
// rounding): *pre_bias_grad becomes that f32 (K) vector, the bias gradient of
// the layer whose output was pre. Where it cannot (the CPU, the switch off, an
// unfused case) *pre_bias_grad is left undefined and the caller sums them.
Tensor LinearGeluInputGrad(const Tensor& grad_y, const Tensor& w, const Tensor& pre,
                           Tensor* pre_bias_grad = nullptr);

// A Linear layer's parameter gradients from its output gradient g (N, M) and
// input x (N, K): grad_w (M, K) += g^T @ x and, when grad_b is defined,
// grad_b (M) += g's column sums, both accumulated in fp32 (f32 buffers, or
// g's dtype). accumulate_w / accumulate_b false: = instead of += (the old
// contents, even NaN, ignored: a gradient buffer just allocated). On a GPU,
// with f32 buffers, the bias gradient comes out of the weight-gradient GEMM's
// epilogue (cuBLASLt's BGRADB: straight into grad_b when it overwrites, else
// into a temporary then added), so g is read once; elsewhere MatmulInto then
// AddBiasBackwardInto.
void LinearParamGradsInto(const Tensor& g, const Tensor& x, const Tensor& grad_w,
                          const Tensor& grad_b, bool accumulate_w = true,
                          bool accumulate_b = true);

}  // namespace tensor

#endif  // TENSOR_OPS_LINEAR_H_
