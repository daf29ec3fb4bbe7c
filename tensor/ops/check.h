// Argument checks shared by the ops: each throws OpError with a message that
// starts with the op name and shows the shapes and dtypes involved.
#ifndef TENSOR_OPS_CHECK_H_
#define TENSOR_OPS_CHECK_H_

#include <initializer_list>
#include <string>

#include "tensor/tensor.h"

namespace tensor {

// Throws unless every tensor is defined and on the CPU (the CUDA dispatch
// replaces this when the CUDA backend implements the op).
void CheckCpu(const char* op, std::initializer_list<const Tensor*> tensors);
// Throws unless every tensor is defined and all are on one device (the
// message names two of them and their devices); returns whether that device
// is a CUDA device, so the caller runs the CUDA kernels.
bool CheckOneDevice(const char* op, std::initializer_list<const Tensor*> tensors);
// Throws unless `t` has dtype f32, bf16 or f16.
void CheckFloating(const char* op, const Tensor& t);
// Throws unless a and b have the same dtype.
void CheckSameDtype(const char* op, const Tensor& a, const Tensor& b);
// Throws unless a and b have the same shape.
void CheckSameShape(const char* op, const Tensor& a, const Tensor& b);
// "x (2,3) f32": a tensor described for error messages.
std::string Describe(const char* name, const Tensor& t);

}  // namespace tensor

#endif  // TENSOR_OPS_CHECK_H_
