// Matrix multiplication: Matmul (plain, transposed, batched, broadcast 2-D
// operand), MatmulInto (c = a @ b + beta * c, for accumulating gradients in
// place) and MatmulBackward. f32 x f32 -> f32; bf16 x bf16 -> bf16 or f32
// (also f16 x f16 on CUDA), accumulated in fp32. CPU kernels:
// tensor/cpu/matmul.h (oneDNN, OpenBLAS); on a CUDA device the GEMM runs
// through cuBLASLt (tensor/cuda/matmul.h).
#ifndef TENSOR_OPS_MATMUL_H_
#define TENSOR_OPS_MATMUL_H_

#include <optional>

#include "tensor/tensor.h"

namespace tensor {

struct MatmulOptions {
  // Use a's last two dims transposed: a is (..., K, M) instead of (..., M, K).
  bool trans_a = false;
  // Use b's last two dims transposed: b is (..., N, K) instead of (..., K, N)
  // (the Linear layer: x @ W^T with W (C_out, C_in)).
  bool trans_b = false;
  // dtype of the result (and of the gradients in MatmulBackward). Unset: the
  // inputs' dtype. f32 is allowed for bf16/f16 inputs (mixed precision).
  std::optional<Dtype> out_dtype;
};

// op(a) @ op(b), where op transposes the last two dims when asked.
//   op(a) (M, K)     @ op(b) (K, N)     -> (M, N)
//   op(a) (..., M, K) @ op(b) (..., K, N) -> (..., M, N)  batch dims equal
//   op(a) (..., M, K) @ op(b) (K, N)     -> (..., M, N)  b broadcast over a's batch
//   op(a) (M, K)     @ op(b) (..., K, N) -> (..., M, N)  a broadcast over b's batch
// Inputs may be strided views (Transpose, Narrow): passed to the GEMM library
// as strides when it can take them, copied to contiguous otherwise. Both
// inputs f32, or both bf16. K == 0 gives zeros. Throws OpError("[matmul] ...")
// with the shapes on bad arguments.
Tensor Matmul(const Tensor& a, const Tensor& b, const MatmulOptions& opts = {});

// out = op(a) @ op(b) + beta * out. `out` may be any view with a unit stride
// in its last dim whose elements are all distinct (contiguous, row-padded, or
// attention heads interleaved in a (B, T, nh * hs) buffer and viewed as
// (B, nh, T, hs)); it must have the result's shape and a dtype allowed for
// the inputs (their dtype, or f32 for bf16 inputs; opts.out_dtype, if set,
// must agree), and must not overlap a or b.
// beta == 0 overwrites out (its old contents, even NaN, are ignored); beta == 1
// accumulates (e.g. gradients).
void MatmulInto(const Tensor& a, const Tensor& b, const Tensor& out, const MatmulOptions& opts = {},
                float beta = 0.0f);

struct MatmulGrads {
  Tensor grad_a;  // a's shape
  Tensor grad_b;  // b's shape
};

// Gradients of c = Matmul(a, b, opts) given grad_out = dL/dc (c's shape):
// d op(a) = grad_out @ op(b)^T and d op(b) = op(a)^T @ grad_out, transposed
// back where trans flags were set. Where an operand was broadcast over the
// batch, its gradient is summed over the batch (for a broadcast b this is one
// GEMM with the batch folded into M). grad_out is converted to the inputs'
// dtype if it differs (e.g. an f32 grad for bf16 inputs); the gradients have
// dtype opts.out_dtype (default: the inputs' dtype).
MatmulGrads MatmulBackward(const Tensor& grad_out, const Tensor& a, const Tensor& b,
                           const MatmulOptions& opts = {});

}  // namespace tensor

#endif  // TENSOR_OPS_MATMUL_H_
