// Elementwise ops: argument checks, output allocation and the calls into the
// kernels of the tensors' device: tensor/cpu/elementwise.h, or
// tensor/cuda/elementwise.h for tensors on a CUDA device (same signatures:
// any strides, every broadcast). Backward passes of broadcasting ops sum
// through ReduceToShape (tensor/ops/reduce.h), which has both devices too.
#include "tensor/ops/elementwise.h"

#include <algorithm>
#include <initializer_list>

#include "tensor/cpu/elementwise.h"
#include "tensor/cuda/elementwise.h"
#include "tensor/ops/check.h"
#include "tensor/ops/reduce.h"

namespace tensor {
namespace {

void CheckInputs(const char* op, const Tensor& a, const Tensor& b) {
  CheckOneDevice(op, {&a, &b});
  CheckFloating(op, a);
  CheckSameDtype(op, a, b);
}

void CheckInput(const char* op, const Tensor& x) {
  CheckOneDevice(op, {&x});
  CheckFloating(op, x);
}

cuda::BinaryOp CudaKind(cpu::BinaryOp kind) {
  switch (kind) {
    case cpu::BinaryOp::kAdd:
      return cuda::BinaryOp::kAdd;
    case cpu::BinaryOp::kSub:
      return cuda::BinaryOp::kSub;
    case cpu::BinaryOp::kMul:
      break;
  }
  return cuda::BinaryOp::kMul;
}

// The kernels of out's device (operands checked to share it).
void RunBinary(cpu::BinaryOp kind, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.device().is_cuda()) return cuda::Binary(CudaKind(kind), a, b, out);
  cpu::Binary(kind, a, b, out);
}

void ScaleKernel(const Tensor& x, float alpha, const Tensor& out) {
  if (out.device().is_cuda()) return cuda::Scale(x, alpha, out);
  cpu::Scale(x, alpha, out);
}

void BiasGeluKernel(const Tensor& x, const Tensor& bias, const Tensor& out) {
  if (out.device().is_cuda()) return cuda::BiasGelu(x, bias, out);
  cpu::BiasGelu(x, bias, out);
}

void BiasGeluBackwardKernel(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                            const Tensor& grad_in) {
  if (grad_in.device().is_cuda()) return cuda::BiasGeluBackward(grad_out, x, bias, grad_in);
  cpu::BiasGeluBackward(grad_out, x, bias, grad_in);
}

Tensor BinaryOp(const char* op, cpu::BinaryOp kind, const Tensor& a, const Tensor& b) {
  CheckInputs(op, a, b);
  Tensor out = Tensor::Empty(BroadcastShapes(op, a.shape(), b.shape()), a.dtype(), a.device());
  RunBinary(kind, a, b, out);
  return out;
}

void CheckGradShape(const char* op, const Tensor& grad_out, const Shape& a, const Shape& b) {
  const Shape expected = BroadcastShapes(op, a, b);
  OP_CHECK(grad_out.shape() == expected, op, "grad_out ", grad_out.shape().ToString(),
           " does not match the output shape ", expected.ToString(), " of operands ", a.ToString(),
           " and ", b.ToString());
}

// bias must be (C) with C the last dim of x.
void CheckBias(const char* op, const Tensor& x, const Tensor& bias) {
  CheckInputs(op, x, bias);
  OP_CHECK(x.rank() >= 1 && bias.rank() == 1 && bias.dim(0) == x.dim(-1), op, "bias ",
           bias.shape().ToString(), " does not match x ", x.shape().ToString(),
           ": expected x (..., C) and bias (C)");
}

// grad (..., C) summed over the leading dims into a new (C) tensor.
Tensor BiasGrad(const Tensor& grad) {
  Tensor grad_bias = Tensor::Empty({grad.dim(-1)}, grad.dtype(), grad.device());
  ReduceToShapeInto(grad, grad_bias, /*accumulate=*/false);
  return grad_bias;
}

}  // namespace

Shape BroadcastShapes(const char* op, const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  Shape out;
  for (int d = 0; d < rank; ++d) {
    const int da = d - (rank - a.rank());
    const int db = d - (rank - b.rank());
    const int64_t sa = da >= 0 ? a[da] : 1;
    const int64_t sb = db >= 0 ? b[db] : 1;
    OP_CHECK(sa == sb || sa == 1 || sb == 1, op, "shapes ", a.ToString(), " and ", b.ToString(),
             " cannot be broadcast: sizes ", sa, " and ", sb, " at dim ", d,
             " (dims aligned at the end) differ and neither is 1");
    out.push_back(sa == 1 ? sb : sa);
  }
  return out;
}

Tensor Add(const Tensor& a, const Tensor& b) { return BinaryOp("add", cpu::BinaryOp::kAdd, a, b); }

Tensor Sub(const Tensor& a, const Tensor& b) { return BinaryOp("sub", cpu::BinaryOp::kSub, a, b); }

Tensor Mul(const Tensor& a, const Tensor& b) { return BinaryOp("mul", cpu::BinaryOp::kMul, a, b); }

Tensor SumAs(const std::vector<Tensor>& xs, Dtype dtype) {
  const char* op = "sum_as";
  OP_CHECK(xs.size() >= 2 && xs.size() <= 4, op, "takes 2 to 4 tensors, got ", xs.size());
  OP_CHECK(IsFloatingPoint(dtype), op, "the sum's dtype must be floating, got ",
           DtypeName(dtype));
  for (const Tensor& x : xs) {
    OP_CHECK(x.defined(), op, "got an undefined tensor");
    CheckOneDevice(op, {&xs[0], &x});
    CheckFloating(op, x);
    OP_CHECK(x.shape() == xs[0].shape(), op, "shapes differ: ", xs[0].shape().ToString(), " and ",
             x.shape().ToString());
  }
  if (xs[0].device().is_cuda()) {
    Tensor out = Tensor::Empty(xs[0].shape(), dtype, xs[0].device());
    cuda::SumAs(xs, out);
    return out;
  }
  // The same float arithmetic from the ops: casts, a chain of f32 adds, a cast.
  Tensor sum = Add(xs[0].To(Dtype::kF32), xs[1].To(Dtype::kF32));
  for (size_t k = 2; k < xs.size(); ++k) sum = Add(sum, xs[k].To(Dtype::kF32));
  return sum.To(dtype);
}

BinaryGrads AddBackward(const Tensor& grad_out, const Shape& a_shape, const Shape& b_shape) {
  const char* op = "add_backward";
  CheckInput(op, grad_out);
  CheckGradShape(op, grad_out, a_shape, b_shape);
  return {ReduceToShape(grad_out, a_shape), ReduceToShape(grad_out, b_shape)};
}

BinaryGrads SubBackward(const Tensor& grad_out, const Shape& a_shape, const Shape& b_shape) {
  const char* op = "sub_backward";
  CheckInput(op, grad_out);
  CheckGradShape(op, grad_out, a_shape, b_shape);
  return {ReduceToShape(grad_out, a_shape), Scale(ReduceToShape(grad_out, b_shape), -1.0)};
}

BinaryGrads MulBackward(const Tensor& grad_out, const Tensor& a, const Tensor& b) {
  const char* op = "mul_backward";
  CheckInputs(op, a, b);
  CheckInputs(op, grad_out, a);
  CheckGradShape(op, grad_out, a.shape(), b.shape());
  return {ReduceToShape(Mul(grad_out, b), a.shape()), ReduceToShape(Mul(grad_out, a), b.shape())};
}

Tensor Scale(const Tensor& x, double alpha) {
  CheckInput("scale", x);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  ScaleKernel(x, static_cast<float>(alpha), out);
  return out;
}

Tensor ScaleBackward(const Tensor& grad_out, double alpha) { return Scale(grad_out, alpha); }

void ScaleInPlace(const Tensor& x, double alpha) {
  CheckInput("scale_in_place", x);
  ScaleKernel(x, static_cast<float>(alpha), x);
}

namespace {

void AccumulateChecked(const char* op, double alpha, const Tensor& x, const Tensor& y) {
  const bool on_cuda = CheckOneDevice(op, {&x, &y});
  CheckFloating(op, x);
  CheckFloating(op, y);
  OP_CHECK(y.dtype() == x.dtype() || y.dtype() == Dtype::kF32, op, "cannot accumulate ",
           Describe("x", x), " into ", Describe("y", y), ": y must have x's dtype or be f32");
  CheckSameShape(op, y, x);
  if (on_cuda) {
    cuda::Axpy(static_cast<float>(alpha), x, y);
  } else {
    cpu::Axpy(static_cast<float>(alpha), x, y);
  }
}

}  // namespace

void Axpy(double alpha, const Tensor& x, const Tensor& y) {
  AccumulateChecked("axpy", alpha, x, y);
}

void AddInPlace(const Tensor& y, const Tensor& x) { AccumulateChecked("add_in_place", 1.0, x, y); }

Tensor AddBias(const Tensor& x, const Tensor& bias) {
  CheckBias("add_bias", x, bias);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  RunBinary(cpu::BinaryOp::kAdd, x, bias, out);
  return out;
}

Tensor AddBiasBackward(const Tensor& grad_out) {
  const char* op = "add_bias_backward";
  CheckInput(op, grad_out);
  OP_CHECK(grad_out.rank() >= 1, op, "grad_out ", grad_out.shape().ToString(),
           " must have rank >= 1: (..., C)");
  return BiasGrad(grad_out);
}

void AddBiasBackwardInto(const Tensor& grad_out, const Tensor& grad_bias, bool accumulate) {
  const char* op = "add_bias_backward";
  CheckOneDevice(op, {&grad_out, &grad_bias});
  CheckFloating(op, grad_out);
  CheckFloating(op, grad_bias);
  OP_CHECK(grad_out.rank() >= 1 && grad_bias.rank() == 1 && grad_bias.dim(0) == grad_out.dim(-1),
           op, "grad_bias ", grad_bias.shape().ToString(), " does not match grad_out ",
           grad_out.shape().ToString(), ": expected grad_out (..., C) and grad_bias (C)");
  OP_CHECK(grad_bias.dtype() == grad_out.dtype() || grad_bias.dtype() == Dtype::kF32, op,
           "cannot accumulate ", Describe("grad_out", grad_out), " into ",
           Describe("grad_bias", grad_bias), ": grad_bias must have its dtype or be f32");
  OP_CHECK(grad_bias.is_contiguous(), op, "grad_bias must be contiguous");
  ReduceToShapeInto(grad_out, grad_bias, accumulate);
}

Tensor Gelu(const Tensor& x) {
  CheckInput("gelu", x);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  BiasGeluKernel(x, Tensor(), out);
  return out;
}

Tensor GeluBackward(const Tensor& grad_out, const Tensor& x) {
  const char* op = "gelu_backward";
  CheckInputs(op, grad_out, x);
  CheckSameShape(op, grad_out, x);
  Tensor grad_in = Tensor::Empty(x.shape(), x.dtype(), x.device());
  BiasGeluBackwardKernel(grad_out, x, Tensor(), grad_in);
  return grad_in;
}

Tensor BiasGelu(const Tensor& x, const Tensor& bias) {
  CheckBias("bias_gelu", x, bias);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  BiasGeluKernel(x, bias, out);
  return out;
}

BiasGeluGrads BiasGeluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& bias) {
  const char* op = "bias_gelu_backward";
  CheckBias(op, x, bias);
  CheckInputs(op, grad_out, x);
  CheckSameShape(op, grad_out, x);
  BiasGeluGrads grads;
  grads.grad_x = Tensor::Empty(x.shape(), x.dtype(), x.device());
  BiasGeluBackwardKernel(grad_out, x, bias, grads.grad_x);
  grads.grad_bias = BiasGrad(grads.grad_x);
  return grads;
}

Tensor Relu(const Tensor& x) {
  CheckInput("relu", x);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (x.device().is_cuda()) {
    cuda::Relu(x, out);
  } else {
    cpu::Relu(x, out);
  }
  return out;
}

Tensor ReluBackward(const Tensor& grad_out, const Tensor& x) {
  const char* op = "relu_backward";
  CheckInputs(op, grad_out, x);
  CheckSameShape(op, grad_out, x);
  Tensor grad_in = Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (x.device().is_cuda()) {
    cuda::ReluBackward(grad_out, x, grad_in);
  } else {
    cpu::ReluBackward(grad_out, x, grad_in);
  }
  return grad_in;
}

}  // namespace tensor
