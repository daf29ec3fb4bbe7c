// For the *_stub.cc files linked by builds without --config=cuda: every CUDA
// kernel entry point throws OpError "[op] CUDA support was not built into
// this binary; rebuild with --config=cuda (tensor on cuda:N)".
#ifndef TENSOR_CUDA_STUB_H_
#define TENSOR_CUDA_STUB_H_

#include "tensor/error.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

[[noreturn]] inline void NotBuilt(const char* op, const Tensor& t) {
  ThrowOpError(op, "CUDA support was not built into this binary; rebuild with --config=cuda (",
               "tensor on ", t.device().ToString(), ")");
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_STUB_H_
