// The CUDA runtime API of the CPU emulation (see cuda_emu.h): sm_90
// stand-ins whose memory is host memory, cuda:0 only unless CUDA_EMU_DEVICES
// says more (pending.h). Work on a thread's default stream is done when it is
// issued; what the emulated NCCL leaves pending until its peers come, and
// the work issued on streams the program created, deferred until something
// waits for it, stay queued (pending.h): events time what happened between
// them and capture pending work, and the
// runtime checks what a GPU would refuse: copies whose kind does not match
// where the pointers live, frees of unknown pointers, devices that do not
// exist, kernels and event records on another device's stream (streams and
// events belong to a device; each device has its own default streams). It
// also counts what costs time on a GPU beyond the kernels (counters.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "third_party/cuda/emu/counters.h"
#include "third_party/cuda/emu/counters_state.h"
#include "third_party/cuda/emu/fiber.h"
#include "third_party/cuda/emu/pending.h"
#include "third_party/cuda/emu/stream_device.h"

namespace cuda_emu {

using internal::Count;

namespace {

// Whether work this host thread queued (kernels, asynchronous copies and
// memsets) may still be running on a GPU. Each thread of this project issues
// on its own per-thread default stream, so this is that stream's state.
thread_local bool g_work_queued = false;

void Queued() { g_work_queued = true; }

// The host waits for the stream to drain: a wait with nothing queued costs
// nothing and is not counted.
void Wait() {
  if (g_work_queued) ++Count().host_syncs;
  g_work_queued = false;
}

constexpr size_t kDeviceBytes = size_t{16} << 30;  // what cuda:0 reports and allows
constexpr int kSmCount = 132;

enum class Kind { kDevice, kPinned };
struct Allocation {
  size_t bytes;
  Kind kind;
  int device;  // current when allocated
};

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Allocation> blocks;  // by start address
  size_t device_bytes = 0;
};
Memory& Mem() {
  static Memory* m = new Memory;
  return *m;
}

thread_local cudaError_t g_last_error = cudaSuccess;
thread_local int g_device = 0;

// What cudaFuncSetAttribute set, per kernel (as on a GPU, for the process).
struct FuncLimits {
  std::mutex mu;
  std::map<const void*, size_t> max_dynamic_shared;
};
FuncLimits& Limits() {
  static FuncLimits* f = new FuncLimits;
  return *f;
}

cudaError_t Fail(cudaError_t err) {
  g_last_error = err;
  return err;
}

// Where p points: a device allocation, a pinned host allocation, or neither.
bool Find(const void* p, Kind* kind, int* device = nullptr) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = m.blocks.upper_bound(addr);
  if (it == m.blocks.begin()) return false;
  --it;
  if (addr >= it->first + std::max<size_t>(it->second.bytes, 1)) return false;
  *kind = it->second.kind;
  if (device != nullptr) *device = it->second.device;
  return true;
}
bool OnDevice(const void* p) {
  Kind k;
  return Find(p, &k) && k == Kind::kDevice;
}

void* Allocate(size_t bytes, Kind kind) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  if (kind == Kind::kDevice && m.device_bytes + bytes > kDeviceBytes) return nullptr;
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (p == nullptr) return nullptr;
  // Fresh device memory is not zero on a GPU either: all-ones bytes (NaN in
  // every float type) make a kernel that reads what nobody wrote fail.
  if (kind == Kind::kDevice) std::memset(p, 0xff, bytes);
  m.blocks[reinterpret_cast<uintptr_t>(p)] = {bytes, kind, g_device};
  if (kind == Kind::kDevice) m.device_bytes += bytes;
  return p;
}

cudaError_t Release(void* p, Kind kind) {
  if (p == nullptr) return cudaSuccess;
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.blocks.end() || it->second.kind != kind) return Fail(cudaErrorInvalidValue);
  if (kind == Kind::kDevice) m.device_bytes -= it->second.bytes;
  m.blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}

// The kind says where each side lives; cudaMemcpyDefault infers it. Which
// copies make the host wait follows the runtime's "API synchronization
// behavior": a synchronous copy between host and device always does (from
// pageable memory the stream is synchronized before the copy starts); an
// asynchronous one does when the device copies into pageable host memory.
// A wait counts only when work was queued (Wait). An asynchronous copy runs
// in `stream`'s order: deferred where the stream defers (pending.h) when both
// sides are device or pinned memory; from or to pageable memory it is made at
// the call, after the stream's work (the runtime stages pageable memory before
// the call returns).
cudaError_t Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool async,
                 cudaStream_t stream = nullptr) {
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  Kind dst_kind = Kind::kPinned, src_kind = Kind::kPinned;
  const bool dst_known = Find(dst, &dst_kind), src_known = Find(src, &src_kind);
  const bool dst_dev = dst_known && dst_kind == Kind::kDevice;
  const bool src_dev = src_known && src_kind == Kind::kDevice;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = !dst_dev && !src_dev; break;
    case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = !dst_dev && src_dev; break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyDefault: break;
    default: ok = false;
  }
  if (!ok) {
    std::fprintf(stderr, "cuda_emu: cudaMemcpy kind %d does not match the pointers (dst %s, src %s)\n",
                 static_cast<int>(kind), dst_dev ? "device" : "host", src_dev ? "device" : "host");
    return Fail(cudaErrorInvalidValue);
  }
  if (src_dev && !dst_dev) {
    ++Count().copies_to_host;
    if (!async || !dst_known) Wait();  // dst_known: pinned
    else Queued();
  } else if (dst_dev && !src_dev) {
    ++Count().copies_to_device;
    if (!async) Wait();
    else Queued();
  } else if (dst_dev || src_dev) {
    Queued();  // device to device: never waits
  }
  const bool moves = MovesBytes(n) || !(dst_dev || src_dev);
  if (async && dst_known && src_known) {
    RunOnStream(stream, [dst, src, n, moves] {
      if (moves) std::memmove(dst, src, n);
    });
    return cudaSuccess;
  }
  if (async) WaitForStream(stream);
  if (moves) std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t CheckDevice(int device) {
  return device >= 0 && device < DeviceCount() ? cudaSuccess : Fail(cudaErrorInvalidDevice);
}

using PendingList = std::vector<std::shared_ptr<PendingWork>>;

// Streams and events belong to the device current when they were made (the
// CUDA programming guide's "Stream and Event Behavior"): a kernel launched on
// a stream of another device fails, as does an event recorded on one, while a
// stream may wait for another device's event.
struct Event {
  int device = 0;
  bool recorded = false;
  bool timing = true;
  std::chrono::steady_clock::time_point at;
  PendingList captured;  // the stream's pending work when recorded
};

struct Stream {
  int device = 0;
};

// Pending work by stream (pending.h). The per-thread default stream is a
// different stream on every thread and device: its key is the address of one
// of the thread's thread_local bytes, one a device.
struct PendingStreams {
  std::mutex mu;
  std::map<const void*, PendingList> by_stream;
  std::map<const void*, int> per_thread;  // the keys of threads' default streams: their device
};
PendingStreams& Pendings() {
  static PendingStreams* p = new PendingStreams;
  return *p;
}
constexpr int kMaxDevices = 8;  // DeviceCount's limit
thread_local char g_per_thread_stream_keys[kMaxDevices];
char g_legacy_stream_keys[kMaxDevices];  // one legacy stream a device, for every thread

const void* StreamKey(cudaStream_t s) {
  if (s == cudaStreamPerThread) return &g_per_thread_stream_keys[g_device];
  if (s == nullptr || s == cudaStreamLegacy) return &g_legacy_stream_keys[g_device];
  return s;
}

// The device whose legacy stream `key` is, or -1.
int LegacyStreamDevice(const void* key) {
  const char* k = static_cast<const char*>(key);
  if (k < g_legacy_stream_keys || k >= g_legacy_stream_keys + kMaxDevices) return -1;
  return static_cast<int>(k - g_legacy_stream_keys);
}

// The device `s` belongs to: a created stream's own; the default streams are
// the current device's.
int StreamDevice(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return g_device;
  return reinterpret_cast<const Stream*>(s)->device;
}

// The unfinished work queued under `key` (finished work is dropped). With
// p.mu held.
PendingList UnfinishedLocked(PendingStreams& p, const void* key) {
  auto it = p.by_stream.find(key);
  if (it == p.by_stream.end()) return {};
  PendingList& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w->done(); }),
             list.end());
  if (list.empty()) {
    p.by_stream.erase(it);
    return {};
  }
  return list;
}

// The unfinished work queued on `s`.
PendingList Unfinished(cudaStream_t s) {
  PendingStreams& p = Pendings();
  std::lock_guard<std::mutex> lock(p.mu);
  return UnfinishedLocked(p, StreamKey(s));
}

void AddPending(cudaStream_t s, const PendingList& works) {
  if (works.empty()) return;
  PendingStreams& p = Pendings();
  std::lock_guard<std::mutex> lock(p.mu);
  const void* key = StreamKey(s);
  if (s == cudaStreamPerThread) p.per_thread[key] = g_device;
  PendingList& list = p.by_stream[key];
  list.insert(list.end(), works.begin(), works.end());
}

void WaitAll(const PendingList& works) {
  for (const auto& w : works) w->Wait();
}

}  // namespace

size_t MaxDynamicSharedBytes(const void* kernel) {
  FuncLimits& f = Limits();
  std::lock_guard<std::mutex> lock(f.mu);
  const auto it = f.max_dynamic_shared.find(kernel);
  return it == f.max_dynamic_shared.end() ? kDefaultDynamicShared : it->second;
}

int DeviceCount() {
  static const int count = [] {
    const char* env = std::getenv("CUDA_EMU_DEVICES");
    const int n = env != nullptr ? std::atoi(env) : 1;
    return std::clamp(n, 1, kMaxDevices);
  }();
  return count;
}

void QueuePending(cudaStream_t stream, std::shared_ptr<PendingWork> work) {
  AddPending(stream, {std::move(work)});
}

void RunDeferredOnBlockingStreams(std::initializer_list<const void*> memory = {});

void WaitForStream(cudaStream_t stream) {
  // The legacy default stream also waits for the blocking streams.
  if (stream == nullptr || stream == cudaStreamLegacy) RunDeferredOnBlockingStreams();
  WaitAll(Unfinished(stream));
}

DeferMode DeferModeNow() {
  static const DeferMode mode = [] {
    const char* env = std::getenv("CUDA_EMU_DEFER");
    if (env == nullptr || std::strcmp(env, "created") == 0) return DeferMode::kCreated;
    if (std::strcmp(env, "all") == 0) return DeferMode::kAll;
    if (std::strcmp(env, "none") == 0) return DeferMode::kNone;
    std::fprintf(stderr, "cuda_emu: CUDA_EMU_DEFER must be none, created or all; got '%s'\n",
                 env);
    std::abort();
  }();
  return mode;
}

bool KernelsRun() {
  static const bool run = [] {
    const char* env = std::getenv("CUDA_EMU_KERNELS");
    if (env == nullptr || std::strcmp(env, "run") == 0) return true;
    if (std::strcmp(env, "skip") == 0) return false;
    std::fprintf(stderr, "cuda_emu: CUDA_EMU_KERNELS must be run or skip; got '%s'\n", env);
    std::abort();
  }();
  return run;
}

bool DefersWork(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy) return false;
  if (stream == cudaStreamPerThread) return DeferModeNow() == DeferMode::kAll;
  return DeferModeNow() != DeferMode::kNone;
}

void Defer(cudaStream_t stream, std::function<void()> run) {
  const int device = g_device;
  PendingStreams& p = Pendings();
  std::lock_guard<std::mutex> lock(p.mu);
  const void* key = StreamKey(stream);
  if (stream == cudaStreamPerThread) p.per_thread[key] = device;
  auto work = std::make_shared<PendingWork>(
      [run = std::move(run), device] {
        const int saved = g_device;
        g_device = device;
        run();
        g_device = saved;
      },
      UnfinishedLocked(p, key));
  // The new work waits for everything unfinished on the stream, so it alone
  // stands for all of it.
  p.by_stream[key] = {std::move(work)};
}

void RunOnStream(cudaStream_t stream, std::function<void()> run) {
  if (DefersWork(stream)) {
    Defer(stream, std::move(run));
    return;
  }
  WaitForStream(stream);
  run();
}

void LaunchOnStream(cudaStream_t stream, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                    std::function<void()> body, const char* name) {
  if (!CheckLaunchConfig(grid, block, dynamic_shared_bytes)) return;
  if (StreamDevice(stream) != g_device &&
      !StreamOnCurrentDevice(stream, (std::string("kernel ") + name + " launched").c_str())) {
    return;
  }
  CountLaunch(name);  // when issued, deferred or not
  if (!KernelsRun()) {
    RunOnStream(stream, [] {});
    return;
  }
  RunOnStream(stream, [grid, block, dynamic_shared_bytes, body = std::move(body)] {
    Launch(grid, block, dynamic_shared_bytes, body);
  });
}

// Deferred work not yet started among `works` runs now, as a GPU would get
// to it (queries must not spin forever on work nobody else will run).
void RunDeferred(const PendingList& works) {
  for (const auto& w : works) {
    if (w->deferred()) w->Wait();
  }
}

void RunDeferredOn(cudaStream_t stream) { RunDeferred(Unfinished(stream)); }

// What the current device's legacy default stream waits for before its work
// (CUDA_EMU_DEFER=all): the work deferred on every thread's default stream of
// that device (they are blocking streams); the program's streams are created
// non-blocking. A copy or memset there that touches `memory` of other devices
// waits for theirs too (the CUDA programming guide, "Peer-to-Peer Memory
// Copy": a copy in the implicit NULL stream between two devices waits for
// the earlier work of both); other devices' streams are not waited for.
void RunDeferredOnBlockingStreams(std::initializer_list<const void*> memory) {
  if (DeferModeNow() != DeferMode::kAll) return;
  std::set<int> devices = {g_device};
  for (const void* p : memory) {
    Kind kind;
    int device = 0;
    if (Find(p, &kind, &device) && kind == Kind::kDevice) devices.insert(device);
  }
  PendingList blocking;
  {
    PendingStreams& p = Pendings();
    std::lock_guard<std::mutex> lock(p.mu);
    for (const auto& [key, device] : p.per_thread) {
      if (devices.count(device) == 0) continue;
      const PendingList list = UnfinishedLocked(p, key);
      blocking.insert(blocking.end(), list.begin(), list.end());
    }
  }
  RunDeferred(blocking);
}

// Everything pending on `device`'s streams.
PendingList PendingOnDevice(int device) {
  PendingList all;
  PendingStreams& p = Pendings();
  std::lock_guard<std::mutex> lock(p.mu);
  for (const auto& [key, list] : p.by_stream) {
    int on = device;
    if (const auto it = p.per_thread.find(key); it != p.per_thread.end()) {
      on = it->second;
    } else if (const int legacy = LegacyStreamDevice(key); legacy >= 0) {
      on = legacy;
    } else {
      on = static_cast<const Stream*>(key)->device;  // a created stream (destroyed: erased)
    }
    if (on == device) all.insert(all.end(), list.begin(), list.end());
  }
  return all;
}

// Everything pending on every stream.
PendingList AllPending() {
  PendingList all;
  PendingStreams& p = Pendings();
  std::lock_guard<std::mutex> lock(p.mu);
  for (const auto& [key, list] : p.by_stream) all.insert(all.end(), list.begin(), list.end());
  return all;
}

void SetLastError(cudaError_t err) { g_last_error = err; }

bool StreamOnCurrentDevice(cudaStream_t stream, const char* what, bool sets_last_error) {
  const int device = StreamDevice(stream);
  if (device == g_device) return true;
  std::fprintf(stderr, "cuda_emu: %s on a stream of cuda:%d with cuda:%d current\n", what, device,
               g_device);
  if (sets_last_error) SetLastError(cudaErrorInvalidResourceHandle);
  return false;
}

int CreatedStreamDevice(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return -1;
  return StreamDevice(stream);
}

void CountLaunch(const char* name) {
  ++Count().kernel_launches;
  Queued();
  internal::AddToCensus(name);
}

void CountMemset() { ++Count().memsets; }

}  // namespace cuda_emu

using cuda_emu::Fail;

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = cuda_emu::g_last_error;
  cuda_emu::g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return cuda_emu::g_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error (cuda_emu)";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = cuda_emu::DeviceCount();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (cuda_emu::CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  cuda_emu::g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = cuda_emu::g_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  cuda_emu::WaitAll(cuda_emu::PendingOnDevice(cuda_emu::g_device));
  cuda_emu::Wait();
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (cuda_emu::CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "cuda_emu (sm_90 emulated on the CPU)");
  prop->totalGlobalMem = cuda_emu::kDeviceBytes;
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = cuda_emu::kSmCount;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (cuda_emu::CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = cuda_emu::kSmCount; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    default: return Fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return Fail(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > (227 << 10)) return Fail(cudaErrorInvalidValue);
    cuda_emu::FuncLimits& f = cuda_emu::Limits();
    std::lock_guard<std::mutex> lock(f.mu);
    f.max_dynamic_shared[func] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  cuda_emu::Memory& m = cuda_emu::Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *total = cuda_emu::kDeviceBytes;
  *free_bytes = cuda_emu::kDeviceBytes - m.device_bytes;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  ++cuda_emu::Count().device_allocs;
  *p = cuda_emu::Allocate(bytes, cuda_emu::Kind::kDevice);
  return *p != nullptr ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  ++cuda_emu::Count().device_frees;
  // cudaFree waits for the device: deferred work runs first.
  cuda_emu::RunDeferred(cuda_emu::AllPending());
  cuda_emu::Wait();
  return cuda_emu::Release(p, cuda_emu::Kind::kDevice);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  ++cuda_emu::Count().pinned_allocs;
  *p = cuda_emu::Allocate(bytes, cuda_emu::Kind::kPinned);
  return *p != nullptr ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void* p) { return cuda_emu::Release(p, cuda_emu::Kind::kPinned); }

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  std::memset(attr, 0, sizeof(*attr));
  cuda_emu::Kind kind;
  int device = 0;
  if (!cuda_emu::Find(p, &kind, &device)) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -1;
    attr->hostPointer = const_cast<void*>(p);
    return cudaSuccess;
  }
  attr->type = kind == cuda_emu::Kind::kDevice ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attr->device = device;
  if (kind == cuda_emu::Kind::kDevice) {
    attr->devicePointer = const_cast<void*>(p);
  } else {
    attr->hostPointer = const_cast<void*>(p);
    attr->devicePointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  cuda_emu::RunDeferredOnBlockingStreams({dst, src});  // the legacy default stream's order
  return cuda_emu::Copy(dst, src, n, kind, /*async=*/false);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy) {
    cuda_emu::RunDeferredOnBlockingStreams({dst, src});
  }
  return cuda_emu::Copy(dst, src, n, kind, /*async=*/true, stream);
}
cudaError_t cudaMemset(void* p, int value, size_t n) {
  if (n == 0) return cudaSuccess;
  cuda_emu::RunDeferredOnBlockingStreams({p});
  if (!cuda_emu::OnDevice(p)) return Fail(cudaErrorInvalidValue);
  if (cuda_emu::MovesBytes(n)) std::memset(p, value, n);
  cuda_emu::Queued();  // a device memset does not wait, even the synchronous one
  cuda_emu::CountMemset();
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!cuda_emu::OnDevice(p)) return Fail(cudaErrorInvalidValue);
  cuda_emu::Queued();  // never waits
  cuda_emu::CountMemset();
  cuda_emu::RunOnStream(stream, [p, value, n] {
    if (cuda_emu::MovesBytes(n)) std::memset(p, value, n);
  });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  auto* stream = new cuda_emu::Stream;
  stream->device = cuda_emu::g_device;
  *s = reinterpret_cast<cudaStream_t>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  // As on a GPU, work still queued on a destroyed stream goes on (deferred
  // work runs now); nothing can name the stream any more.
  cuda_emu::RunDeferred(cuda_emu::Unfinished(s));
  {
    cuda_emu::PendingStreams& p = cuda_emu::Pendings();
    std::lock_guard<std::mutex> lock(p.mu);
    p.by_stream.erase(s);
  }
  delete reinterpret_cast<cuda_emu::Stream*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  cuda_emu::WaitForStream(s);
  cuda_emu::Wait();
  return cudaSuccess;
}
// A "not ready" answer is left as the thread's last error, as PyTorch
// assumes CUDA may (it clears it after its event queries): code that does not
// clear it fails its next launch check here, as it may on a GPU.
cudaError_t cudaStreamQuery(cudaStream_t s) {
  cuda_emu::RunDeferred(cuda_emu::Unfinished(s));
  return cuda_emu::Unfinished(s).empty() ? cudaSuccess : Fail(cudaErrorNotReady);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  cuda_emu::AddPending(s, reinterpret_cast<cuda_emu::Event*>(e)->captured);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  auto* ev = new cuda_emu::Event;
  ev->device = cuda_emu::g_device;
  ev->timing = (flags & cudaEventDisableTiming) == 0;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<cuda_emu::Event*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  auto* ev = reinterpret_cast<cuda_emu::Event*>(e);
  if (const int device = cuda_emu::StreamDevice(s); device != ev->device) {
    std::fprintf(stderr, "cuda_emu: an event of cuda:%d recorded on a stream of cuda:%d\n",
                 ev->device, device);
    return Fail(cudaErrorInvalidResourceHandle);
  }
  ev->recorded = true;
  ev->captured = cuda_emu::Unfinished(s);
  ev->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  cuda_emu::WaitAll(reinterpret_cast<cuda_emu::Event*>(e)->captured);
  cuda_emu::Wait();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  const cuda_emu::PendingList& captured = reinterpret_cast<cuda_emu::Event*>(e)->captured;
  cuda_emu::RunDeferred(captured);
  for (const auto& w : captured) {
    if (!w->done()) return Fail(cudaErrorNotReady);  // left as the last error (cudaStreamQuery)
  }
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto* a = reinterpret_cast<cuda_emu::Event*>(start);
  auto* b = reinterpret_cast<cuda_emu::Event*>(end);
  if (a == nullptr || b == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (!a->timing || !b->timing || !a->recorded || !b->recorded || a->device != b->device) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

}  // extern "C"
