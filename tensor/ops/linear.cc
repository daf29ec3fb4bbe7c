// The Linear layer's GEMMs with their bias and GELU fused in (linear.h).
#include "tensor/ops/linear.h"

#include <cstdint>

#include "tensor/cpu/matmul.h"
#include "tensor/cuda/matmul.h"
#include "tensor/ops/check.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"

namespace tensor {
namespace {

constexpr char kOp[] = "linear";

// x (N, K), w (M, K) and bias (M) of one dtype and device; an undefined bias
// passes when `optional_bias`.
void CheckArgs(const Tensor& x, const Tensor& w, const Tensor& bias, bool optional_bias = false) {
  const bool has_bias = bias.defined();
  OP_CHECK(x.defined() && w.defined() && (has_bias || optional_bias), kOp,
           "got an undefined tensor");
  OP_CHECK(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1) &&
               (!has_bias || (bias.rank() == 1 && bias.dim(0) == w.dim(0))),
           kOp, "expected x (N, K), w (M, K) and bias (M); got x ", x.shape().ToString(), ", w ",
           w.shape().ToString(), " and bias ", has_bias ? bias.shape().ToString() : "none");
  OP_CHECK(x.dtype() == w.dtype() && (!has_bias || bias.dtype() == w.dtype()), kOp,
           "dtypes differ: x ", DtypeName(x.dtype()), ", w ", DtypeName(w.dtype()), ", bias ",
           has_bias ? DtypeName(bias.dtype()) : "none", "; convert them with To()");
  OP_CHECK(x.device() == w.device() && (!has_bias || bias.device() == w.device()), kOp,
           "devices differ: x on ", x.device().ToString(), ", w on ", w.device().ToString(),
           ", bias on ", has_bias ? bias.device().ToString() : "none");
}

// Whether a 2-D view is a GEMM operand as its strides stand.
bool GemmFriendly(const Tensor& t) {
  return cpu::GemmFriendly(t.dim(0), t.dim(1), t.strides()[0], t.strides()[1]);
}

// A 2-D tensor as a GEMM operand of either backend (cpu:: or cuda::GemmOperand).
template <typename GemmOperand>
GemmOperand Operand(const Tensor& t) {
  GemmOperand o;
  o.data = t.raw_data();
  o.row_stride = t.strides()[0];
  o.col_stride = t.strides()[1];
  return o;
}

// out (m, n) = a (m, k) @ b (k, n) of 2-D views as either backend's
// arguments (cpu:: or cuda::GemmArgs); the rest left at their defaults.
template <typename GemmArgs>
GemmArgs GemmOf(const Tensor& a, const Tensor& b, const Tensor& out) {
  using GemmOperand = decltype(GemmArgs::a);
  GemmArgs g;
  g.in_dtype = a.dtype();
  g.out_dtype = out.dtype();
  g.m = a.dim(0);
  g.n = b.dim(1);
  g.k = a.dim(1);
  g.a = Operand<GemmOperand>(a);
  g.b = Operand<GemmOperand>(b);
  g.c = Operand<GemmOperand>(out);
  return g;
}

// out = a @ b (+ beta out) with cuBLASLt's epilogue `e` (its vectors set by
// the caller); false when it cannot be fused (nothing was written).
bool FusedOnCuda(const Tensor& a, const Tensor& b, const Tensor& out,
                 const cuda::GemmEpilogueArgs& e, float beta = 0.0f) {
  if (!out.device().is_cuda() || out.numel() == 0 || a.dim(1) == 0) return false;
  if (!GemmFriendly(a) || !GemmFriendly(b)) return false;
  cuda::GemmArgs g = GemmOf<cuda::GemmArgs>(a, b, out);
  g.device = out.device().index;
  g.beta = beta;
  return cuda::GemmWithEpilogue(g, e);
}

// x (N, K) @ w (M, K)^T + bias (M) -> (N, M) in one CPU GEMM (oneDNN's bias
// argument; the OpenBLAS fallback adds it before rounding too); undefined
// when it cannot run so (nothing is allocated then).
Tensor BiasGemmOnCpu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Tensor wt = w.Transpose(0, 1);  // (K, M)
  if (!w.device().is_cpu() || x.dim(0) == 0 || w.dim(0) == 0 || x.dim(1) == 0 ||
      !bias.is_contiguous() || (x.dtype() != Dtype::kF32 && x.dtype() != Dtype::kBF16) ||
      !GemmFriendly(x) || !GemmFriendly(wt)) {
    return Tensor();
  }
  Tensor out = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
  cpu::GemmArgs g = GemmOf<cpu::GemmArgs>(x, wt, out);
  g.bias = bias.raw_data();
  g.bias_dtype = bias.dtype();
  cpu::Gemm(g);
  return out;
}

// out = x @ w^T + bias, and for kGeluAuxBias aux = that sum and out = its GELU.
bool FusedLinearOnCuda(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                       cuda::GemmEpilogue kind, const Tensor& aux) {
  if (!bias.is_contiguous()) return false;
  cuda::GemmEpilogueArgs e;
  e.kind = kind;
  e.bias = bias.raw_data();
  if (aux.defined()) {
    e.aux = aux.raw_data();
    e.aux_ld = aux.strides()[0];
  }
  return FusedOnCuda(x, w.Transpose(0, 1), out, e);
}

}  // namespace

Tensor LinearForward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  CheckArgs(x, w, bias);
  if (w.device().is_cuda()) {
    Tensor out = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    if (FusedLinearOnCuda(x, w, bias, out, cuda::GemmEpilogue::kBias, Tensor())) return out;
  }
  if (Tensor out = BiasGemmOnCpu(x, w, bias); out.defined()) return out;
  MatmulOptions opts;
  opts.trans_b = true;
  return AddBias(Matmul(x, w, opts), bias);
}

Tensor LinearResidualForward(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& residual) {
  CheckArgs(x, w, bias, /*optional_bias=*/true);
  OP_CHECK(residual.defined() && residual.rank() == 2 && residual.dim(0) == x.dim(0) &&
               residual.dim(1) == w.dim(0),
           kOp, "expected the residual (", x.dim(0), ", ", w.dim(0), "); got ",
           residual.defined() ? residual.shape().ToString() : "undefined");
  OP_CHECK(residual.dtype() == w.dtype() && residual.device() == w.device(), kOp,
           "the residual is ", DtypeName(residual.dtype()), " on ", residual.device().ToString(),
           ", the weight ", DtypeName(w.dtype()), " on ", w.device().ToString());
  if (w.device().is_cuda() && residual.is_contiguous() &&
      (!bias.defined() || bias.is_contiguous())) {
    Tensor out = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    cuda::GemmEpilogueArgs e;
    e.kind = bias.defined() ? cuda::GemmEpilogue::kBias : cuda::GemmEpilogue::kNone;
    if (bias.defined()) e.bias = bias.raw_data();
    e.residual = residual.raw_data();
    if (FusedOnCuda(x, w.Transpose(0, 1), out, e)) return out;
  }
  // out = residual (+ bias) (N, M), then out += x @ w^T in the GEMM.
  Tensor out = bias.defined() ? AddBias(residual, bias) : residual.Clone();
  MatmulOptions opts;
  opts.trans_b = true;
  MatmulInto(x, w, out, opts, /*beta=*/1.0f);
  return out;
}

LinearGeluResult LinearGeluForward(const Tensor& x, const Tensor& w, const Tensor& bias) {
  CheckArgs(x, w, bias);
  LinearGeluResult r;
  if (w.device().is_cuda()) {
    r.out = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    r.pre = Tensor::Empty({x.dim(0), w.dim(0)}, w.dtype(), w.device());  // (N, M)
    if (FusedLinearOnCuda(x, w, bias, r.out, cuda::GemmEpilogue::kGeluAuxBias, r.pre)) return r;
    r = LinearGeluResult();  // not fused: give the buffers back first
  }
  r.pre = BiasGemmOnCpu(x, w, bias);  // (N, M)
  if (!r.pre.defined()) {
    MatmulOptions opts;
    opts.trans_b = true;
    r.pre = AddBias(Matmul(x, w, opts), bias);
  }
  r.out = Gelu(r.pre);
  return r;
}

Tensor LinearGeluInputGrad(const Tensor& grad_y, const Tensor& w, const Tensor& pre,
                           Tensor* pre_bias_grad) {
  constexpr char kGradOp[] = "linear_gelu_input_grad";
  OP_CHECK(grad_y.defined() && w.defined() && pre.defined(), kGradOp, "got an undefined tensor");
  OP_CHECK(grad_y.rank() == 2 && w.rank() == 2 && pre.rank() == 2 && grad_y.dim(1) == w.dim(0) &&
               pre.dim(0) == grad_y.dim(0) && pre.dim(1) == w.dim(1),
           kGradOp, "expected grad_y (N, M), w (M, K) and pre (N, K); got grad_y ",
           grad_y.shape().ToString(), ", w ", w.shape().ToString(), " and pre ",
           pre.shape().ToString());
  OP_CHECK(grad_y.dtype() == w.dtype() && pre.dtype() == w.dtype(), kGradOp,
           "dtypes differ: grad_y ", DtypeName(grad_y.dtype()), ", w ", DtypeName(w.dtype()),
           ", pre ", DtypeName(pre.dtype()), "; convert them with To()");
  OP_CHECK(grad_y.device() == w.device() && pre.device() == w.device(), kGradOp,
           "devices differ: grad_y on ", grad_y.device().ToString(), ", w on ",
           w.device().ToString(), ", pre on ", pre.device().ToString());
  if (pre_bias_grad != nullptr) *pre_bias_grad = Tensor();
  if (w.device().is_cuda() && pre.strides()[1] == 1) {
    Tensor out = Tensor::Empty({pre.dim(0), pre.dim(1)}, w.dtype(), w.device());  // (N, K)
    cuda::GemmEpilogueArgs e;
    e.kind = cuda::GemmEpilogue::kDGelu;
    e.aux = pre.raw_data();  // read only
    e.aux_ld = pre.strides()[0];
    if (pre_bias_grad != nullptr && cuda::MatmulDGeluBiasGrad()) {
      Tensor db = Tensor::Empty({pre.dim(1)}, Dtype::kF32, w.device());  // (K)
      e.kind = cuda::GemmEpilogue::kDGeluBiasGrad;
      e.bias_grad = db.raw_data();
      if (FusedOnCuda(grad_y, w, out, e)) {
        *pre_bias_grad = db;
        return out;
      }
      e.kind = cuda::GemmEpilogue::kDGelu;  // no such kernel: DGELU alone
      e.bias_grad = nullptr;
    }
    if (FusedOnCuda(grad_y, w, out, e)) return out;
  }
  return GeluBackward(Matmul(grad_y, w), pre);
}

void LinearParamGradsInto(const Tensor& g, const Tensor& x, const Tensor& grad_w,
                          const Tensor& grad_b, bool accumulate_w, bool accumulate_b) {
  constexpr char kGradOp[] = "linear_param_grads";
  OP_CHECK(g.defined() && x.defined() && grad_w.defined(), kGradOp, "got an undefined tensor");
  OP_CHECK(g.rank() == 2 && x.rank() == 2 && grad_w.rank() == 2 && g.dim(0) == x.dim(0) &&
               grad_w.dim(0) == g.dim(1) && grad_w.dim(1) == x.dim(1) &&
               (!grad_b.defined() || (grad_b.rank() == 1 && grad_b.dim(0) == g.dim(1))),
           kGradOp, "expected g (N, M), x (N, K), grad_w (M, K) and grad_b (M); got g ",
           g.shape().ToString(), ", x ", x.shape().ToString(), ", grad_w ",
           grad_w.shape().ToString(), " and grad_b ",
           grad_b.defined() ? grad_b.shape().ToString() : "undefined");
  OP_CHECK(grad_w.dtype() == Dtype::kF32 && (!grad_b.defined() || grad_b.dtype() == Dtype::kF32),
           kGradOp, "the gradients accumulate in f32; got grad_w ", DtypeName(grad_w.dtype()),
           grad_b.defined() ? absl::StrCat(" and grad_b ", DtypeName(grad_b.dtype())) : "");
  const Tensor gt = g.Transpose(0, 1);  // (M, N)
  if (grad_b.defined() && grad_w.device().is_cuda() && grad_w.dtype() == Dtype::kF32 &&
      grad_b.dtype() == Dtype::kF32 && grad_b.is_contiguous() && g.dtype() == x.dtype() &&
      g.device() == grad_w.device() && x.device() == grad_w.device() &&
      grad_b.device() == grad_w.device() && GemmFriendly(grad_w)) {
    // The epilogue overwrites its output, 16-byte aligned: grad_b itself, or
    // a temporary (M) then added to grad_b (or copied, into a view of a flat
    // buffer at an offset cuBLASLt cannot take).
    const bool direct =
        !accumulate_b && reinterpret_cast<std::uintptr_t>(grad_b.raw_data()) % 16 == 0;
    const Tensor db = direct ? grad_b : Tensor::Empty({g.dim(1)}, Dtype::kF32, grad_w.device());
    cuda::GemmEpilogueArgs e;
    e.kind = cuda::GemmEpilogue::kBiasGradA;
    e.bias_grad = db.raw_data();
    if (FusedOnCuda(gt, x, grad_w, e, /*beta=*/accumulate_w ? 1.0f : 0.0f)) {
      if (accumulate_b) {
        AddInPlace(grad_b, db);
      } else if (!direct) {
        Tensor out = grad_b;  // a handle: writes grad_b's storage
        out.CopyFrom(db);
      }
      return;
    }
  }
  MatmulOptions opts;
  opts.trans_a = true;
  MatmulInto(g, x, grad_w, opts, /*beta=*/accumulate_w ? 1.0f : 0.0f);
  if (grad_b.defined()) AddBiasBackwardInto(g, grad_b, accumulate_b);
}

}  // namespace tensor
