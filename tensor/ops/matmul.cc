// Matmul op layer: argument checks, output allocation, the operands laid out as
// one strided batched GEMM (batch dims collapsed, the batch folded into M when
// b is broadcast) for the CPU kernels (cpu/matmul.h) or cuBLASLt on a CUDA
// device (cuda/matmul.h), and the backward built from forward matmuls.
#include "tensor/ops/matmul.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/matmul.h"
#include "tensor/cuda/matmul.h"
#include "tensor/ops/check.h"

namespace tensor {
namespace {

constexpr char kOp[] = "matmul";

// What a valid Matmul call produces.
struct Plan {
  Shape out_shape;  // (batch..., M, N)
  Dtype out_dtype = Dtype::kF32;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

// "shapes (2,3) and (4,5)" plus the trans flags, for error messages.
std::string ShapesText(const Tensor& a, const Tensor& b, const MatmulOptions& opts) {
  std::string s = absl::StrCat("shapes ", a.shape().ToString(), " and ", b.shape().ToString());
  if (opts.trans_a && opts.trans_b) {
    absl::StrAppend(&s, " with trans_a and trans_b");
  } else if (opts.trans_a) {
    absl::StrAppend(&s, " with trans_a");
  } else if (opts.trans_b) {
    absl::StrAppend(&s, " with trans_b");
  }
  return s;
}

// All dims of t but the last two.
Shape BatchDims(const Tensor& t) {
  Shape s;
  for (int i = 0; i + 2 < t.rank(); ++i) s.push_back(t.dim(i));
  return s;
}

// Both operands on the CPU, or both on one CUDA device.
void CheckDevices(const Tensor& a, const Tensor& b, const std::string& shapes) {
  OP_CHECK(a.defined() && b.defined(), kOp, "got an undefined tensor");
  if (a.device().is_cuda() || b.device().is_cuda()) {
    OP_CHECK(a.device() == b.device(), kOp, shapes, " cannot be multiplied: operands are on ",
             a.device().ToString(), " and ", b.device().ToString(), "; move both to one device");
    return;
  }
  CheckCpu(kOp, {&a, &b});
}

Plan MakePlan(const Tensor& a, const Tensor& b, const MatmulOptions& opts) {
  const std::string shapes = ShapesText(a, b, opts);
  CheckDevices(a, b, shapes);
  const bool on_cuda = a.device().is_cuda();
  OP_CHECK(a.rank() >= 2 && b.rank() >= 2, kOp, shapes,
           " cannot be multiplied: both operands need at least 2 dimensions (got rank ", a.rank(),
           " and ", b.rank(), ")");
  OP_CHECK(a.dtype() == b.dtype(), kOp, shapes, " cannot be multiplied: dtypes ",
           DtypeName(a.dtype()), " and ", DtypeName(b.dtype()),
           " differ; convert one with To() (both f32, or both bf16)");
  // f16 has tensor-core GEMMs on CUDA only (the CPU libraries have none).
  OP_CHECK(a.dtype() == Dtype::kF32 || a.dtype() == Dtype::kBF16 ||
               (on_cuda && a.dtype() == Dtype::kF16),
           kOp, shapes, " cannot be multiplied: dtype ", DtypeName(a.dtype()), " is not supported",
           on_cuda ? " on CUDA" : "",
           on_cuda ? "; expected f32, bf16 or f16" : "; expected f32 or bf16");
  Plan p;
  p.out_dtype = opts.out_dtype.value_or(a.dtype());
  OP_CHECK(p.out_dtype == a.dtype() || (a.dtype() != Dtype::kF32 && p.out_dtype == Dtype::kF32),
           kOp, shapes, ": output dtype ", DtypeName(p.out_dtype), " is not supported for ",
           DtypeName(a.dtype()), " inputs; expected ",
           a.dtype() == Dtype::kF32 ? "f32" : absl::StrCat(DtypeName(a.dtype()), " or f32"));
  p.m = a.dim(opts.trans_a ? -1 : -2);
  p.k = a.dim(opts.trans_a ? -2 : -1);
  const int64_t k_b = b.dim(opts.trans_b ? -1 : -2);
  p.n = b.dim(opts.trans_b ? -2 : -1);
  OP_CHECK(p.k == k_b, kOp, shapes, " cannot be multiplied: inner dimensions ", p.k, " and ", k_b,
           " differ");
  const Shape batch_a = BatchDims(a);
  const Shape batch_b = BatchDims(b);
  if (a.rank() > 2 && b.rank() > 2) {
    OP_CHECK(batch_a == batch_b, kOp, shapes, " cannot be multiplied: batch dimensions ",
             batch_a.ToString(), " and ", batch_b.ToString(),
             " differ (they must match, or one operand must be 2-D)");
  }
  p.out_shape = a.rank() > 2 ? batch_a : batch_b;
  p.out_shape.push_back(p.m);
  p.out_shape.push_back(p.n);
  return p;
}

// Whether the elements of x and y share any bytes.
bool Overlaps(const Tensor& x, const Tensor& y) {
  if (!x.SharesStorageWith(y) || x.numel() == 0 || y.numel() == 0) return false;
  auto range = [](const Tensor& t, int64_t* lo, int64_t* hi) {
    int64_t last = t.offset();
    for (int i = 0; i < t.rank(); ++i) last += (t.dim(i) - 1) * t.strides()[i];
    *lo = t.offset() * t.element_size();
    *hi = (last + 1) * t.element_size();
  };
  int64_t x_lo, x_hi, y_lo, y_hi;
  range(x, &x_lo, &x_hi);
  range(y, &y_lo, &y_hi);
  return x_lo < y_hi && y_lo < x_hi;
}

// Whether the GEMM can write `out` where it lies: a unit stride in the last
// dim (or one column), and no element reached twice: the dims of size > 1,
// taken by increasing stride, each step over everything the dims before them
// span. Contiguous tensors, row-padded views and heads interleaved in a
// (B, T, nh * hs) buffer viewed as (B, nh, T, hs) all are.
bool GemmWritable(const Tensor& out) {
  if (out.rank() < 2 || (out.dim(-1) != 1 && out.strides()[out.rank() - 1] != 1)) return false;
  if (out.numel() == 0) return true;  // nothing is written (its strides may be anything)
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (int d = 0; d < out.rank(); ++d) {
    if (out.dim(d) > 1) dims.emplace_back(out.strides()[d], out.dim(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dims so far
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span += stride * (size - 1);
  }
  return true;
}

// out = beta * out (beta == 0: zeros, whatever out held): the K == 0 product.
void ScaleInPlace(const Tensor& out, float beta) {
  const int64_t n = out.numel();
  if (out.dtype() == Dtype::kF32) {
    float* p = out.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = beta == 0.0f ? 0.0f : beta * p[i];
  } else {
    bf16* p = out.data<bf16>();
    for (int64_t i = 0; i < n; ++i) {
      p[i] = FloatToBf16(beta == 0.0f ? 0.0f : beta * Bf16ToFloat(p[i]));
    }
  }
}

// The GEMM for cuBLASLt: the same description, on cuda:device.
cuda::GemmArgs ToCuda(const cpu::GemmArgs& g, int device) {
  auto operand = [](const cpu::GemmOperand& op) {
    cuda::GemmOperand o;
    o.data = op.data;
    o.batch_strides = op.batch_strides;
    o.row_stride = op.row_stride;
    o.col_stride = op.col_stride;
    return o;
  };
  cuda::GemmArgs c;
  c.device = device;
  c.in_dtype = g.in_dtype;
  c.out_dtype = g.out_dtype;
  c.batch = g.batch;
  c.m = g.m;
  c.n = g.n;
  c.k = g.k;
  c.a = operand(g.a);
  c.b = operand(g.b);
  c.c = operand(g.c);
  c.beta = g.beta;
  return c;
}

// The last two dims of t as a GEMM operand over `batch_rank` batch dims of
// the output; a 2-D t is broadcast (batch strides 0).
cpu::GemmOperand Operand(const Tensor& t, int batch_rank) {
  cpu::GemmOperand op;
  op.data = t.raw_data();
  op.batch_strides.assign(batch_rank, 0);
  if (t.rank() > 2) {
    for (int d = 0; d < batch_rank; ++d) op.batch_strides[d] = t.strides()[d];
  }
  op.row_stride = t.strides()[t.rank() - 2];
  op.col_stride = t.strides()[t.rank() - 1];
  return op;
}

// Drops size-1 batch dims and merges neighbouring batch dims that every
// operand steps through uniformly, so contiguous inputs give one batch dim.
void CollapseBatch(cpu::GemmArgs* g) {
  cpu::GemmOperand* ops[3] = {&g->a, &g->b, &g->c};
  Dims batch;
  Dims strides[3];
  for (size_t d = 0; d < g->batch.size(); ++d) {
    const int64_t size = g->batch[d];
    if (size == 1) continue;
    bool merge = !batch.empty();
    for (int i = 0; i < 3 && merge; ++i) {
      merge = strides[i].back() == ops[i]->batch_strides[d] * size;
    }
    if (merge) {
      batch.back() *= size;
      for (int i = 0; i < 3; ++i) strides[i].back() = ops[i]->batch_strides[d];
    } else {
      batch.push_back(size);
      for (int i = 0; i < 3; ++i) strides[i].push_back(ops[i]->batch_strides[d]);
    }
  }
  g->batch = batch;
  for (int i = 0; i < 3; ++i) ops[i]->batch_strides = strides[i];
}

// When b is the same matrix for every batch item and a's and c's batch
// items are stacked rows, the batched GEMM is one GEMM with batch * M rows:
// the Linear layer x (B, T, C) @ W^T becomes one (B*T, C) @ (C, N).
void FoldBatchIntoM(cpu::GemmArgs* g) {
  if (g->batch.size() != 1 || g->b.batch_strides[0] != 0 || g->a.batch_strides[0] == 0) return;
  const int64_t count = g->batch[0];
  // With M == 1 the row stride is free: the batch stride becomes it.
  const int64_t a_rows = g->m == 1 ? g->a.batch_strides[0] : g->a.row_stride;
  const int64_t c_rows = g->m == 1 ? g->c.batch_strides[0] : g->c.row_stride;
  if (g->a.batch_strides[0] != g->m * a_rows || g->c.batch_strides[0] != g->m * c_rows) return;
  if (!cpu::GemmFriendly(count * g->m, g->k, a_rows, g->a.col_stride)) return;
  g->m *= count;
  g->a.row_stride = a_rows;
  g->c.row_stride = c_rows;
  g->batch.clear();
  for (cpu::GemmOperand* op : {&g->a, &g->b, &g->c}) op->batch_strides.clear();
}

// out = op(a) @ op(b) + beta * out for a checked call; out is GemmWritable.
void Run(const Tensor& a, const Tensor& b, const Tensor& out, const MatmulOptions& opts, float beta,
         const Plan& p) {
  if (out.numel() == 0) return;
  const bool on_cuda = out.device().is_cuda();
  if (p.k == 0) {
    // out's elements may lie apart (a row-padded view, heads in a wider
    // buffer): then a contiguous copy is scaled and written back.
    const Tensor c = out.is_contiguous() ? out : out.Contiguous();
    if (on_cuda) {
      cuda::MatmulScale(c, beta);
    } else {
      ScaleInPlace(c, beta);
    }
    if (!out.is_contiguous()) Tensor(out).CopyFrom(c);  // a handle: writes out's elements
    return;
  }
  Tensor av = opts.trans_a ? a.Transpose(-1, -2) : a;  // (..., M, K)
  Tensor bv = opts.trans_b ? b.Transpose(-1, -2) : b;  // (..., K, N)
  // Strides the libraries cannot take (no unit stride in the matrix, or
  // overlapping rows): copy those operands to contiguous.
  if (!cpu::GemmFriendly(p.m, p.k, av.strides()[av.rank() - 2], av.strides()[av.rank() - 1])) {
    av = av.Contiguous();
  }
  if (!cpu::GemmFriendly(p.k, p.n, bv.strides()[bv.rank() - 2], bv.strides()[bv.rank() - 1])) {
    bv = bv.Contiguous();
  }
  const int batch_rank = out.rank() - 2;
  cpu::GemmArgs g;
  g.in_dtype = a.dtype();
  g.out_dtype = out.dtype();
  g.batch.assign(out.shape().dims().begin(), out.shape().dims().end() - 2);
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.a = Operand(av, batch_rank);
  g.b = Operand(bv, batch_rank);
  g.c = Operand(out, batch_rank);
  if (p.m == 1) g.c.row_stride = p.n;  // one row: its stride is free (the libraries want >= n)
  if (p.n == 1) g.c.col_stride = 1;    // one column: its stride is never stepped over
  g.beta = beta;
  CollapseBatch(&g);
  FoldBatchIntoM(&g);
  if (on_cuda) {
    cuda::Gemm(ToCuda(g, out.device().index));
  } else {
    cpu::Gemm(g);
  }
}

}  // namespace

Tensor Matmul(const Tensor& a, const Tensor& b, const MatmulOptions& opts) {
  const Plan p = MakePlan(a, b, opts);
  Tensor out = Tensor::Empty(p.out_shape, p.out_dtype, a.device());
  Run(a, b, out, opts, 0.0f, p);
  return out;
}

void MatmulInto(const Tensor& a, const Tensor& b, const Tensor& out, const MatmulOptions& opts,
                float beta) {
  OP_CHECK(out.defined(), kOp, "got an undefined tensor");
  OP_CHECK(!opts.out_dtype.has_value() || *opts.out_dtype == out.dtype(), kOp, "opts.out_dtype is ",
           DtypeName(opts.out_dtype.value_or(out.dtype())), " but out has dtype ",
           DtypeName(out.dtype()));
  MatmulOptions with_out = opts;
  with_out.out_dtype = out.dtype();
  const Plan p = MakePlan(a, b, with_out);
  OP_CHECK(out.device() == a.device(), kOp, "out ", out.shape().ToString(), " is on ",
           out.device().ToString(), " but the operands are on ", a.device().ToString());
  OP_CHECK(out.shape() == p.out_shape, kOp, ShapesText(a, b, opts), " give ",
           p.out_shape.ToString(), " but out has shape ", out.shape().ToString());
  OP_CHECK(GemmWritable(out), kOp, "out ", out.shape().ToString(), " with strides (",
           absl::StrJoin(out.strides(), ","), ")",
           " cannot be written by a GEMM: it needs a unit stride in its last dim and no element "
           "reached twice");
  OP_CHECK(!Overlaps(out, a) && !Overlaps(out, b), kOp, "out ", out.shape().ToString(),
           " overlaps an input (", ShapesText(a, b, opts), ")");
  Run(a, b, out, opts, beta, p);
}

MatmulGrads MatmulBackward(const Tensor& grad_out, const Tensor& a, const Tensor& b,
                           const MatmulOptions& opts) {
  const Plan p = MakePlan(a, b, opts);
  OP_CHECK(grad_out.defined(), kOp, "got an undefined tensor");
  OP_CHECK(grad_out.device() == a.device(), kOp, "grad_out is on ", grad_out.device().ToString(),
           " but the operands are on ", a.device().ToString());
  OP_CHECK(grad_out.shape() == p.out_shape, kOp, "grad_out has shape ", grad_out.shape().ToString(),
           " but ", ShapesText(a, b, opts), " give ", p.out_shape.ToString());
  CheckFloating(kOp, grad_out);
  const Tensor g = grad_out.To(a.dtype());  // (..., M, N)
  int64_t batch = 1;  // the product of the batch dims (explicit: M, N or K may be 0)
  for (int d = 0; d + 2 < p.out_shape.rank(); ++d) batch *= p.out_shape.dim(d);
  const bool ta = opts.trans_a;
  const bool tb = opts.trans_b;
  const Dtype dt = p.out_dtype;
  MatmulGrads grads;

  // d op(a) = g @ op(b)^T; a stored transposed gets its transpose op(b) @ g^T.
  if (a.rank() == 2 && b.rank() > 2) {
    // a was broadcast over b's batch: sum the per-item products, in f32.
    const Tensor g3 = g.Reshape({batch, p.m, p.n});              // (B, M, N)
    const Tensor b3 = b.Reshape({batch, b.dim(-2), b.dim(-1)});  // (B, K, N) or (B, N, K)
    const Dtype acc = Dtype::kF32;  // f32, or bf16 / f16 products summed in f32
    Tensor grad_a = g3.dim(0) == 0 ? Tensor::Zeros(a.shape(), acc, a.device())
                                   : Tensor::Empty(a.shape(), acc, a.device());
    for (int64_t i = 0; i < g3.dim(0); ++i) {
      const float beta = i == 0 ? 0.0f : 1.0f;
      if (ta) {
        MatmulInto(b3.Select(0, i), g3.Select(0, i), grad_a, {tb, true, acc}, beta);
      } else {
        MatmulInto(g3.Select(0, i), b3.Select(0, i), grad_a, {false, !tb, acc}, beta);
      }
    }
    grads.grad_a = grad_a.To(dt);
  } else if (ta) {
    grads.grad_a = Matmul(b, g, {tb, true, dt});  // (..., K, M)
  } else {
    grads.grad_a = Matmul(g, b, {false, !tb, dt});  // (..., M, K)
  }

  // d op(b) = op(a)^T @ g; b stored transposed gets g^T @ op(a).
  if (b.rank() == 2 && a.rank() > 2) {
    // b was broadcast over a's batch: one GEMM over the batch folded into M.
    const Tensor a2 = (ta ? a.Transpose(-1, -2) : a).Reshape({batch * p.m, p.k});  // (B*M, K)
    const Tensor g2 = g.Reshape({batch * p.m, p.n});                               // (B*M, N)
    grads.grad_b = tb ? Matmul(g2, a2, {true, false, dt})                 // (N, K)
                      : Matmul(a2, g2, {true, false, dt});                // (K, N)
  } else if (tb) {
    grads.grad_b = Matmul(g, a, {true, ta, dt});  // (..., N, K)
  } else {
    grads.grad_b = Matmul(a, g, {!ta, false, dt});  // (..., K, N)
  }
  return grads;
}

}  // namespace tensor
