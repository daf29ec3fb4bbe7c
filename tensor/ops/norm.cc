// Norm ops: argument checks, then the CUDA kernels (tensor/cuda/norm.h) for
// tensors on a GPU, or f32 parameters and the CPU kernels (tensor/cpu/norm.h).
#include "tensor/ops/norm.h"

#include <cmath>

#include "tensor/cpu/norm.h"
#include "tensor/cuda/norm.h"
#include "tensor/ops/check.h"
#include "tensor/ops/elementwise.h"

namespace tensor {
namespace {

// x's shape without the last dimension: the shape of the per-row statistics.
Shape RowsShape(const Tensor& x) {
  return Shape(absl::MakeConstSpan(x.shape().dims()).subspan(0, x.rank() - 1));
}

// t is defined and on x's device (x on the CPU: t on the CPU too).
void CheckDevice(const char* op, const Tensor& t, const Tensor& x) {
  if (!x.device().is_cuda()) return CheckCpu(op, {&t});
  OP_CHECK(t.defined(), op, "got an undefined tensor");
  OP_CHECK(t.device() == x.device(), op, "tensor ", t.shape().ToString(), " is on ",
           t.device().ToString(), " but x ", x.shape().ToString(), " is on ",
           x.device().ToString());
}

void CheckInput(const char* op, const Tensor& x, float eps) {
  OP_CHECK(x.defined(), op, "got an undefined tensor");
  CheckDevice(op, x, x);
  CheckFloating(op, x);
  OP_CHECK(x.rank() >= 1 && x.dim(-1) > 0, op,
           "x needs a non-empty last dimension to normalize over; got ", Describe("x", x));
  OP_CHECK(std::isfinite(eps) && eps >= 0.0f, op, "eps must be finite and >= 0; got ", eps);
}

// weight or bias: undefined, or (C) in f32 or x's dtype.
void CheckParam(const char* op, const char* name, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  CheckDevice(op, p, x);
  OP_CHECK(p.rank() == 1 && p.dim(0) == x.dim(-1), op, name, " ", p.shape().ToString(),
           " does not match the last dimension of x ", x.shape().ToString());
  OP_CHECK(p.dtype() == Dtype::kF32 || p.dtype() == x.dtype(), op, name, " dtype ",
           DtypeName(p.dtype()), " must be f32 or the dtype of x ", x.shape().ToString(), " ",
           DtypeName(x.dtype()));
}

// Saved statistics: (rows of x) f32.
void CheckStat(const char* op, const char* name, const Tensor& s, const Tensor& x) {
  CheckDevice(op, s, x);
  const Shape rows = RowsShape(x);
  OP_CHECK(s.shape() == rows && s.dtype() == Dtype::kF32, op, Describe(name, s),
           " does not match x ", x.shape().ToString(), ": expected ", rows.ToString(), " f32");
}

// grad_x_add: undefined, or x's shape, dtype and device; returned contiguous.
Tensor CheckedAdd(const char* op, const Tensor& add, const Tensor& x) {
  if (!add.defined()) return add;
  CheckDevice(op, add, x);
  OP_CHECK(add.shape() == x.shape() && add.dtype() == x.dtype(), op, Describe("grad_x_add", add),
           " does not match x ", x.shape().ToString(), " ", DtypeName(x.dtype()));
  return add.Contiguous();
}

// A NormGradsInto tensor: undefined, or (C) f32 contiguous on x's device.
void CheckInto(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  if (!t.defined()) return;
  CheckDevice(op, t, x);
  OP_CHECK(t.rank() == 1 && t.dim(0) == x.dim(-1) && t.dtype() == Dtype::kF32 &&
               t.is_contiguous(),
           op, "the gradient to add the ", name, "'s into must be (", x.dim(-1),
           ") f32 contiguous; got ", Describe(name, t));
}

// grad (C) f32 from the CPU kernels: added into `into` (or written, without
// `add`) when defined, else returned in the parameter's dtype.
Tensor AddOrReturn(const Tensor& grad, const Tensor& into, bool add, Dtype dtype) {
  if (into.defined()) {
    if (add) {
      AddInPlace(into, grad);
    } else {
      Tensor out = into;  // a handle: writes into's storage
      out.CopyFrom(grad);
    }
    return Tensor();
  }
  return grad.To(dtype);
}

// Undefined stays undefined (the CUDA kernels read parameters in their own
// dtype and treat absent ones as 1 / 0).
Tensor ContiguousOrUndefined(const Tensor& p) { return p.defined() ? p.Contiguous() : p; }

// p as a contiguous f32 (C) tensor, or `fill` when undefined.
Tensor ParamF32(const Tensor& p, int64_t c, double fill) {
  if (!p.defined()) return Tensor::Full({c}, fill);
  return p.To(Dtype::kF32).Contiguous();
}

}  // namespace

LayerNormResult LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  const char* op = "layer_norm";
  CheckInput(op, x, eps);
  CheckParam(op, "weight", weight, x);
  CheckParam(op, "bias", bias, x);
  if (weight.defined() && bias.defined()) {
    OP_CHECK(weight.dtype() == bias.dtype(), op, "weight and bias dtypes differ: ",
             Describe("weight", weight), " and ", Describe("bias", bias));
  }
  const int64_t c = x.dim(-1);
  LayerNormResult out;
  out.y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  out.mean = Tensor::Empty(RowsShape(x), Dtype::kF32, x.device());
  out.rstd = Tensor::Empty(RowsShape(x), Dtype::kF32, x.device());
  if (x.device().is_cuda()) {
    cuda::LayerNormForward(x.Contiguous(), ContiguousOrUndefined(weight),
                           ContiguousOrUndefined(bias), eps, out.y, out.mean, out.rstd);
    return out;
  }
  cpu::LayerNormForward(x.Contiguous(), ParamF32(weight, c, 1.0), ParamF32(bias, c, 0.0), eps,
                        out.y, out.mean, out.rstd);
  return out;
}

LayerNormGrads LayerNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& grad_x_add,
                                 const NormGradsInto& into) {
  const char* op = "layer_norm_backward";
  CheckInput(op, x, 0.0f);
  CheckDevice(op, grad_y, x);
  CheckSameShape(op, grad_y, x);
  CheckSameDtype(op, grad_y, x);
  const Tensor add = CheckedAdd(op, grad_x_add, x);
  CheckParam(op, "weight", weight, x);
  CheckStat(op, "mean", mean, x);
  CheckStat(op, "rstd", rstd, x);
  CheckInto(op, "weight", into.weight, x);
  CheckInto(op, "bias", into.bias, x);
  OP_CHECK(!into.weight.defined() || weight.defined(), op,
           "a weight gradient to add into, but no weight");
  const int64_t c = x.dim(-1);
  const Dtype param_dtype = weight.defined() ? weight.dtype() : Dtype::kF32;
  if (x.device().is_cuda()) {
    LayerNormGrads out;
    out.grad_x = Tensor::Empty(x.shape(), x.dtype(), x.device());
    // The kernel writes both parameter gradients in one dtype: the parameter's,
    // or f32 when it adds into a given (f32) buffer; one not given is made and
    // returned in the parameter's dtype (no copy when it already is).
    const Dtype made = into.weight.defined() || into.bias.defined() ? Dtype::kF32 : param_dtype;
    const Tensor gw = into.weight.defined() ? into.weight
                      : weight.defined()    ? Tensor::Empty({c}, made, x.device())
                                            : Tensor();
    const Tensor gb = into.bias.defined() ? into.bias : Tensor::Empty({c}, made, x.device());
    cuda::LayerNormBackward(grad_y.Contiguous(), x.Contiguous(), ContiguousOrUndefined(weight),
                            mean.Contiguous(), rstd.Contiguous(), add, out.grad_x, gw, gb,
                            into.weight.defined() && into.add_weight,
                            into.bias.defined() && into.add_bias);
    if (!into.weight.defined() && gw.defined()) out.grad_weight = gw.To(param_dtype);
    if (!into.bias.defined()) out.grad_bias = gb.To(param_dtype);
    return out;
  }
  const Tensor grad_w32 = Tensor::Empty({c});
  const Tensor grad_b32 = Tensor::Empty({c});
  LayerNormGrads out;
  out.grad_x = Tensor::Empty(x.shape(), x.dtype());
  cpu::LayerNormBackward(grad_y.Contiguous(), x.Contiguous(), ParamF32(weight, c, 1.0),
                         mean.Contiguous(), rstd.Contiguous(), add, out.grad_x, grad_w32, grad_b32);
  if (weight.defined()) {
    out.grad_weight = AddOrReturn(grad_w32, into.weight, into.add_weight, param_dtype);
  }
  out.grad_bias = AddOrReturn(grad_b32, into.bias, into.add_bias, param_dtype);
  return out;
}

RmsNormResult RmsNorm(const Tensor& x, const Tensor& weight, float eps) {
  const char* op = "rms_norm";
  CheckInput(op, x, eps);
  CheckParam(op, "weight", weight, x);
  RmsNormResult out;
  out.y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  out.rstd = Tensor::Empty(RowsShape(x), Dtype::kF32, x.device());
  if (x.device().is_cuda()) {
    cuda::RmsNormForward(x.Contiguous(), ContiguousOrUndefined(weight), eps, out.y, out.rstd);
    return out;
  }
  cpu::RmsNormForward(x.Contiguous(), ParamF32(weight, x.dim(-1), 1.0), eps, out.y, out.rstd);
  return out;
}

RmsNormGrads RmsNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                             const Tensor& rstd, const Tensor& grad_x_add,
                             const NormGradsInto& into) {
  const char* op = "rms_norm_backward";
  CheckInput(op, x, 0.0f);
  CheckDevice(op, grad_y, x);
  CheckSameShape(op, grad_y, x);
  CheckSameDtype(op, grad_y, x);
  const Tensor add = CheckedAdd(op, grad_x_add, x);
  CheckParam(op, "weight", weight, x);
  CheckStat(op, "rstd", rstd, x);
  CheckInto(op, "weight", into.weight, x);
  OP_CHECK(!into.weight.defined() || weight.defined(), op,
           "a weight gradient to add into, but no weight");
  OP_CHECK(!into.bias.defined(), op, "RMSNorm has no bias gradient to add into");
  const int64_t c = x.dim(-1);
  if (x.device().is_cuda()) {
    RmsNormGrads out;
    out.grad_x = Tensor::Empty(x.shape(), x.dtype(), x.device());
    const Tensor gw = into.weight.defined() ? into.weight
                      : weight.defined()    ? Tensor::Empty({c}, weight.dtype(), x.device())
                                            : Tensor();
    cuda::RmsNormBackward(grad_y.Contiguous(), x.Contiguous(), ContiguousOrUndefined(weight),
                          rstd.Contiguous(), add, out.grad_x, gw,
                          into.weight.defined() && into.add_weight);
    if (!into.weight.defined()) out.grad_weight = gw;
    return out;
  }
  const Tensor grad_w32 = Tensor::Empty({c});
  RmsNormGrads out;
  out.grad_x = Tensor::Empty(x.shape(), x.dtype());
  cpu::RmsNormBackward(grad_y.Contiguous(), x.Contiguous(), ParamF32(weight, c, 1.0),
                       rstd.Contiguous(), add, out.grad_x, grad_w32);
  if (weight.defined()) {
    out.grad_weight = AddOrReturn(grad_w32, into.weight, into.add_weight, weight.dtype());
  }
  return out;
}

}  // namespace tensor
