// What every CUDA kernel file of the tensor library shares: error checks that
// throw tensor::OpError naming the op, the stream kernels run on, launch
// geometry, and (elements.cuh) element access in float for f32 / bf16 / f16.
//
// Conventions of tensor/cuda/*.cu (each family: <family>.h declares host
// functions without CUDA types, <family>.cu implements them, <family>_stub.cc
// throws "CUDA support was not built" for builds without --config=cuda):
// - The op layer (tensor/ops/*.cc) checks shapes, dtypes and devices and
//   allocates outputs; kernels get contiguous tensors on one CUDA device.
// - Kernels run on ComputeStream() (the calling thread's per-thread default
//   stream, so rank threads of the threads engine do not serialize) and are
//   asynchronous; anything returning a host value synchronizes that stream.
// - Floating inputs are read as float and written rounded (RNE) to the
//   output dtype; accumulation is float.
#ifndef TENSOR_CUDA_COMMON_CUH_
#define TENSOR_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tensor/cuda/elements.cuh"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

// Throws OpError "[op] <what>: <cuda error>" when err is not cudaSuccess.
// The failure is cleared from the thread's last error first (as PyTorch's
// C10_CUDA_CHECK): a caller who handles it does not see it again at its next
// launch check (a sticky error stays whatever is done).
inline void CheckCuda(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  ThrowOpError(op, what, ": ", cudaGetErrorString(err));
}
// After a kernel launch: launch errors (bad geometry, no device code for this
// GPU) surface here, not at the next synchronization.
inline void CheckLaunch(const char* op) { CheckCuda(cudaGetLastError(), op, "kernel launch"); }

inline cudaStream_t ComputeStream() { return cudaStreamPerThread; }

// The host waits for the thread's stream on the current device (to read a
// result back), then throws the first failed deferred check that the wait let
// arrive (tensor/cuda_backend.h: an embedding's ids, checked without a wait of
// their own, report here).
inline void WaitForComputeStream(const char* op, const char* what) {
  CheckCuda(cudaStreamSynchronize(ComputeStream()), op, what);
  int device = 0;
  CheckCuda(cudaGetDevice(&device), op, "cudaGetDevice");
  RaiseDeferredChecks(device, /*wait=*/false);
}

// Whether environment variable `name` is set to `value` (the families' run-time
// switches, FSDP_CUDA_*).
inline bool EnvIs(const char* name, const char* value) {
  const char* env = std::getenv(name);
  return env != nullptr && std::strcmp(env, value) == 0;
}

// Makes `t`'s device current on this thread.
inline void SetDevice(const Tensor& t, const char* op) {
  CheckCuda(cudaSetDevice(t.device().index), op, "cudaSetDevice");
}

constexpr int kThreads = 256;
// log2(e): exp(x) = exp2(x * kLog2e), exp2f being the cheaper instruction
// sequence (the softmax, loss and attention kernels).
constexpr float kLog2e = 1.4426950408889634f;
inline unsigned Blocks(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

// The max / sum of one float per lane over a full warp, in every lane.
__device__ __forceinline__ float WarpAllMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpAllSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Calls fn(T{}) with T the CUDA type of a floating dtype; throws otherwise.
template <typename Fn>
void DispatchFloat(Dtype dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case Dtype::kF32:
      fn(float{});
      return;
    case Dtype::kBF16:
      fn(__nv_bfloat16{});
      return;
    case Dtype::kF16:
      fn(__half{});
      return;
    default:
      ThrowOpError(op, "dtype ", DtypeName(dtype), " is not a floating dtype (f32, bf16, f16)");
  }
}

template <typename T>
T* Ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_COMMON_CUH_
