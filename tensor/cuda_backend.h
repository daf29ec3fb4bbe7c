// The seam between the device-independent tensor code and the CUDA backend.
// A --config=cuda build links tensor/cuda (real CUDA); any other build links
// tensor/cuda_stub.cc, where every function fails with a message that says
// CUDA support was not built.
#ifndef TENSOR_CUDA_BACKEND_H_
#define TENSOR_CUDA_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string>
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
// cuda:index's name, as cudaGetDeviceProperties gives it ("NVIDIA H100 80GB HBM3").
std::string DeviceName(int index);
// The caching allocator of cuda:index.
Allocator& DeviceAllocator(int index);
// Caps what this process's caching allocator may reserve on cuda:index
// (cudaMalloc'd blocks, live or cached) at `bytes`: a request past it
// releases the cache, retries, then throws OutOfMemoryError naming the limit,
// as running out of the device would. PyTorch's
// torch.cuda.set_per_process_memory_fraction, in bytes: to leave room for
// another process on the GPU, or to see a smaller GPU's out of memory on a
// larger one. -1 (the default): no cap. Throws OpError for a device not
// visible or bytes < -1. Blocks reserved already stay.
void SetDeviceMemoryLimit(int index, int64_t bytes);
// The cap on cuda:index (-1: none).
int64_t DeviceMemoryLimit(int index);
// What this process's caching allocator holds on cuda:index now, in live
// blocks and cached free ones.
int64_t DeviceReservedBytes(int index);
// Frees the caching allocator's free blocks on cuda:index, every thread's
// (after the device finished their last kernels); the bytes freed. Live
// blocks stay. PyTorch's torch.cuda.empty_cache().
int64_t ReleaseCachedDeviceMemory(int index);
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

// ---- Streams, events and device-to-device work on a given stream, for host
// code without CUDA headers (the threads engine's communication streams:
// dist/thread_group.h). Handles are cudaStream_t / cudaEvent_t; a null
// StreamHandle is the calling thread's stream (where the tensor kernels run).
// Each call makes cuda:`device` current first. Failures throw OpError.
using StreamHandle = void*;
using EventHandle = void*;
// A stream that does not synchronize with the legacy default stream.
StreamHandle CreateStream(int device);
void DestroyStream(StreamHandle stream, int device);
// An event without timing (cheap to record and wait for).
EventHandle CreateEvent(int device);
void DestroyEvent(EventHandle event, int device);
void RecordEvent(EventHandle event, StreamHandle stream, int device);
// Later work on `stream` waits for the work `event` captured when recorded.
void StreamWaitEvent(StreamHandle stream, EventHandle event, int device);
// The host waits until the work `event` captured has finished.
void SynchronizeEvent(EventHandle event, int device);
// The host waits until the work queued on `stream` so far has finished.
void SynchronizeStream(StreamHandle stream, int device);
// The host waits for the legacy default stream of cuda:`device`: a plain
// cudaMemcpy from pageable host memory may return before its bytes reach
// the device, and only work ordered after the legacy stream (or this wait)
// is sure to see them; a stream of CreateStream's is not ordered after it.
void SynchronizeLegacyStream(int device);
// `bytes` from src to dst, both in memory of cuda:`device`, queued on `stream`.
void CopyOnStream(void* dst, const void* src, int64_t bytes, int device, StreamHandle stream);
// `bytes` from src in memory of cuda:`device` to page-locked host memory at
// dst, queued on `stream`: the host reads dst after waiting for the stream.
// On a stream of its own the copy does not wait for the kernels queued on
// the thread's stream (as a blocking copy, on the legacy default stream,
// would: it waits for every thread's).
void CopyToHostOnStream(void* dst, const void* src, int64_t bytes, int device,
                        StreamHandle stream);
// `bytes` from page-locked host memory at src to memory of cuda:`device` at
// dst, queued on `stream`: the host may change src once the copy has run
// (an event recorded after it has passed), and work on another stream sees
// dst after waiting for such an event. On a stream of its own the copy waits
// for nothing the thread queued (FSDP's offloaded shards going up while the
// thread's kernels run).
void CopyToDeviceOnStream(void* dst, const void* src, int64_t bytes, int device,
                          StreamHandle stream);
// Queues a copy of `bytes` to memory of cuda:`device` at `dst` on the calling
// thread's stream, and returns without waiting for the GPU: later work on the
// stream sees the bytes. fill(staging) writes them into a page-locked block
// (PinnedHostAllocator's) that is held until the copy has run: later calls
// give back the blocks of the copies that are done before taking one, and
// the thread's exit waits for the rest.
void CopyToDeviceQueued(void* dst, int64_t bytes, int device,
                        const std::function<void(void* staging)>& fill);

// ---- Deferred checks: PyTorch's device-side asserts, with the messages of the
// host's checks. A kernel on the calling thread's stream writes a check's
// outcome to `n_words` (1 to kMaxCheckWords) int64 words of memory of
// cuda:`device`; DeferCheck queues their copy to page-locked memory and
// returns without waiting. The words may be freed at once only when they came
// from the calling thread's caching allocator on that device (a Tensor made on
// this thread: its next use of the block is queued behind the copy); other
// memory must live until the copy has run. The thread reads them after its
// next wait for the GPU that reports (RaiseDeferredChecks, which the backend's
// own waits call: reading a loss, a gradient norm or the loss scale's flag,
// a reduction's value, a tensor copied to the host), where describe(words)
// gives "" for a check that passed and the error otherwise, thrown as an
// OpError of `op` (a string literal). Waits that do not report (SynchronizeStream,
// SynchronizeEvent, device-to-device copies, another thread's waits) leave it
// to the next one that does. Until then the kernels that use the checked
// values must stay in bounds (an embedding's out-of-range id gathers zeros).
constexpr int kMaxCheckWords = 4;
void DeferCheck(const char* op, int device, const void* words, int n_words,
                std::function<std::string(const int64_t* words)> describe);
// Throws the first failed check (in queuing order) of this thread on
// cuda:`device` whose words have arrived; with `wait`, waits for every pending
// check first (the optimizers do, so a step is never applied while a check of
// its inputs is pending: a wait only when one is). Checks left at the thread's
// exit are read then, and failures printed to stderr.
void RaiseDeferredChecks(int device, bool wait);
// The device twin of the CPU collectives' arithmetic
// (dist/cpu_reduce.h ReduceBuffers), with the same results: for i in
// [0, count), v = op(inputs[0][i], inputs[1][i], ...) combined in order (avg =
// sum / inputs.size(); f16 and bf16 accumulate in f32 and round once; integer
// sums wrap; max/min propagate NaN), then outputs[j][i] = v for every j. An
// output may be one of the inputs; otherwise they must not overlap. At most
// kMaxReduceBuffers inputs and as many outputs, all on cuda:`device`; queued
// on `stream`. Avg of an integer dtype fails.
enum class BufferReduceOp { kSum, kAvg, kMax, kMin };
constexpr int kMaxReduceBuffers = 32;
void ReduceBuffersOnDevice(Dtype dtype, BufferReduceOp op, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs, int64_t count, int device,
                           StreamHandle stream);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_BACKEND_H_
