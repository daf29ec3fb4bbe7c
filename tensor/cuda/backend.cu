// The CUDA backend of the tensor library: device count, a caching device
// allocator per GPU, and copies between devices. Linked by --config=cuda builds
// in place of tensor/cuda_stub.cc.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "tensor/cuda_backend.h"
#include "tensor/error.h"

namespace tensor {
namespace cuda {
namespace {

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    ThrowOpError("cuda", what, " failed: ", cudaGetErrorString(err));
  }
}

// Caching allocator: freed blocks are kept in a size-keyed pool and reused for
// requests of the same rounded size, so steady-state training does no
// cudaMalloc/cudaFree. On out-of-memory the cache is released and the request
// retried once.
class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}

  void* Allocate(int64_t bytes) override {
    const int64_t size = RoundSize(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    Check(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky error
      ReleaseCache();
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    Check(err, "cudaMalloc");
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ += size;
    return p;
  }

  void Deallocate(void* ptr, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    free_[RoundSize(bytes)].push_back(ptr);
  }

  void ReleaseCache() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        cudaFree(p);
        reserved_ -= size;
      }
    }
    free_.clear();
  }

 private:
  // 512-byte granularity below 1 MiB, 2 MiB granularity above.
  static int64_t RoundSize(int64_t bytes) {
    const int64_t align = bytes < (1 << 20) ? 512 : (2 << 20);
    return std::max<int64_t>(align, (bytes + align - 1) / align * align);
  }

  const int device_;
  std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_;
  int64_t reserved_ = 0;
};

}  // namespace

bool Built() { return true; }

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int ComputeCapability(int index) {
  int major = 0, minor = 0;
  Check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index),
        "cudaDeviceGetAttribute");
  Check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index),
        "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

Allocator& DeviceAllocator(int index) {
  static std::mutex mu;
  static auto* allocators = new std::vector<std::unique_ptr<CachingAllocator>>();
  std::lock_guard<std::mutex> lock(mu);
  const int count = DeviceCount();
  OP_CHECK(index >= 0 && index < count, "cuda", "device cuda:", index, " does not exist (",
           count, " CUDA devices visible)");
  if (allocators->empty()) allocators->resize(count);
  if (!(*allocators)[index]) (*allocators)[index] = std::make_unique<CachingAllocator>(index);
  return *(*allocators)[index];
}

void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing infers the direction
  if (dst_device.is_cuda()) Check(cudaSetDevice(dst_device.index), "cudaSetDevice");
  else if (src_device.is_cuda()) Check(cudaSetDevice(src_device.index), "cudaSetDevice");
  Check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

}  // namespace cuda
}  // namespace tensor
