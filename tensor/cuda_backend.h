// The seam between the device-independent tensor code and the CUDA backend.
// A --config=cuda build links tensor/cuda (real CUDA); any other build links
// tensor/cuda_stub.cc, where every function fails with a message that says
// CUDA support was not built.
#ifndef TENSOR_CUDA_BACKEND_H_
#define TENSOR_CUDA_BACKEND_H_

#include <cstdint>

#include "tensor/allocator.h"
#include "tensor/device.h"

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
// Copies bytes between any two devices (host<->device, device<->device).
void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_BACKEND_H_
