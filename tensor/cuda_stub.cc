// CUDA backend stand-in linked by builds without --config=cuda.
#include "tensor/cuda_backend.h"
#include "tensor/error.h"

namespace tensor {
namespace cuda {

namespace {
constexpr char kNotBuilt[] =
    "CUDA support was not built into this binary; rebuild with --config=cuda";
}

bool Built() { return false; }
int DeviceCount() { return 0; }
int ComputeCapability(int index) { ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")"); }
std::string DeviceName(int index) { ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")"); }
Allocator& DeviceAllocator(int index) { ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")"); }
void SetDeviceMemoryLimit(int index, int64_t) {
  ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")");
}
int64_t DeviceMemoryLimit(int index) { ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")"); }
int64_t DeviceReservedBytes(int index) { ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")"); }
int64_t ReleaseCachedDeviceMemory(int index) {
  ThrowOpError("cuda", kNotBuilt, " (cuda:", index, ")");
}
Allocator* PinnedHostAllocator() { return nullptr; }
bool IsPinnedHost(const void*) { return false; }
void CopyBytes(void*, Device dst_device, const void*, Device src_device, int64_t) {
  ThrowOpError("copy", kNotBuilt, " (", src_device.ToString(), " -> ", dst_device.ToString(), ")");
}

void CopyToDeviceQueued(void*, int64_t, int device, const std::function<void(void*)>&) {
  ThrowOpError("copy", kNotBuilt, " (cpu -> cuda:", device, ")");
}

void DeferCheck(const char* op, int device, const void*, int,
                std::function<std::string(const int64_t*)>) {
  ThrowOpError(op, kNotBuilt, " (cuda:", device, ")");
}

void RaiseDeferredChecks(int, bool) {}  // no GPU, no checks

void CopyStridedOnDevice(const DeviceView&, const DeviceView&, int device) {
  ThrowOpError("copy", kNotBuilt, " (cuda:", device, ")");
}

void FillOnDevice(void*, int64_t, const void*, int, int device) {
  ThrowOpError("fill", kNotBuilt, " (cuda:", device, ")");
}

void IotaOnDevice(void*, Dtype, int64_t, int device) {
  ThrowOpError("arange", kNotBuilt, " (cuda:", device, ")");
}

void CastManyOnDevice(const std::vector<CastPair>&, Dtype, Dtype, int device) {
  ThrowOpError("cast", kNotBuilt, " (cuda:", device, ")");
}

StreamHandle CreateStream(int device) {
  ThrowOpError("stream", kNotBuilt, " (cuda:", device, ")");
}
void DestroyStream(StreamHandle, int) {}
EventHandle CreateEvent(int device) { ThrowOpError("event", kNotBuilt, " (cuda:", device, ")"); }
void DestroyEvent(EventHandle, int) {}
void RecordEvent(EventHandle, StreamHandle, int device) {
  ThrowOpError("event", kNotBuilt, " (cuda:", device, ")");
}
void StreamWaitEvent(StreamHandle, EventHandle, int device) {
  ThrowOpError("event", kNotBuilt, " (cuda:", device, ")");
}
void SynchronizeEvent(EventHandle, int device) {
  ThrowOpError("event", kNotBuilt, " (cuda:", device, ")");
}
void SynchronizeStream(StreamHandle, int device) {
  ThrowOpError("stream", kNotBuilt, " (cuda:", device, ")");
}
void CopyOnStream(void*, const void*, int64_t, int device, StreamHandle) {
  ThrowOpError("copy", kNotBuilt, " (cuda:", device, ")");
}
void SynchronizeLegacyStream(int device) {
  ThrowOpError("synchronize", kNotBuilt, " (cuda:", device, ")");
}
void CopyToHostOnStream(void*, const void*, int64_t, int device, StreamHandle) {
  ThrowOpError("copy", kNotBuilt, " (cuda:", device, ")");
}
void CopyToDeviceOnStream(void*, const void*, int64_t, int device, StreamHandle) {
  ThrowOpError("copy", kNotBuilt, " (cuda:", device, ")");
}
void ReduceBuffersOnDevice(Dtype, BufferReduceOp, const std::vector<const void*>&,
                           const std::vector<void*>&, int64_t, int device, StreamHandle) {
  ThrowOpError("reduce", kNotBuilt, " (cuda:", device, ")");
}

}  // namespace cuda
}  // namespace tensor
