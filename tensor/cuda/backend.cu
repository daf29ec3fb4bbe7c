// The CUDA backend of the tensor library: device count, a caching device
// allocator per GPU, copies between devices, and strided copies / casts on a
// device. Linked by --config=cuda builds
// in place of tensor/cuda_stub.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/allocator.h"
#include "tensor/cuda/backend_errors.cuh"
#include "tensor/cuda/elements.cuh"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"

namespace tensor {
namespace cuda {
namespace {

using backend::Check;

// Cached block sizes: 512-byte granularity below 1 MiB, 2 MiB granularity above.
int64_t RoundSize(int64_t bytes) {
  const int64_t align = bytes < (1 << 20) ? 512 : (2 << 20);
  return std::max<int64_t>(align, (bytes + align - 1) / align * align);
}

// Drains the calling thread's per-thread stream on every device it allocated
// on (a per-thread stream is per device too) when the thread ends, so the
// blocks in its pools are idle before a new thread can get the same id (and
// so the pools). Errors are ignored (at process exit the runtime may be gone).
struct DrainStreamsAtThreadExit {
  std::vector<int> devices;  // in first-allocation order

  void Add(int device) {
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
    }
  }
  ~DrainStreamsAtThreadExit() {
    for (int device : devices) {
      if (cudaSetDevice(device) != cudaSuccess ||
          cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) {
        cudaGetLastError();
      }
    }
  }
};

// Caching allocator: freed blocks are kept and reused for requests of the same
// rounded size (512 B granularity below 1 MiB, 2 MiB above), so steady-state
// training does no cudaMalloc/cudaFree.
//
// Stream safety. Kernels run asynchronously on the calling thread's per-thread
// default stream (ComputeStream()), and the rank threads of the threads engine
// share one GPU, so a block freed on the host may still be in use by kernels
// queued on its thread's stream. The rule:
// - each live block remembers the thread that allocated it; when freed (by
//   any thread) it returns to that thread's pool;
// - Allocate reuses only blocks of the calling thread's own pool: the new
//   user's kernels queue behind the old ones on the same stream, so reuse
//   needs no synchronization. A block is never handed to another thread.
// - Work on another stream (a communication stream) that touches a block must
//   be finished before the block is freed: the dist engines wait for their
//   collectives before dropping their buffers.
// On out-of-memory every thread's free blocks are released
// (cudaDeviceSynchronize first: they may still be in use on their streams)
// and the request is retried once. The pool of a thread that has ended stays
// cached until then (a new thread that gets the same id reuses it: every
// allocating thread drains its streams when it ends, DrainStreamsAtThreadExit).
class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}

  void* Allocate(int64_t bytes) override {
    const int64_t size = RoundSize(bytes);
    const std::thread::id self = std::this_thread::get_id();
    thread_local DrainStreamsAtThreadExit drain;  // constructed on this thread's first use
    drain.Add(device_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<void*>& blocks = pools_[self][size];
      if (!blocks.empty()) {
        void* p = blocks.back();
        blocks.pop_back();
        owner_.emplace(p, self);
        return p;
      }
    }
    Check(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    // The bytes are counted before cudaMalloc, so threads allocating at once
    // cannot pass the limit together.
    auto reserve = [&]() -> cudaError_t {
      if (!TryReserve(size)) return cudaErrorMemoryAllocation;
      const cudaError_t e = cudaMalloc(&p, size);
      if (e != cudaSuccess) Unreserve(size);
      return e;
    };
    cudaError_t err = reserve();
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky error
      ReleaseCache();
      err = reserve();
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemory(size);
    }
    Check(err, "cudaMalloc");
    std::lock_guard<std::mutex> lock(mu_);
    owner_.emplace(p, self);
    return p;
  }

  void Deallocate(void* ptr, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(ptr);
    if (it == owner_.end()) {  // a broken invariant: not a block of this allocator
      std::fprintf(stderr, "[cuda] Deallocate(%p): not a live block of cuda:%d\n", ptr, device_);
      std::abort();
    }
    pools_[it->second][RoundSize(bytes)].push_back(ptr);
    owner_.erase(it);
  }

  // What the device holds once the cache is released and the request of
  // `size` rounded bytes still fails.
  OutOfMemoryError OutOfMemory(int64_t size) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
    int64_t live = 0, limit = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = reserved_;
      limit = limit_;
    }
    const std::string capped =
        limit >= 0 && live + size > limit
            ? absl::StrCat(", which would take this process past its limit of ",
                           FormatBytes(limit), " there, set by SetDeviceMemoryLimit")
            : "";
    return OutOfMemoryError(absl::StrCat(
        "cuda:", device_, " has ", FormatBytes(static_cast<int64_t>(free_bytes)), " free of ",
        FormatBytes(static_cast<int64_t>(total_bytes)), " with this process's caching allocator "
        "holding ", FormatBytes(live), " there in live blocks, its free ones released (the request "
        "rounds to ", FormatBytes(size), capped, ")"));
  }

  void set_limit(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
  }
  int64_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }
  int64_t reserved() {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }

  // Counts `size` more reserved bytes when that stays within the limit.
  bool TryReserve(int64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (limit_ >= 0 && reserved_ + size > limit_) return false;
    reserved_ += size;
    return true;
  }
  void Unreserve(int64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= size;
  }

  // Frees every thread's cached blocks (live blocks are untouched); the
  // bytes freed. Holds the lock throughout, so a thread that finds the limit
  // reached while another releases waits for the bytes to be counted free.
  int64_t ReleaseCache() {
    int64_t freed = 0;
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    cudaDeviceSynchronize();  // the blocks' last kernels may still be queued
    for (auto& [thread, pool] : pools_) {
      for (auto& [size, blocks] : pool) {
        for (void* p : blocks) {
          cudaFree(p);
          reserved_ -= size;
          freed += size;
        }
      }
    }
    pools_.clear();
    return freed;
  }

 private:
  // Free blocks by rounded size.
  using Pool = std::map<int64_t, std::vector<void*>>;

  const int device_;
  std::mutex mu_;
  std::unordered_map<std::thread::id, Pool> pools_;   // free blocks, by owning thread
  std::unordered_map<void*, std::thread::id> owner_;  // live block -> allocating thread
  int64_t reserved_ = 0;  // cudaMalloc'd bytes, live or cached
  int64_t limit_ = -1;    // the most reserved_ may reach (-1: the device's memory)
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

std::string DeviceName(int index) {
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  return prop.name;
}

namespace {

CachingAllocator& DeviceCache(int index) {
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

}  // namespace

Allocator& DeviceAllocator(int index) { return DeviceCache(index); }

void SetDeviceMemoryLimit(int index, int64_t bytes) {
  OP_CHECK(bytes >= -1, "cuda", "SetDeviceMemoryLimit(cuda:", index, ", ", bytes,
           "): the limit is a byte count >= 0, or -1 for none");
  DeviceCache(index).set_limit(bytes);
}

int64_t DeviceMemoryLimit(int index) { return DeviceCache(index).limit(); }

int64_t DeviceReservedBytes(int index) { return DeviceCache(index).reserved(); }

int64_t ReleaseCachedDeviceMemory(int index) { return DeviceCache(index).ReleaseCache(); }

namespace {

// Page-locked host memory: freed blocks are kept by rounded size and reused
// (cudaHostAlloc is slow). Host memory has no stream: a block is idle once
// the synchronous copies that used it returned, so any thread may reuse it.
// On out-of-memory the cache is released and the request retried once.
class PinnedHostCache final : public Allocator {
 public:
  void* Allocate(int64_t bytes) override {
    const int64_t size = RoundSize(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<void*>& blocks = free_[size];
      if (!blocks.empty()) {
        void* p = blocks.back();
        blocks.pop_back();
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ReleaseCache();
      err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemoryError(absl::StrCat("cudaHostAlloc could not page-lock ",
                                          FormatBytes(size), " of host memory, its cache released"));
    }
    Check(err, "cudaHostAlloc");
    return p;
  }

  void Deallocate(void* ptr, int64_t bytes) override {
    const int64_t size = RoundSize(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(ptr);
  }

 private:
  void ReleaseCache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) cudaFreeHost(p);
    }
    free_.clear();
  }

  std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_;
};

}  // namespace

Allocator* PinnedHostAllocator() {
  static Allocator* const pinned =
      DeviceCount() > 0 ? static_cast<Allocator*>(new PinnedHostCache()) : nullptr;
  return pinned;
}

bool IsPinnedHost(const void* p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

// A copy on the legacy default stream: it waits for the device's blocking
// streams (every thread's per-thread stream). Between two GPUs it waits for
// the earlier work of both and comes before the later work of either (the CUDA
// programming guide, "Peer-to-Peer Memory Copy": a copy in the implicit NULL
// stream between two devices), so the kernels still writing the source, and
// those that reuse its block once it is freed, are ordered on both devices,
// whichever thread queued them (PyTorch's two events order the calling
// thread's streams only).
void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes) {
  if (bytes == 0) return;
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing infers the direction
  if (dst_device.is_cuda()) Check(cudaSetDevice(dst_device.index), "cudaSetDevice");
  else if (src_device.is_cuda()) Check(cudaSetDevice(src_device.index), "cudaSetDevice");
  Check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
  // A copy to the host waited for the GPU: the checks that arrived report.
  if (src_device.is_cuda() && dst_device.is_cpu()) {
    RaiseDeferredChecks(src_device.index, /*wait=*/false);
  }
}

namespace {

struct Geometry {
  int rank;
  int64_t sizes[kMaxCopyDims];
  int64_t src_strides[kMaxCopyDims];
  int64_t dst_strides[kMaxCopyDims];
};

// Element i of the row-major index space -> source and destination offsets.
template <typename S, typename D, bool kSame>
__global__ void StridedCopyKernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n,
                                  Geometry g) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, so = 0, d_off = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t idx = rest % g.sizes[d];
      rest /= g.sizes[d];
      so += idx * g.src_strides[d];
      d_off += idx * g.dst_strides[d];
    }
    if constexpr (kSame) {
      dst[d_off] = src[so];
    } else {
      dst[d_off] = FromF<D>(ToF(src[so]));
    }
  }
}

template <typename S, typename D, bool kSame>
void LaunchCopy(const DeviceView& src, const DeviceView& dst, int64_t n, const Geometry& g) {
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 32) blocks = 65535 * 32;
  StridedCopyKernel<S, D, kSame><<<static_cast<unsigned>(blocks), threads, 0,
                                   cudaStreamPerThread>>>(static_cast<const S*>(src.data),
                                                          static_cast<D*>(dst.data), n, g);
}

// Same dtype: copy elements of its size exactly.
void CopySame(const DeviceView& src, const DeviceView& dst, int64_t n, const Geometry& g) {
  switch (DtypeSize(src.dtype)) {
    case 1:
      return LaunchCopy<uint8_t, uint8_t, true>(src, dst, n, g);
    case 2:
      return LaunchCopy<uint16_t, uint16_t, true>(src, dst, n, g);
    case 4:
      return LaunchCopy<uint32_t, uint32_t, true>(src, dst, n, g);
    case 8:
      return LaunchCopy<uint64_t, uint64_t, true>(src, dst, n, g);
  }
  ThrowOpError("copy", "unsupported element size ", DtypeSize(src.dtype));
}

template <typename S>
void CastTo(const DeviceView& src, const DeviceView& dst, int64_t n, const Geometry& g) {
  switch (dst.dtype) {
    case Dtype::kF32:
      return LaunchCopy<S, float, false>(src, dst, n, g);
    case Dtype::kBF16:
      return LaunchCopy<S, __nv_bfloat16, false>(src, dst, n, g);
    case Dtype::kF16:
      return LaunchCopy<S, __half, false>(src, dst, n, g);
    default:
      ThrowOpError("copy", "a cast on CUDA goes between floating dtypes, not to ",
                   DtypeName(dst.dtype));
  }
}

}  // namespace

void CopyStridedOnDevice(const DeviceView& src, const DeviceView& dst, int device) {
  OP_CHECK(src.rank == dst.rank && src.rank >= 0 && src.rank <= kMaxCopyDims, "copy",
           "ranks ", src.rank, " and ", dst.rank, " (at most ", kMaxCopyDims, " on CUDA)");
  Geometry g{};
  g.rank = src.rank;
  int64_t n = 1;
  for (int d = 0; d < src.rank; ++d) {
    OP_CHECK(src.sizes[d] == dst.sizes[d], "copy", "sizes differ in dimension ", d);
    g.sizes[d] = src.sizes[d];
    g.src_strides[d] = src.strides[d];
    g.dst_strides[d] = dst.strides[d];
    n *= src.sizes[d];
  }
  if (n == 0) return;
  Check(cudaSetDevice(device), "cudaSetDevice");
  if (src.dtype == dst.dtype) {
    CopySame(src, dst, n, g);
  } else {
    switch (src.dtype) {
      case Dtype::kF32:
        CastTo<float>(src, dst, n, g);
        break;
      case Dtype::kBF16:
        CastTo<__nv_bfloat16>(src, dst, n, g);
        break;
      case Dtype::kF16:
        CastTo<__half>(src, dst, n, g);
        break;
      default:
        ThrowOpError("copy", "a cast on CUDA goes between floating dtypes, not from ",
                     DtypeName(src.dtype));
    }
  }
  Check(cudaGetLastError(), "strided copy kernel launch");
}

namespace {

template <typename U>
__global__ void FillKernel(U* p, int64_t n, U bits) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = bits;
  }
}

template <typename U>
void LaunchFill(void* data, int64_t n, const void* element) {
  U bits;
  std::memcpy(&bits, element, sizeof(U));
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 32) blocks = 65535 * 32;
  FillKernel<U><<<static_cast<unsigned>(blocks), threads, 0, cudaStreamPerThread>>>(
      static_cast<U*>(data), n, bits);
}

}  // namespace

void FillOnDevice(void* data, int64_t n, const void* element, int element_bytes, int device) {
  OP_CHECK(element_bytes == 1 || element_bytes == 2 || element_bytes == 4 || element_bytes == 8,
           "fill", "unsupported element size ", element_bytes);
  if (n == 0) return;
  Check(cudaSetDevice(device), "cudaSetDevice");
  const unsigned char* e = static_cast<const unsigned char*>(element);
  if (std::all_of(e, e + element_bytes, [e](unsigned char b) { return b == e[0]; })) {
    // One repeated byte (zeros above all): the copy engine's memset.
    Check(cudaMemsetAsync(data, e[0], n * element_bytes, cudaStreamPerThread), "cudaMemsetAsync");
    return;
  }
  switch (element_bytes) {
    case 1: LaunchFill<uint8_t>(data, n, element); break;
    case 2: LaunchFill<uint16_t>(data, n, element); break;
    case 4: LaunchFill<uint32_t>(data, n, element); break;
    case 8: LaunchFill<uint64_t>(data, n, element); break;
  }
  Check(cudaGetLastError(), "fill kernel launch");
}

namespace {

template <typename I>
__global__ void IotaKernel(I* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<I>(i);
  }
}

}  // namespace

void IotaOnDevice(void* data, Dtype dtype, int64_t n, int device) {
  OP_CHECK(dtype == Dtype::kI32 || dtype == Dtype::kI64, "arange", "dtype must be i32 or i64, not ",
           DtypeName(dtype));
  if (n == 0) return;
  Check(cudaSetDevice(device), "cudaSetDevice");
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 32) blocks = 65535 * 32;
  if (dtype == Dtype::kI32) {
    IotaKernel<int32_t><<<static_cast<unsigned>(blocks), threads, 0, cudaStreamPerThread>>>(
        static_cast<int32_t*>(data), n);
  } else {
    IotaKernel<int64_t><<<static_cast<unsigned>(blocks), threads, 0, cudaStreamPerThread>>>(
        static_cast<int64_t*>(data), n);
  }
  Check(cudaGetLastError(), "arange kernel launch");
}

namespace {

// Up to kCastsPerLaunch pairs cut into chunks of kCastChunk elements, passed
// by value (about 2 KiB of launch parameters): block c casts the chunk of
// pair k with first_chunk[k] <= c < first_chunk[k + 1].
constexpr int kCastsPerLaunch = 64;
constexpr int64_t kCastChunk = 1 << 13;
struct CastTable {
  const void* src[kCastsPerLaunch];
  void* dst[kCastsPerLaunch];
  int64_t n[kCastsPerLaunch];
  int64_t first_chunk[kCastsPerLaunch + 1];
  int count;
};

// kCastVec elements as one access (16 bytes of f32, 8 of bf16 / f16).
constexpr int kCastVec = 4;
constexpr int kCastUnroll = 4;

template <typename S, typename D>
__global__ void CastManyKernel(CastTable t) {
  const int64_t c = blockIdx.x;
  int lo = 0, hi = t.count - 1;  // the pair of chunk c
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.first_chunk[mid] <= c) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const S* src = static_cast<const S*>(t.src[lo]);
  D* dst = static_cast<D*>(t.dst[lo]);
  const int64_t begin = (c - t.first_chunk[lo]) * kCastChunk;
  const int64_t end = begin + kCastChunk < t.n[lo] ? begin + kCastChunk : t.n[lo];
  int64_t tail = begin;  // where the one-element loop starts
  // Pairs whose ends are aligned for it (the chunks start at multiples of
  // kCastChunk): kCastVec elements a load and a store, each thread's
  // kCastUnroll loads issued before any of its stores, so that several
  // accesses per thread are in flight (the element loop's iterations each
  // load then store).
  if (reinterpret_cast<uintptr_t>(src) % sizeof(Pack<S, kCastVec>) == 0 &&
      reinterpret_cast<uintptr_t>(dst) % sizeof(Pack<D, kCastVec>) == 0) {
    const int64_t quads = (end - begin) / kCastVec;
    for (int64_t q0 = threadIdx.x; q0 < quads; q0 += int64_t{blockDim.x} * kCastUnroll) {
      float in[kCastUnroll][kCastVec];
#pragma unroll
      for (int u = 0; u < kCastUnroll; ++u) {
        const int64_t q = q0 + u * int64_t{blockDim.x};
        if (q < quads) LoadF<kCastVec>(src + begin + q * kCastVec, in[u]);
      }
#pragma unroll
      for (int u = 0; u < kCastUnroll; ++u) {
        const int64_t q = q0 + u * int64_t{blockDim.x};
        if (q >= quads) break;
        StoreF<kCastVec>(dst + begin + q * kCastVec, in[u]);
      }
    }
    tail = begin + quads * kCastVec;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) dst[i] = FromF<D>(ToF(src[i]));
}

template <typename S, typename D>
void LaunchCastMany(const CastTable& t) {
  CastManyKernel<S, D><<<static_cast<unsigned>(t.first_chunk[t.count]), 256, 0,
                         cudaStreamPerThread>>>(t);
}

template <typename S>
void CastManyFrom(const CastTable& t, Dtype dst) {
  switch (dst) {
    case Dtype::kF32:
      return LaunchCastMany<S, float>(t);
    case Dtype::kBF16:
      return LaunchCastMany<S, __nv_bfloat16>(t);
    case Dtype::kF16:
      return LaunchCastMany<S, __half>(t);
    default:
      ThrowOpError("cast", "a cast on CUDA goes between floating dtypes, not to ", DtypeName(dst));
  }
}

}  // namespace

void CastManyOnDevice(const std::vector<CastPair>& pairs, Dtype src_dtype, Dtype dst_dtype,
                      int device) {
  OP_CHECK(src_dtype != dst_dtype, "cast", "source and destination are both ",
           DtypeName(src_dtype));
  Check(cudaSetDevice(device), "cudaSetDevice");
  CastTable t;
  t.count = 0;
  t.first_chunk[0] = 0;
  auto flush = [&] {
    if (t.count == 0) return;
    switch (src_dtype) {
      case Dtype::kF32:
        CastManyFrom<float>(t, dst_dtype);
        break;
      case Dtype::kBF16:
        CastManyFrom<__nv_bfloat16>(t, dst_dtype);
        break;
      case Dtype::kF16:
        CastManyFrom<__half>(t, dst_dtype);
        break;
      default:
        ThrowOpError("cast", "a cast on CUDA goes between floating dtypes, not from ",
                     DtypeName(src_dtype));
    }
    Check(cudaGetLastError(), "cast kernel launch");
    t.count = 0;
  };
  for (const CastPair& p : pairs) {
    if (p.n == 0) continue;
    const int64_t chunks = (p.n + kCastChunk - 1) / kCastChunk;
    if (t.count == kCastsPerLaunch || t.first_chunk[t.count] + chunks > int64_t{0x7fffffff}) {
      flush();
    }
    t.src[t.count] = p.src;
    t.dst[t.count] = p.dst;
    t.n[t.count] = p.n;
    t.first_chunk[t.count + 1] = t.first_chunk[t.count] + chunks;
    ++t.count;
  }
  flush();
}

}  // namespace cuda
}  // namespace tensor
