// CUDA GEMM kernels behind tensor::Matmul (tensor/ops/matmul.h): cuBLASLt
// matmuls in f32, bf16 and f16 with fp32 accumulation, the descriptors, layouts
// and heuristic's algorithm cached by shape, strides, dtypes and alignment (the
// CUDA twin of tensor/cpu/matmul.h). The op layer checks arguments and lays
// the operands out as GemmArgs; see common.cuh for the backend conventions.
//
// Row-major operands through a column-major library. cuBLASLt reads every
// matrix column major: X (rows x cols, leading dimension ld) has X(i, j) at
// i + j * ld. Our row-major C (m x n, row stride ldc) has C(r, c) at
// r * ldc + c, which is exactly the column-major matrix C^T (n x m, ld ldc).
// Since C^T = B^T A^T, we ask cuBLASLt for D = op(A') op(B') with
//   A' = our b, read as an n x k operand (op(A') = b^T),
//   B' = our a, read as a k x m operand (op(B') = a^T),
//   D = C = our c, column-major n x m with ld = ldc,
// i.e. the operands are swapped and cuBLASLt's (m, n) is our (n, m). Each
// operand chooses its own transpose flag from its strides:
//   b row major (col stride 1, ld = row stride): its memory already is the
//     column-major n x k matrix b^T, so A' is (n x k, ld), op N;
//   b column major (row stride 1, ld = col stride): its memory is the
//     column-major k x n matrix b, so A' is (k x n, ld), op T;
//   a row major: memory = column-major k x m a^T, B' is (k x m, ld), op N;
//   a column major: memory = column-major m x k a, B' is (m x k, ld), op T.
// So transposed views (Matmul's trans_a / trans_b, x.Transpose(-1, -2)) cost
// nothing: they only flip a flag. c must be row major (the op's output, or a
// view MatmulInto was given: batch items may interleave, e.g. heads in a
// (B, T, nh * hs) buffer, but never overlap).
//
// Batches: after the op layer merged uniform batch dims, the last batch dim
// becomes cuBLASLt's strided batch (CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT and
// STRIDED_BATCH_OFFSET; a stride of 0 broadcasts a or b) and any earlier batch
// dims (strides that could not be merged) are looped over on the host.
#ifndef TENSOR_CUDA_MATMUL_H_
#define TENSOR_CUDA_MATMUL_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tensor/dtype.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// One operand of a batched GEMM: a stack of strided matrices on the GPU.
// Element (batch index i..., row r, col c) is at
//   data + sum_d(i_d * batch_strides[d]) + r * row_stride + c * col_stride
// (in elements). A batch stride of 0 broadcasts the operand over that dim.
struct GemmOperand {
  void* data = nullptr;
  Dims batch_strides;  // one per GemmArgs::batch dim
  int64_t row_stride = 0;
  int64_t col_stride = 0;
};

// c = a @ b + beta * c over the batch on cuda:device: a (batch..., m, k),
// b (batch..., k, n), c (batch..., m, n). Requirements (the op layer
// guarantees them, as for cpu::GemmArgs):
//  - m, n, k > 0 and every batch dim > 0;
//  - a and b have dtype in_dtype (f32, bf16 or f16); c has out_dtype
//    (in_dtype, or f32 for bf16 / f16 inputs);
//  - a and b are GemmFriendly (tensor/cpu/matmul.h: a unit stride along rows
//    or columns, leading dimension large enough); c is row major (col_stride
//    1, row_stride >= n) and never broadcast;
//  - c does not overlap a or b. With beta == 0, c is only written (NaNs in it
//    are ignored).
struct GemmArgs {
  int device = 0;
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
};

// Runs the GEMM with cuBLASLt on the calling thread's stream (asynchronous).
// Each (device, thread) has its own cuBLASLt handle and a 32 MiB workspace
// (from the device's caching allocator, not charged to the memory ledger,
// returned when the thread exits). Throws OpError("[matmul] ...") when
// cuBLASLt has no algorithm for the case or fails.
void Gemm(const GemmArgs& args);

// A cuBLASLt epilogue fused into a GEMM, so its output is written once:
//   kBias:        c = a @ b + bias
//   kGeluAuxBias: aux = a @ b + bias, c = gelu(aux) (the tanh form)
//   kDGelu:       c = gelu'(aux) * (a @ b): the GELU's backward, aux (read)
//                 holding the GELU's input
//   kBiasGradA:   c = a @ b (+ beta c), and bias_grad (m) = a's sums over k:
//                 a Linear layer's weight and bias gradients in one pass over
//                 its output gradient (a = g^T) (cuBLASLt's BGRADB, its B
//                 being our a); bias_grad is written, not accumulated
//   kDGeluBiasGrad: kDGelu, and bias_grad (n) = c's column sums, f32 whatever
//                 c's dtype: the GELU's backward and the bias gradient of the
//                 layer whose output was the GELU's input, out of one GEMM
//                 (cuBLASLt's DGELU_BGRAD); bias_grad is written
// bias (n) and bias_grad (m, or n for kDGeluBiasGrad) are contiguous; aux is
// (m, n), row major with rows aux_ld apart. All have c's dtype (out_dtype),
// but kDGeluBiasGrad's bias_grad.
// A residual (kNone or kBias only): c = a @ b (+ bias) + residual, the
// residual being cuBLASLt's C and c its D (D = A B + 1 * C, C != D): a
// Linear layer's output added to a transformer's residual stream in one
// write. residual (m, n) is laid out as c (row major, c's row stride) and
// does not overlap c, a or b.
enum class GemmEpilogue { kNone, kBias, kGeluAuxBias, kDGelu, kBiasGradA, kDGeluBiasGrad };
struct GemmEpilogueArgs {
  GemmEpilogue kind = GemmEpilogue::kNone;
  const void* bias = nullptr;      // kBias and kGeluAuxBias
  void* aux = nullptr;             // kGeluAuxBias (written), kDGelu[BiasGrad] (read)
  int64_t aux_ld = 0;              // elements
  void* bias_grad = nullptr;       // kBiasGradA and kDGeluBiasGrad (written)
  const void* residual = nullptr;  // kNone or kBias (read); nullptr: none
};

// Gemm with the epilogue (kNone only with a residual), for an unbatched GEMM
// (args.batch empty) with beta 0 (any beta for kBiasGradA). Returns false, having queued nothing,
// when it cannot be fused: fusing is switched off (SetMatmulFuseEpilogues), aux_ld is not a
// multiple of 8 (cuBLASLt's rule), bias, aux or bias_grad is not 16-byte aligned (e.g. a view into
// a flat FSDP buffer), or cuBLASLt has no algorithm for the case (the answer is cached with the
// descriptors). The caller then runs Gemm and adds the bias (and GELU) itself. Descriptors of fused
// GEMMs are cached per thread: the bias and aux pointers are set on them at each call.
bool GemmWithEpilogue(const GemmArgs& args, const GemmEpilogueArgs& epilogue);

// Whether GemmWithEpilogue fuses at all (default on; environment
// FSDP_CUDA_FUSE_EPILOGUES=0 at startup turns it off): for comparing the
// fused and unfused paths.
void SetMatmulFuseEpilogues(bool fuse);
bool MatmulFuseEpilogues();

// Whether GemmWithEpilogue fuses kBiasGradA (default on; environment
// FSDP_CUDA_BIAS_GRAD_EPILOGUE=0 at startup turns it off): off, a Linear
// layer's bias gradient is the weight-gradient GEMM's plain product and then
// the column-sum kernel (tensor/cuda/reduce.h, 16-byte loads), a second read
// of the output gradient. On the H200 cuBLASLt's BGRADB ran its own reduction
// kernel after the GEMM (globalKernelBgradAB, 4.6% of a gpt2 step): this
// switch times the two ways (matmul_benchmark's dW+db rows,
// tools/bench_vs_pytorch.py --bias_grad_unfused).
void SetMatmulFuseBiasGrad(bool fuse);
bool MatmulFuseBiasGrad();

// Whether the backward of a Linear layer followed by a GELU (LinearGeluInputGrad,
// the MLP's c_proj) also returns the bias gradient of the GELU's input layer
// (c_fc) out of its GEMM's epilogue (kDGeluBiasGrad), so that c_fc's weight
// gradient is a plain GEMM, without cuBLASLt's separate reduction over its
// output gradient (BGRADB's globalKernelBgradAB, which read gpt2's 100 MB a
// layer of c_fc gradient a second time on the H200). Default off, not yet timed
// on a GPU; environment FSDP_CUDA_DGELU_BIAS_GRAD=1 at startup turns it on
// (matmul_benchmark's last table times the two ways; tools/bench_vs_pytorch.py
// --dgelu_bias_grad times gpt2 with it).
void SetMatmulDGeluBiasGrad(bool fuse);
bool MatmulDGeluBiasGrad();

// out = beta * out (zeros when beta == 0, whatever out held): the product of
// an empty K. out is contiguous.
void MatmulScale(const Tensor& out, float beta);

// f32 inputs: TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32, 10-bit
// mantissa products, fp32 accumulation) when allowed; exact fp32
// (CUBLAS_COMPUTE_32F) by default. Environment FSDP_CUDA_TF32=1 at startup
// allows it. bf16 and f16 inputs always use tensor cores with fp32
// accumulation (CUBLAS_COMPUTE_32F).
void SetMatmulAllowTf32(bool allow);
bool MatmulAllowTf32();

// GEMM tuning, as PyTorch's TunableOp does for its GEMMs; off by default
// (environment FSDP_CUDA_GEMM_TUNE=1 at startup turns it on). When on, the
// first call of each cached GEMM (shape, strides, dtypes, alignment,
// epilogue) asks cuBLASLt's heuristic for up to kGemmTuneCandidates
// algorithms, times each on the call's own operands (one warm-up, then 3
// runs, writing a scratch copy of C: C and beta's accumulation are left
// alone) and keeps the fastest for every later call of that entry. Costs one
// host wait and a few GEMMs per new entry (the first steps of training) and
// a scratch buffer the size of C while it runs. Another algorithm may split K
// differently: results can differ from the untuned one's in the last bits,
// and between runs, since the choice is timed. Entries cached before the
// switch keep their algorithm.
inline constexpr int kGemmTuneCandidates = 8;
void SetMatmulTuning(bool tune);
bool MatmulTuning();

// The cache of descriptors and heuristic results: entries now, and lookups
// that hit or missed. Shared by all threads and devices (keyed by device).
// Also: GemmWithEpilogue calls that fused, and those that returned false;
// entries tuned (more than one candidate timed), and how many of those run
// another algorithm than the heuristic's first.
struct MatmulCacheStats {
  int64_t entries = 0;
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t epilogues_fused = 0;
  int64_t epilogues_unfused = 0;
  int64_t tuned = 0;
  int64_t tuned_other_than_first = 0;
};
MatmulCacheStats GetMatmulCacheStats();
inline constexpr int64_t kMatmulCacheCapacity = 512;
inline constexpr int64_t kMatmulWorkspaceBytes = int64_t{32} << 20;

// ---------------------------------------------------------------------------
// The host-side plan (pure C++, no CUDA calls; tested without a GPU in
// matmul_test.cc). Defined in matmul.cu, so only in --config=cuda builds.
// ---------------------------------------------------------------------------

// One matrix as cuBLASLt is told about it: stored column major as
// rows x cols with leading dimension ld, used transposed when `trans`
// (CUBLASLT_MATMUL_DESC_TRANSA / TRANSB; always false for C).
struct LtMatrix {
  bool trans = false;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  int64_t batch_stride = 0;  // elements between items of the strided batch
};

// The cuBLASLt call(s) for one GemmArgs. cuBLASLt's m / n are our n / m.
struct LtPlan {
  int64_t m = 0;  // = args.n
  int64_t n = 0;  // = args.m
  int64_t k = 0;
  LtMatrix a;         // cuBLASLt's A: our b
  LtMatrix b;         // cuBLASLt's B: our a
  LtMatrix c;         // cuBLASLt's C and D: our c
  int64_t batch = 1;  // cuBLASLt's strided batch count (our last batch dim)
  // Earlier batch dims, looped over on the host, and each operand's strides
  // along them (elements, in our a / b / c terms).
  Dims outer;
  Dims outer_a;
  Dims outer_b;
  Dims outer_c;
};

// Builds the plan; false (with *why set) when an operand is not GEMM-friendly
// or c is not row major, i.e. when the op layer broke its promise.
bool MakeLtPlan(const GemmArgs& args, LtPlan* plan, std::string* why);

// The largest power of two (at most 256) dividing the byte address `ptr` and
// every byte offset in `offsets`: the alignment cuBLASLt may assume for a
// matrix whose batch items start at ptr + offsets.
int AlignmentBytes(const void* ptr, std::initializer_list<int64_t> offsets);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_MATMUL_H_
