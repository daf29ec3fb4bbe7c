#include "tensor/ops/linear.h"

#include "tensor/cpu/matmul.h"
#include "tensor/cuda/matmul.h"
#include "tensor/ops/check.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"

namespace tensor {
namespace {

constexpr char kOp[] = "linear";

void CheckArgs(const Tensor& x, const Tensor& w, const Tensor& bias) {
  OP_CHECK(x.defined() && w.defined() && bias.defined(), kOp, "got an undefined tensor");
  OP_CHECK(x.rank() == 2 && w.rank() == 2 && bias.rank() == 1 && x.dim(1) == w.dim(1) &&
               bias.dim(0) == w.dim(0),
           kOp, "expected x (N, K), w (M, K) and bias (M); got x ", x.shape().ToString(), ", w ",
           w.shape().ToString(), " and bias ", bias.shape().ToString());
  OP_CHECK(x.dtype() == w.dtype() && bias.dtype() == w.dtype(), kOp, "dtypes differ: x ",
           DtypeName(x.dtype()), ", w ", DtypeName(w.dtype()), ", bias ", DtypeName(bias.dtype()),
           "; convert them with To()");
  OP_CHECK(x.device() == w.device() && bias.device() == w.device(), kOp, "devices differ: x on ",
           x.device().ToString(), ", w on ", w.device().ToString(), ", bias on ",
           bias.device().ToString());
}

// out = x @ w^T + bias with cuBLASLt's epilogue (aux: the GELU's input, for
// kGeluAuxBias); false when it cannot be fused (nothing was written).
bool FusedOnCuda(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                 cuda::GemmEpilogue kind, const Tensor& aux) {
  if (!out.device().is_cuda() || out.numel() == 0 || x.dim(1) == 0 || !bias.is_contiguous()) {
    return false;
  }
  const Tensor wt = w.Transpose(0, 1);  // (K, M)
  if (!cpu::GemmFriendly(x.dim(0), x.dim(1), x.strides()[0], x.strides()[1]) ||
      !cpu::GemmFriendly(wt.dim(0), wt.dim(1), wt.strides()[0], wt.strides()[1])) {
    return false;
  }
  auto operand = [](const Tensor& t) {
    cuda::GemmOperand o;
    o.data = t.raw_data();
    o.row_stride = t.strides()[0];
    o.col_stride = t.strides()[1];
    return o;
  };
  cuda::GemmArgs g;
  g.device = out.device().index;
  g.in_dtype = x.dtype();
  g.out_dtype = out.dtype();
  g.m = x.dim(0);
  g.n = w.dim(0);
  g.k = x.dim(1);
  g.a = operand(x);
  g.b = operand(wt);
  g.c = operand(out);
  cuda::GemmEpilogueArgs e;
  e.kind = kind;
  e.bias = bias.raw_data();
  if (aux.defined()) {
    e.aux = aux.raw_data();
    e.aux_ld = aux.strides()[0];
  }
  return cuda::GemmWithEpilogue(g, e);
}

}  // namespace

Tensor LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  CheckArgs(x, w, bias);
  if (w.device().is_cuda()) {
    Tensor out = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    if (FusedOnCuda(x, w, bias, out, cuda::GemmEpilogue::kBias, Tensor())) return out;
  }
  MatmulOptions opts;
  opts.trans_b = true;
  return AddBias(Matmul(x, w, opts), bias);
}

LinearGeluResult LinearGeluForward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  CheckArgs(x, w, bias);
  LinearGeluResult r;
  if (w.device().is_cuda()) {
    r.out = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    r.pre = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    if (FusedOnCuda(x, w, bias, r.out, cuda::GemmEpilogue::kGeluAuxBias, r.pre)) return r;
    r = LinearGeluResult();  // not fused: give the buffers back first
  }
  MatmulOptions opts;
  opts.trans_b = true;
  r.pre = AddBias(Matmul(x, w, opts), bias);
  r.out = Gelu(r.pre);
  return r;
}

}  // namespace tensor
