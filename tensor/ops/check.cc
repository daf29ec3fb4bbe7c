// Shared argument checks of the ops.
#include "tensor/ops/check.h"

#include "absl/strings/str_cat.h"

namespace tensor {

std::string Describe(const char* name, const Tensor& t) {
  if (!t.defined()) return absl::StrCat(name, " undefined");
  return absl::StrCat(name, " ", t.shape().ToString(), " ", DtypeName(t.dtype()));
}

void CheckCpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    OP_CHECK(t->defined(), op, "got an undefined tensor");
    OP_CHECK(t->device().is_cpu(), op, "tensor ", t->shape().ToString(), " is on ",
             t->device().ToString(), "; this op has no kernel for that device in this build");
  }
}

bool CheckOneDevice(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    OP_CHECK(t->defined(), op, "got an undefined tensor");
    if (first == nullptr) first = t;
    OP_CHECK(t->device() == first->device(), op,
             "tensors are on different devices: ", first->shape().ToString(), " on ",
             first->device().ToString(), " and ", t->shape().ToString(), " on ",
             t->device().ToString());
  }
  return first != nullptr && first->device().is_cuda();
}

void CheckFloating(const char* op, const Tensor& t) {
  OP_CHECK(IsFloatingPoint(t.dtype()), op, "dtype ", DtypeName(t.dtype()), " of tensor ",
           t.shape().ToString(), " is not supported; expected f32, bf16 or f16");
}

void CheckSameDtype(const char* op, const Tensor& a, const Tensor& b) {
  OP_CHECK(a.dtype() == b.dtype(), op, "dtypes differ: ", DtypeName(a.dtype()), " ",
           a.shape().ToString(), " and ", DtypeName(b.dtype()), " ", b.shape().ToString());
}

void CheckSameShape(const char* op, const Tensor& a, const Tensor& b) {
  OP_CHECK(a.shape() == b.shape(), op, "shapes ", a.shape().ToString(), " and ",
           b.shape().ToString(), " differ");
}

}  // namespace tensor
