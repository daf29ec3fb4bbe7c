// Streams, events, copies on a given stream and the multi-buffer reduction of
// the CUDA backend seam (tensor/cuda_backend.h): what the threads engine needs
// to run collectives of ranks sharing a GPU on a communication stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "tensor/cuda/backend_errors.cuh"
#include "tensor/cuda/thread_device_slot.h"
#include "tensor/cuda_backend.h"
#include "tensor/error.h"

namespace tensor {
namespace cuda {
namespace {

using backend::Check;

cudaStream_t AsStream(StreamHandle s) {
  return s == nullptr ? cudaStreamPerThread : static_cast<cudaStream_t>(s);
}

}  // namespace

StreamHandle CreateStream(int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void DestroyStream(StreamHandle stream, int device) {
  if (stream == nullptr) return;
  // Errors are ignored: at process exit the runtime may be gone.
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaStreamDestroy(static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    cudaGetLastError();
  }
}

EventHandle CreateEvent(int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  cudaEvent_t e = nullptr;
  Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return e;
}

void DestroyEvent(EventHandle event, int device) {
  if (event == nullptr) return;
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) {
    cudaGetLastError();
  }
}

void RecordEvent(EventHandle event, StreamHandle stream, int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  Check(cudaEventRecord(static_cast<cudaEvent_t>(event), AsStream(stream)), "cudaEventRecord");
}

void StreamWaitEvent(StreamHandle stream, EventHandle event, int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  Check(cudaStreamWaitEvent(AsStream(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}

void SynchronizeEvent(EventHandle event, int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  Check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}

void SynchronizeStream(StreamHandle stream, int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  Check(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

void SynchronizeLegacyStream(int device) {
  Check(cudaSetDevice(device), "cudaSetDevice");
  Check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}

namespace {

void CopyAsync(void* dst, const void* src, int64_t bytes, int device, StreamHandle stream,
               cudaMemcpyKind kind) {
  if (bytes == 0) return;
  Check(cudaSetDevice(device), "cudaSetDevice");
  Check(cudaMemcpyAsync(dst, src, bytes, kind, AsStream(stream)), "cudaMemcpyAsync");
}

}  // namespace

void CopyOnStream(void* dst, const void* src, int64_t bytes, int device, StreamHandle stream) {
  CopyAsync(dst, src, bytes, device, stream, cudaMemcpyDeviceToDevice);
}

void CopyToHostOnStream(void* dst, const void* src, int64_t bytes, int device,
                        StreamHandle stream) {
  CopyAsync(dst, src, bytes, device, stream, cudaMemcpyDeviceToHost);
}

void CopyToDeviceOnStream(void* dst, const void* src, int64_t bytes, int device,
                          StreamHandle stream) {
  CopyAsync(dst, src, bytes, device, stream, cudaMemcpyHostToDevice);
}

namespace {

// This thread's queued host -> device copies on one device: each copy's event
// and its page-locked staging block, held until the event has passed and then
// given back to the pinned allocator. Events are reused.
class QueuedUploads {
 public:
  QueuedUploads(int device, Allocator& pinned) : device_(device), pinned_(pinned) {}
  QueuedUploads(const QueuedUploads&) = delete;
  QueuedUploads& operator=(const QueuedUploads&) = delete;
  // At the thread's exit: the blocks go back once their copies have run.
  // Errors are ignored (at process exit the runtime may be gone).
  ~QueuedUploads() {
    if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
    for (const Pending& p : pending_) {
      if (cudaEventSynchronize(p.event) != cudaSuccess) cudaGetLastError();
      pinned_.Deallocate(p.block, p.bytes);
      free_.push_back(p.event);
    }
    for (cudaEvent_t e : free_) {
      if (cudaEventDestroy(e) != cudaSuccess) cudaGetLastError();
    }
  }

  // Gives back the blocks of the copies that have run (in queue order: a
  // stream runs them in order), without waiting for the others.
  void ReleaseFinished() {
    while (!pending_.empty()) {
      const cudaError_t done = cudaEventQuery(pending_.front().event);
      if (done == cudaErrorNotReady) {
        backend::ClearNotReady();
        return;
      }
      Check(done, "cudaEventQuery");
      const Pending& p = pending_.front();
      pinned_.Deallocate(p.block, p.bytes);
      free_.push_back(p.event);
      pending_.pop_front();
    }
  }

  void Queue(void* dst, int64_t bytes, const std::function<void(void*)>& fill) {
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      free_.push_back(e);
    }
    pending_.push_back(Pending{free_.back(), pinned_.Allocate(bytes), bytes});
    free_.pop_back();
    Pending& p = pending_.back();
    cudaError_t err = cudaSuccess;
    try {
      fill(p.block);
      err = cudaMemcpyAsync(dst, p.block, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread);
      if (err == cudaSuccess) err = cudaEventRecord(p.event, cudaStreamPerThread);
    } catch (...) {
      Drop();
      throw;
    }
    if (err != cudaSuccess) {
      Drop();
      Check(err, "queuing a host -> device copy");
    }
  }

 private:
  struct Pending {
    cudaEvent_t event;
    void* block;
    int64_t bytes;
  };

  // Takes back the newest entry, whose copy may have been queued: the stream
  // finishes first so that the block is free to reuse.
  void Drop() {
    if (cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) cudaGetLastError();
    pinned_.Deallocate(pending_.back().block, pending_.back().bytes);
    free_.push_back(pending_.back().event);
    pending_.pop_back();
  }

  const int device_;
  Allocator& pinned_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace

void CopyToDeviceQueued(void* dst, int64_t bytes, int device,
                        const std::function<void(void* staging)>& fill) {
  if (bytes == 0) return;
  Allocator* pinned = PinnedHostAllocator();
  if (pinned == nullptr) ThrowOpError("copy", "no CUDA device to queue a copy to cuda:", device);
  Check(cudaSetDevice(device), "cudaSetDevice");
  QueuedUploads* uploads = ThreadDeviceSlot<QueuedUploads>(
      device, [device, pinned] { return std::make_unique<QueuedUploads>(device, *pinned); });
  uploads->ReleaseFinished();  // first: their blocks serve this copy
  uploads->Queue(dst, bytes, fill);
}

namespace {

// The buffers of one launch, passed by value (about 520 bytes of parameters).
struct ReduceTable {
  const void* in[kMaxReduceBuffers];
  void* out[kMaxReduceBuffers];
  int num_in;
  int num_out;
};

// Accumulator: f32 for the floating dtypes, int64 for the integers (as on the
// CPU, dist/cpu_reduce.cc).
template <typename T>
using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, float>;

template <typename T>
__device__ __forceinline__ Acc<T> Load(const T* p) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(*p);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(*p);
  } else {
    return static_cast<Acc<T>>(*p);
  }
}

template <typename T>
__device__ __forceinline__ void Store(T* p, Acc<T> v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *p = __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    *p = __float2half_rn(v);
  } else {
    *p = static_cast<T>(v);  // integers wrap (two's complement), as on the CPU
  }
}

__device__ __forceinline__ float Combine(BufferReduceOp op, float a, float b) {
  switch (op) {
    case BufferReduceOp::kMax:
      return (b > a || isnan(b)) ? b : a;
    case BufferReduceOp::kMin:
      return (b < a || isnan(b)) ? b : a;
    default:
      return a + b;
  }
}

__device__ __forceinline__ int64_t Combine(BufferReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case BufferReduceOp::kMax:
      return a > b ? a : b;
    case BufferReduceOp::kMin:
      return a < b ? a : b;
    default:
      return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
}

template <typename T>
__global__ void ReduceBuffersKernel(ReduceTable t, int64_t count, BufferReduceOp op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    Acc<T> acc = Load(static_cast<const T*>(t.in[0]) + i);
    for (int j = 1; j < t.num_in; ++j) acc = Combine(op, acc, Load(static_cast<const T*>(t.in[j]) + i));
    if constexpr (!std::is_integral_v<T>) {
      if (op == BufferReduceOp::kAvg) acc /= static_cast<float>(t.num_in);
    }
    for (int j = 0; j < t.num_out; ++j) Store(static_cast<T*>(t.out[j]) + i, acc);
  }
}

template <typename T>
void LaunchReduce(const ReduceTable& t, int64_t count, BufferReduceOp op, cudaStream_t stream) {
  const int threads = 256;
  int64_t blocks = (count + threads - 1) / threads;
  if (blocks > 65535 * 32) blocks = 65535 * 32;
  ReduceBuffersKernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(t, count, op);
}

}  // namespace

void ReduceBuffersOnDevice(Dtype dtype, BufferReduceOp op, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs, int64_t count, int device,
                           StreamHandle stream) {
  const int num_in = static_cast<int>(inputs.size());
  const int num_out = static_cast<int>(outputs.size());
  OP_CHECK(num_in >= 1 && num_in <= kMaxReduceBuffers, "reduce", "between 1 and ",
           kMaxReduceBuffers, " inputs on CUDA, not ", num_in);
  OP_CHECK(num_out <= kMaxReduceBuffers, "reduce", "at most ", kMaxReduceBuffers,
           " outputs on CUDA, not ", num_out);
  const bool integral = dtype == Dtype::kI32 || dtype == Dtype::kI64 || dtype == Dtype::kU8;
  OP_CHECK(!(integral && op == BufferReduceOp::kAvg), "reduce",
           "avg needs a floating-point dtype, not ", DtypeName(dtype));
  if (count <= 0 || num_out == 0) return;
  ReduceTable t{};
  for (int j = 0; j < num_in; ++j) t.in[j] = inputs[j];
  for (int j = 0; j < num_out; ++j) t.out[j] = outputs[j];
  t.num_in = num_in;
  t.num_out = num_out;
  Check(cudaSetDevice(device), "cudaSetDevice");
  const cudaStream_t s = AsStream(stream);
  switch (dtype) {
    case Dtype::kF32:
      LaunchReduce<float>(t, count, op, s);
      break;
    case Dtype::kBF16:
      LaunchReduce<__nv_bfloat16>(t, count, op, s);
      break;
    case Dtype::kF16:
      LaunchReduce<__half>(t, count, op, s);
      break;
    case Dtype::kI32:
      LaunchReduce<int32_t>(t, count, op, s);
      break;
    case Dtype::kI64:
      LaunchReduce<int64_t>(t, count, op, s);
      break;
    case Dtype::kU8:
      LaunchReduce<uint8_t>(t, count, op, s);
      break;
  }
  Check(cudaGetLastError(), "reduce kernel launch");
}

}  // namespace cuda
}  // namespace tensor
