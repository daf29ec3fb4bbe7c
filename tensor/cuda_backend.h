// The seam between the device-independent tensor code and the CUDA backend.
// A --config=cuda build links tensor/cuda (real CUDA); any other build links
// tensor/cuda_stub.cc, where every function fails with a message that says
// CUDA support was not built.
#ifndef TENSOR_CUDA_BACKEND_H_
#define TENSOR_CUDA_BACKEND_H_

#include <cstdint>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace tensor {
namespace cuda {

// True when this binary was built with CUDA support.
bool Built();
// Number of visible CUDA devices (0 without a GPU or without CUDA support).
int DeviceCount();
// Compute capability of cuda:index as major*10 + minor (e.g. 90 for H100).
int ComputeCapability(int index);
// The caching allocator of cuda:index.
Allocator& DeviceAllocator(int index);
// Page-locked host memory (cudaHostAlloc, freed blocks cached by size) for CPU
// tensors that travel to and from GPUs, such as FSDP's offloaded shards:
// copies need no staging buffer. nullptr without CUDA support or a visible
// device (Tensor::EmptyPinned then gives ordinary host memory).
Allocator* PinnedHostAllocator();
// True when `p` points into page-locked host memory (tests).
bool IsPinnedHost(const void* p);
// Copies bytes between any two devices (host<->device, device<->device).
void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes);

// A strided view of device memory for CopyStridedOnDevice: `data` points at
// element (0, ..., 0); sizes and strides in elements, at most kMaxCopyDims.
constexpr int kMaxCopyDims = 8;
struct DeviceView {
  void* data = nullptr;
  Dtype dtype = Dtype::kF32;
  int rank = 0;
  int64_t sizes[kMaxCopyDims] = {};
  int64_t strides[kMaxCopyDims] = {};
};
// dst[i] = src[i] for every index of the common shape, on cuda:`device` (on
// the calling thread's stream): a strided copy, and a cast between floating
// dtypes (RNE) when the dtypes differ (equal dtypes: any dtype, bit exact).
// What Tensor::CopyFrom / Contiguous / Clone / To(dtype) run for CUDA tensors.
void CopyStridedOnDevice(const DeviceView& src, const DeviceView& dst, int device);
// Sets the `n` elements at `data` on cuda:`device`, each `element_bytes`
// long (1, 2, 4 or 8), to the bit pattern at `element` (the value converted
// on the host, so the same bits as a CPU fill), on the calling thread's
// stream: no host wait. What Tensor::Full / Zeros and Fill run for CUDA tensors.
void FillOnDevice(void* data, int64_t n, const void* element, int element_bytes, int device);
// data[i] = i for i in [0, n), elements of an integer dtype (i32 or i64) on
// cuda:`device`, on the calling thread's stream. What Arange runs on a GPU.
void IotaOnDevice(void* data, Dtype dtype, int64_t n, int device);
// dst = src cast from src_dtype to dst_dtype (floating, RNE), n contiguous
// elements, for every pair, all on cuda:`device`, on the calling thread's
// stream, in one launch per 64 pairs. What CastAll runs for CUDA tensors.
struct CastPair {
  const void* src;
  void* dst;
  int64_t n;
};
void CastManyOnDevice(const std::vector<CastPair>& pairs, Dtype src_dtype, Dtype dst_dtype,
                      int device);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_BACKEND_H_
