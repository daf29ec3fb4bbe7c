// The CUDA runtime's errors in the device backend's host code (backend.cu,
// streams.cu, deferred_checks.cu): one check that throws, and the clearing of
// a query's "not ready".
#ifndef TENSOR_CUDA_BACKEND_ERRORS_CUH_
#define TENSOR_CUDA_BACKEND_ERRORS_CUH_

#include <cuda_runtime.h>

#include "tensor/error.h"

namespace tensor {
namespace cuda {
namespace backend {

// Throws OpError "[cuda] <what> failed: <cuda error>" when err is not
// cudaSuccess. The failure is also the thread's last error: cleared first (as
// PyTorch's C10_CUDA_CHECK), so that a caller who handles it does not see it
// again at its next launch check (a sticky error stays whatever is done).
inline void Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  ThrowOpError("cuda", what, " failed: ", cudaGetErrorString(err));
}

// After a query (cudaEventQuery, cudaStreamQuery) answered "not ready": that
// may be left as the thread's last error (PyTorch clears it after its event
// queries), which the next launch check would report. Cleared when it is the
// error pending.
inline void ClearNotReady() {
  if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
}

}  // namespace backend
}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_BACKEND_ERRORS_CUH_
