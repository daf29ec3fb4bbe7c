// Softmax ops: argument checks, then the CUDA kernels (tensor/cuda/softmax.h)
// for tensors on a GPU or the CPU kernels (tensor/cpu/softmax.h).
#include "tensor/ops/softmax.h"

#include <cmath>
#include <initializer_list>

#include "absl/strings/str_join.h"
#include "tensor/cpu/softmax.h"
#include "tensor/cuda/softmax.h"
#include "tensor/ops/check.h"

namespace tensor {
namespace {

// Every tensor defined and on the device of the first: the CPU (CheckCpu's
// message) or one CUDA device.
void CheckDevices(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor& first = **tensors.begin();
  OP_CHECK(first.defined(), op, "got an undefined tensor");
  if (!first.device().is_cuda()) return CheckCpu(op, tensors);
  for (const Tensor* t : tensors) {
    OP_CHECK(t->defined(), op, "got an undefined tensor");
    OP_CHECK(t->device() == first.device(), op, "tensor ", t->shape().ToString(), " is on ",
             t->device().ToString(), " but tensor ", first.shape().ToString(), " is on ",
             first.device().ToString());
  }
}

// Checks x and options; returns the kernel layout.
cpu::SoftmaxShape CheckSoftmax(const char* op, const Tensor& x, const SoftmaxOptions& options) {
  OP_CHECK(x.rank() >= 1, op, "x must have at least one dimension; got ", Describe("x", x));
  OP_CHECK(std::isfinite(options.scale), op, "scale must be finite; got ", options.scale);
  cpu::SoftmaxShape s;
  s.cols = x.dim(-1);
  s.rows = s.cols == 0 ? 0 : x.numel() / s.cols;
  if (options.causal) {
    OP_CHECK(x.rank() >= 2, op,
             "the causal mask needs scores shaped (..., T_q, T_k); got ", Describe("x", x));
    s.causal_t_q = x.dim(-2);
    OP_CHECK(s.causal_t_q <= s.cols, op, "the causal mask needs T_q <= T_k; got T_q ",
             s.causal_t_q, " and T_k ", s.cols, " in ", Describe("x", x));
  }
  return s;
}

}  // namespace

Tensor Softmax(const Tensor& x, const SoftmaxOptions& options) {
  CheckDevices("softmax", {&x});
  CheckFloating("softmax", x);
  const cpu::SoftmaxShape s = CheckSoftmax("softmax", x, options);
  const Tensor xc = x.Contiguous();
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (x.device().is_cuda()) {
    cuda::SoftmaxForward(xc, y, s.causal_t_q, options.scale);
    return y;
  }
  cpu::SoftmaxForward(xc, y, s, options.scale);
  return y;
}

void SoftmaxInto(const Tensor& x, const Tensor& y, const SoftmaxOptions& options) {
  CheckDevices("softmax", {&x, &y});
  CheckFloating("softmax", x);
  CheckSameShape("softmax", x, y);
  CheckSameDtype("softmax", x, y);
  OP_CHECK(y.is_contiguous(), "softmax", "the output must be contiguous; got ",
           Describe("y", y), " with strides (", absl::StrJoin(y.strides(), ","), ")");
  const cpu::SoftmaxShape s = CheckSoftmax("softmax", x, options);
  if (x.device().is_cuda()) {
    cuda::SoftmaxForward(x.Contiguous(), y, s.causal_t_q, options.scale);
    return;
  }
  cpu::SoftmaxForward(x.Contiguous(), y, s, options.scale);
}

Tensor SoftmaxBackward(const Tensor& grad_y, const Tensor& y, const SoftmaxOptions& options) {
  const char* op = "softmax_backward";
  CheckDevices(op, {&grad_y, &y});
  CheckFloating(op, y);
  CheckSameShape(op, grad_y, y);
  CheckSameDtype(op, grad_y, y);
  const cpu::SoftmaxShape s = CheckSoftmax(op, y, options);
  Tensor grad_x = Tensor::Empty(y.shape(), y.dtype(), y.device());
  if (y.device().is_cuda()) {
    cuda::SoftmaxBackward(grad_y.Contiguous(), y.Contiguous(), grad_x, s.causal_t_q, options.scale);
    return grad_x;
  }
  cpu::SoftmaxBackward(grad_y.Contiguous(), y.Contiguous(), grad_x, s, options.scale);
  return grad_x;
}

}  // namespace tensor
