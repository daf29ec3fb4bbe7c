// Dtype dispatch for CPU kernels: calls a generic lambda with a null pointer
// of the element type, e.g.
//   DispatchFloating("gelu", x.dtype(), [&](auto* tag) {
//     using T = std::remove_pointer_t<decltype(tag)>;  // float, bf16 or f16
//     GeluKernel<T>(...);
//   });
// Kernels load elements with ToFloat(), compute in float and store with FromFloat<T>().
#ifndef TENSOR_CPU_DISPATCH_H_
#define TENSOR_CPU_DISPATCH_H_

#include <type_traits>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace tensor {

template <typename Fn>
void DispatchFloating(const char* op, Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kF32: return fn(static_cast<float*>(nullptr));
    case Dtype::kBF16: return fn(static_cast<bf16*>(nullptr));
    case Dtype::kF16: return fn(static_cast<f16*>(nullptr));
    default:
      ThrowOpError(op, "dtype ", DtypeName(dtype), " is not supported; expected f32, bf16 or f16");
  }
}

// Index types of embedding lookups and targets: i32 or i64.
template <typename Fn>
void DispatchIndex(const char* op, Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kI32: return fn(static_cast<int32_t*>(nullptr));
    case Dtype::kI64: return fn(static_cast<int64_t*>(nullptr));
    default:
      ThrowOpError(op, "index dtype ", DtypeName(dtype), " is not supported; expected i32 or i64");
  }
}

}  // namespace tensor

#endif  // TENSOR_CPU_DISPATCH_H_
