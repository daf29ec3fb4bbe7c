// CPU GEMM kernels behind tensor::Matmul (tensor/ops/matmul.h): oneDNN matmul
// primitives for f32 and bf16 (fp32 accumulation), cached by shape, strides,
// dtypes and beta; OpenBLAS cblas_sgemm as the fallback. The op layer checks
// arguments and lays the operands out as described by GemmArgs.
#ifndef TENSOR_CPU_MATMUL_H_
#define TENSOR_CPU_MATMUL_H_

#include <cstdint>
#include <string>

#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace tensor {
namespace cpu {

// One operand of a batched GEMM: a stack of strided matrices. Element
// (batch index i..., row r, col c) is at
//   data + sum_d(i_d * batch_strides[d]) + r * row_stride + c * col_stride
// (in elements). A batch stride of 0 broadcasts the operand over that batch dim.
struct GemmOperand {
  void* data = nullptr;
  Dims batch_strides;  // one per GemmArgs::batch dim
  int64_t row_stride = 0;
  int64_t col_stride = 0;
};

// c = a @ b + beta * c over the batch: a (batch..., m, k), b (batch..., k, n),
// c (batch..., m, n). Requirements (the op layer guarantees them):
//  - m, n, k > 0 and every batch dim > 0;
//  - a and b have dtype in_dtype (f32 or bf16); c has out_dtype (in_dtype, or
//    f32 for bf16 inputs);
//  - a and b are GemmFriendly (a unit stride along rows or columns); c is row
//    major (col_stride 1, row_stride >= n) and no two of its elements share
//    an address (batch items may interleave: heads in a (B, T, nh * hs)
//    buffer);
//  - c does not overlap a or b. With beta == 0, c is only written (NaNs in it
//    are ignored).
struct GemmArgs {
  Dtype in_dtype = Dtype::kF32;
  Dtype out_dtype = Dtype::kF32;
  Dims batch;  // may be empty
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  GemmOperand a;
  GemmOperand b;
  GemmOperand c;
  float beta = 0.0f;
  // Optional: n contiguous values of bias_dtype (f32 or bf16) added to every
  // row of the product before beta * c: c = a @ b + bias + beta * c (oneDNN's
  // bias argument: the sum is rounded to out_dtype once).
  const void* bias = nullptr;
  Dtype bias_dtype = Dtype::kF32;
};

// Whether a rows x cols matrix with these strides can be handed to the GEMM
// libraries as is: row major with leading dimension >= cols, or column major
// with leading dimension >= rows (what BLAS and oneDNN's plain layouts
// accept). Strides of size-1 dimensions are ignored.
bool GemmFriendly(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);

// Runs the GEMM on the current backend. Thread-safe: ranks running as threads
// may call it at once.
void Gemm(const GemmArgs& args);

// Which library runs GEMMs.
//  kOneDnn (default): oneDNN; when oneDNN cannot build a fast primitive (no
//    AVX-512 bf16 support, an unsupported layout) the call falls back to
//    OpenBLAS (bf16 operands converted to f32 first).
//  kOpenBlas: always OpenBLAS (environment FSDP_GEMM=openblas at startup).
enum class GemmBackend { kOneDnn, kOpenBlas };
GemmBackend GetGemmBackend();
void SetGemmBackend(GemmBackend backend);

// What ran the calling thread's last GEMM: "onednn:<implementation>" (e.g.
// "onednn:brg:avx512_core_amx_bf16") or "openblas". Empty before the first.
// For tests and benchmarks.
std::string LastGemmPath();

// The oneDNN primitive cache: entries now, and lookups that hit or missed.
struct GemmCacheStats {
  int64_t entries = 0;
  int64_t hits = 0;
  int64_t misses = 0;
};
GemmCacheStats GetGemmCacheStats();
// Most primitives kept; the least recently used one is dropped beyond it.
inline constexpr int64_t kGemmCacheCapacity = 512;

}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_MATMUL_H_
