// NCCL of the CPU emulation (--config=cuda_emu): the subset of the API the
// project's nccl engine calls (dist/nccl_group.cc), for ranks that are
// threads of one process, each on its own emulated device
// (CUDA_EMU_DEVICES, pending.h). It lets the engine's tests run with two
// "GPUs" where a real machine has one or none.
//
// What it models:
// - Communicators: ncclGetUniqueId, ncclCommInitRank[Config] (non-blocking
//   when config->blocking is 0: ncclInProgress until every rank of the id has
//   joined), ncclCommSplit (the same, over the parent's ranks: colors,
//   keys, NCCL_SPLIT_NOCOLOR), ncclCommGetAsyncError, ncclCommCount,
//   ncclCommUserRank, ncclCommCuDevice, ncclCommFinalize (in progress while
//   the rank's collectives are unfinished), ncclCommDestroy, ncclCommAbort.
// - Collectives (all_reduce, reduce_scatter, all_gather, broadcast; sum,
//   prod, max, min, avg; the integer and floating dtypes): each call is
//   numbered per communicator and rank and queued on its stream as pending
//   work (pending.h); the rank that completes a call's number (or, for a
//   call that waits for other communicators' calls, the thread that finishes
//   the last of those) does the whole collective for every rank, reading
//   inputs and writing outputs in place (one address space), and finishes
//   every rank's pending work. Calls that
//   differ across ranks (op, dtype, count, root) fail every rank's
//   communicator with ncclInvalidUsage; a rank that aborts fails the calls
//   its peers made with it (ncclRemoteError), and its own finish at once.
//   Floating sums accumulate in f32 (f64 for f64) and round once.
// - Launch order across communicators (nccl_order.cc): a call whose ranks
//   all came also waits, on each of its ranks' devices, for the unfinished
//   calls of other communicators launched there before it, as NCCL kernels
//   that cannot share a GPU would; calls launched in orders that could
//   deadlock so (two devices in opposite orders, or a cycle through more)
//   fail the communicators involved with ncclInvalidUsage, naming the
//   devices.
// - Thread safety (NCCL's user guide, "Thread Safety"): calls on
//   communicators of one device must not be made from several threads at
//   once (one communicator's, or independent ones'). Ranks are threads
//   standing for processes, so the rule binds the communicators of one
//   emulated process (a communicator made by init and those split from it):
//   two threads inside calls on them fail the later call's communicator with
//   ncclInvalidUsage, naming the rule (init, which makes a process, and
//   ncclCommAbort, which NCCL lets another thread call, excepted).
//   CUDA_EMU_NCCL_CALL_US holds each call that many microseconds, so that
//   calls which would overlap on a GPU meet.
// Not modeled: timing, ncclGroupStart/End, point-to-point, processes.
#include <nccl.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "third_party/cuda/emu/nccl_model.h"
#include "third_party/cuda/emu/pending.h"
#include "third_party/cuda/emu/stream_device.h"

namespace cuda_emu_nccl {

std::mutex& Mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::condition_variable& Cv() {
  static std::condition_variable* cv = new std::condition_variable;
  return *cv;
}

void SetError(ncclComm_t comm, ncclResult_t error, const std::string& message) {
  if (comm == nullptr || comm->error != ncclSuccess) return;
  comm->error = error;
  comm->last_error = message;
}

namespace {

// A fresh emulated process (ncclComm::process), for an init.
int64_t NewProcess() {
  static std::atomic<int64_t> next{1};
  return next++;
}

// Which thread is inside calls on an emulated process's communicators
// (NCCL's thread safety, above), and how deep (a thread's nested calls are
// one).
struct ProcessCalls {
  std::mutex mu;
  std::thread::id owner;
  int depth = 0;
};

// CUDA_EMU_NCCL_CALL_US (read once): how long each guarded call holds its
// device.
std::chrono::microseconds CallHold() {
  static const std::chrono::microseconds hold = [] {
    const char* env = std::getenv("CUDA_EMU_NCCL_CALL_US");
    return std::chrono::microseconds(env != nullptr ? std::atoi(env) : 0);
  }();
  return hold;
}

// Marks this thread inside a call on `comm`'s process's communicators for
// its lifetime; concurrent() when another thread is inside one too.
class CallGuard {
 public:
  explicit CallGuard(ncclComm_t comm) : calls_(Calls(comm->process)) {
    {
      std::lock_guard<std::mutex> lock(calls_.mu);
      if (calls_.depth > 0 && calls_.owner != std::this_thread::get_id()) {
        concurrent_ = true;
        return;
      }
      calls_.owner = std::this_thread::get_id();
      ++calls_.depth;
    }
    if (CallHold().count() > 0) std::this_thread::sleep_for(CallHold());
  }
  ~CallGuard() {
    if (concurrent_) return;
    std::lock_guard<std::mutex> lock(calls_.mu);
    --calls_.depth;
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  bool concurrent() const { return concurrent_; }
  static int Depth(ncclComm_t comm) {
    ProcessCalls& calls = Calls(comm->process);
    std::lock_guard<std::mutex> lock(calls.mu);
    return calls.depth;
  }

 private:
  static ProcessCalls& Calls(int64_t process) {
    static std::mutex* mu = new std::mutex;
    static auto* calls = new std::map<int64_t, std::unique_ptr<ProcessCalls>>;
    std::lock_guard<std::mutex> lock(*mu);
    std::unique_ptr<ProcessCalls>& slot = (*calls)[process];
    if (slot == nullptr) slot = std::make_unique<ProcessCalls>();
    return *slot;
  }
  ProcessCalls& calls_;
  bool concurrent_ = false;
};

int CallsInside(ncclComm_t comm) { return CallGuard::Depth(comm); }

// Makes `device` current on this thread for its lifetime.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    cudaGetDevice(&saved_);
    cudaSetDevice(device);
  }
  ~CurrentDevice() { cudaSetDevice(saved_); }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int saved_ = 0;
};

// Fails `comm` for a call made while another thread was inside one on its
// process's communicators.
ncclResult_t ConcurrentCall(ncclComm_t comm) {
  const std::string message =
      "emulated NCCL: two threads made calls on communicators of cuda:" +
      std::to_string(comm->device) +
      " at once (NCCL's thread safety: one thread at a time per device)";
  std::fprintf(stderr, "%s\n", message.c_str());
  std::lock_guard<std::mutex> lock(Mu());
  SetError(comm, ncclInvalidUsage, message);
  return ncclInvalidUsage;
}

std::map<std::string, std::shared_ptr<Clique>>& Cliques() {
  static auto* cliques = new std::map<std::string, std::shared_ptr<Clique>>;
  return *cliques;
}

size_t Size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

bool IsFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

double LoadFloat(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclFloat16:
      return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
    case ncclBfloat16: {
      const uint32_t bits = uint32_t{static_cast<const uint16_t*>(p)[i]} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case ncclFloat32:
      return static_cast<const float*>(p)[i];
    default:
      return static_cast<const double*>(p)[i];
  }
}

void StoreFloat(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclFloat16:
      static_cast<uint16_t*>(p)[i] = _cvtss_sh(static_cast<float>(v), _MM_FROUND_TO_NEAREST_INT);
      return;
    case ncclBfloat16: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t out;
      if (std::isnan(f)) {
        out = 0x7fff;
      } else {
        out = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // to nearest even
      }
      static_cast<uint16_t*>(p)[i] = out;
      return;
    }
    case ncclFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    default:
      static_cast<double*>(p)[i] = v;
  }
}

int64_t LoadInt(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8:
      return static_cast<const int8_t*>(p)[i];
    case ncclUint8:
      return static_cast<const uint8_t*>(p)[i];
    case ncclInt32:
      return static_cast<const int32_t*>(p)[i];
    case ncclUint32:
      return static_cast<const uint32_t*>(p)[i];
    default:
      return static_cast<const int64_t*>(p)[i];  // int64, uint64 (two's complement)
  }
}

void StoreInt(ncclDataType_t t, void* p, size_t i, int64_t v) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      return;
    case ncclInt32:
    case ncclUint32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v);
      return;
    default:
      static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v);
  }
}

// Element `i` of the reduction over `inputs` into out[o].
void ReduceElement(const Call& c, const std::vector<const void*>& inputs, size_t i, void* out,
                   size_t o) {
  const size_t n = inputs.size();
  if (IsFloat(c.dtype)) {
    double acc = LoadFloat(c.dtype, inputs[0], i);
    if (c.dtype != ncclFloat64) acc = static_cast<float>(acc);
    for (size_t r = 1; r < n; ++r) {
      const double x = LoadFloat(c.dtype, inputs[r], i);
      switch (c.op) {
        case ncclMax:
          acc = (x > acc || std::isnan(x)) ? x : acc;
          break;
        case ncclMin:
          acc = (x < acc || std::isnan(x)) ? x : acc;
          break;
        case ncclProd:
          acc *= x;
          break;
        default:
          acc += x;
      }
      if (c.dtype != ncclFloat64) acc = static_cast<float>(acc);  // f32 accumulation
    }
    if (c.op == ncclAvg) acc /= static_cast<double>(n);
    StoreFloat(c.dtype, out, o, acc);
    return;
  }
  int64_t acc = LoadInt(c.dtype, inputs[0], i);
  for (size_t r = 1; r < n; ++r) {
    const int64_t x = LoadInt(c.dtype, inputs[r], i);
    switch (c.op) {
      case ncclMax:
        acc = std::max(acc, x);
        break;
      case ncclMin:
        acc = std::min(acc, x);
        break;
      case ncclProd:
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(x));
        break;
      default:
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(x));
    }
  }
  StoreInt(c.dtype, out, o, acc);
}

// Every rank's output of a collective whose ranks all came, computed into
// temporaries first (inputs and outputs may alias, as in-place calls do),
// then written.
void Execute(const Call& c) {
  const int n = static_cast<int>(c.parts.size());
  const size_t es = Size(c.dtype);
  std::vector<std::vector<char>> results(n);
  std::vector<const void*> inputs;
  for (const Part& p : c.parts) inputs.push_back(p.send);
  for (int r = 0; r < n; ++r) {
    std::vector<char>& out = results[r];
    switch (c.kind) {
      case 0:  // all_reduce: count elements
        out.resize(c.count * es);
        for (size_t i = 0; i < c.count; ++i) ReduceElement(c, inputs, i, out.data(), i);
        break;
      case 1:  // reduce_scatter: count = recvcount
        out.resize(c.count * es);
        for (size_t i = 0; i < c.count; ++i) {
          ReduceElement(c, inputs, r * c.count + i, out.data(), i);
        }
        break;
      case 2:  // all_gather: count = sendcount
        out.resize(n * c.count * es);
        for (int q = 0; q < n; ++q) {
          std::memcpy(out.data() + q * c.count * es, c.parts[q].send, c.count * es);
        }
        break;
      case 3:  // broadcast
        out.resize(c.count * es);
        std::memcpy(out.data(), c.parts[c.root].send, c.count * es);
        break;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (!results[r].empty()) std::memcpy(c.parts[r].recv, results[r].data(), results[r].size());
  }
}

bool SameCall(const Call& a, const Call& b) {
  return a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root;
}

std::string Describe(const Call& c) {
  static const char* kNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                 "split"};
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s(count %zu, dtype %d, op %d, root %d)", kNames[c.kind],
                c.count, static_cast<int>(c.dtype), static_cast<int>(c.op), c.root);
  return buf;
}

// Ends a split whose parent ranks all came: one clique per color, ranks by
// (key, parent rank). Called with Mu() held.
void FinishSplit(Call& c) {
  std::map<int, std::vector<int>> by_color;  // parent ranks
  for (int r = 0; r < static_cast<int>(c.parts.size()); ++r) {
    if (c.parts[r].color != NCCL_SPLIT_NOCOLOR) by_color[c.parts[r].color].push_back(r);
  }
  for (auto& [color, ranks] : by_color) {
    std::stable_sort(ranks.begin(), ranks.end(),
                     [&](int a, int b) { return c.parts[a].key < c.parts[b].key; });
    auto clique = std::make_shared<Clique>();
    clique->size = static_cast<int>(ranks.size());
    clique->members.assign(ranks.size(), nullptr);
    for (int i = 0; i < clique->size; ++i) {
      ncclComm_t child = static_cast<ncclComm_t>(c.parts[ranks[i]].recv);
      child->clique = clique;
      child->rank = i;
      child->size = clique->size;
      clique->members[i] = child;
    }
    clique->joined = clique->size;
  }
}

// Rank `comm->rank`'s part of call number comm->next_call (`proto` says what
// the call is). Queues its pending work on `stream`; the last rank to come
// runs the call, unless it waits for calls of other communicators
// (nccl_order.cc): then the call that finishes last of those runs it. With
// Mu() held.
ncclResult_t Arrive(ncclComm_t comm, const Call& proto, Part part, cudaStream_t stream) {
  if (comm->error != ncclSuccess) return comm->error;
  Clique& clique = *comm->clique;
  const int64_t number = comm->next_call++;
  auto [it, fresh] = clique.calls.try_emplace(number, proto);
  Call& call = it->second;
  if (fresh) call.parts.resize(clique.size);
  if (part.work == nullptr) part.work = std::make_shared<cuda_emu::PendingWork>();
  part.comm = comm;
  call.parts[comm->rank] = part;
  ++call.arrived;
  if (proto.kind != 4) {
    comm->outstanding.push_back(part.work);
    cuda_emu::QueuePending(stream, part.work);
    // A launch that breaks the order fails the communicator: the call never
    // runs (its pending work finishes when the rank aborts).
    if (!RecordLaunch(comm, call, number)) call.failed = true;
  }
  if (!SameCall(call, proto)) {
    const std::string message = "emulated NCCL: call #" + std::to_string(number) +
                                " differs across ranks: " + Describe(call) + " vs " +
                                Describe(proto);
    for (ncclComm_t m : clique.members) SetError(m, ncclInvalidUsage, message);
    call.failed = true;
  }
  if (proto.kind != 4 && !call.failed && FailDeadlock(clique, number)) call.failed = true;
  if (call.arrived == clique.size && (call.failed || call.kind == 4 || !Blocked(clique, number))) {
    CompleteCall(clique, number);
  }
  // Calls that waited for this one, or for calls of communicators that
  // failed just now.
  CompleteUnblocked();
  return ncclSuccess;
}

}  // namespace

void CompleteCall(Clique& clique, int64_t number) {
  const auto it = clique.calls.find(number);
  if (it == clique.calls.end()) return;
  Call& call = it->second;
  if (!call.failed) {
    if (call.kind == 4) {
      FinishSplit(call);
    } else {
      Execute(call);
    }
  }
  for (Part& p : call.parts) p.work->Finish();
  clique.calls.erase(it);
  ForgetLaunches(&clique, number, -1);
  Cv().notify_all();
}

namespace {

ncclResult_t Collective(int kind, const void* send, void* recv, size_t count,
                        ncclDataType_t dtype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  if (comm == nullptr || Size(dtype) == 0) return ncclInvalidArgument;
  if (count > 0 && (send == nullptr || recv == nullptr)) return ncclInvalidArgument;
  if (kind == 0 || kind == 1) {
    if (op < ncclSum || op > ncclAvg || (op == ncclAvg && !IsFloat(dtype))) {
      return ncclInvalidArgument;
    }
  }
  const CallGuard guard(comm);
  if (guard.concurrent()) return ConcurrentCall(comm);
  // NCCL launches with the communicator's device current: a created stream
  // of another device fails the launch (and, as NCCL's group cleanup does, a
  // non-blocking communicator); the default streams are that device's.
  if (const int device = cuda_emu::CreatedStreamDevice(stream);
      device >= 0 && device != comm->device) {
    const std::string message = "emulated NCCL: a call of the communicator of cuda:" +
                                std::to_string(comm->device) + " on a stream of cuda:" +
                                std::to_string(device);
    std::fprintf(stderr, "%s\n", message.c_str());
    std::lock_guard<std::mutex> lock(Mu());
    if (!comm->blocking) SetError(comm, ncclUnhandledCudaError, message);
    return ncclUnhandledCudaError;
  }
  const CurrentDevice current(comm->device);
  // What was deferred on the stream before the call (pending.h) runs first:
  // the call reads and writes its buffers when the last rank arrives.
  cuda_emu::RunDeferredOn(stream);
  std::lock_guard<std::mutex> lock(Mu());
  if (comm->clique == nullptr || comm->clique->joined < comm->size) return ncclInvalidUsage;
  if (kind == 3 && (root < 0 || root >= comm->size)) return ncclInvalidArgument;
  Call proto;
  proto.kind = kind;
  proto.count = count;
  proto.dtype = dtype;
  proto.op = (kind == 0 || kind == 1) ? op : ncclSum;
  proto.root = kind == 3 ? root : 0;
  return Arrive(comm, proto, Part{send, recv}, stream);
}

}  // namespace
}  // namespace cuda_emu_nccl

namespace emu = cuda_emu_nccl;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<int64_t> counter{0};
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "cuda_emu nccl %d/%lld",
                static_cast<int>(getpid()), static_cast<long long>(counter++));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  int device = 0;
  cudaGetDevice(&device);
  const std::string key(id.internal, strnlen(id.internal, sizeof(id.internal)));
  std::unique_lock<std::mutex> lock(emu::Mu());
  std::shared_ptr<emu::Clique>& slot = emu::Cliques()[key];
  if (slot == nullptr) {
    slot = std::make_shared<emu::Clique>();
    slot->size = nranks;
    slot->members.assign(nranks, nullptr);
  }
  const std::shared_ptr<emu::Clique> clique = slot;  // the map entry may go below
  if (clique->size != nranks || clique->members[rank] != nullptr) return ncclInvalidUsage;
  auto* c = new ncclComm;
  c->clique = clique;
  c->rank = rank;
  c->size = nranks;
  c->device = device;
  c->blocking = config == nullptr || config->blocking != 0;
  c->process = emu::NewProcess();
  clique->members[rank] = c;
  ++clique->joined;
  *comm = c;
  if (clique->joined == clique->size) {
    emu::Cliques().erase(key);  // complete: the id is used up
    // As NCCL: one rank per device in a communicator.
    for (int a = 0; a < clique->size; ++a) {
      for (int b = a + 1; b < clique->size; ++b) {
        if (clique->members[a]->device != clique->members[b]->device) continue;
        const std::string message = "emulated NCCL: Duplicate GPU detected: rank " +
                                    std::to_string(a) + " and rank " + std::to_string(b) +
                                    " both on CUDA device " +
                                    std::to_string(clique->members[a]->device);
        for (ncclComm_t m : clique->members) emu::SetError(m, ncclInvalidUsage, message);
      }
    }
    emu::Cv().notify_all();
    return ncclSuccess;
  }
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) return ncclInProgress;
  emu::Cv().wait(lock, [&] { return clique->joined == clique->size; });
  return c->error;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  if (comm == nullptr || newcomm == nullptr || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
    return ncclInvalidArgument;
  }
  const emu::CallGuard guard(comm);
  if (guard.concurrent()) return emu::ConcurrentCall(comm);
  std::unique_lock<std::mutex> lock(emu::Mu());
  if (comm->clique == nullptr || comm->clique->joined < comm->size) return ncclInvalidUsage;
  ncclComm_t child = nullptr;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = new ncclComm;
    child->device = comm->device;
    child->blocking = config == nullptr || config->blocking != 0;
    child->process = comm->process;
  }
  emu::Call proto;
  proto.kind = 4;
  emu::Part part;
  part.recv = child;
  part.color = color;
  part.key = key;
  part.work = std::make_shared<cuda_emu::PendingWork>();
  const std::shared_ptr<cuda_emu::PendingWork> done = part.work;
  const ncclResult_t result = emu::Arrive(comm, proto, part, nullptr);
  if (result != ncclSuccess) {
    delete child;
    return result;
  }
  comm->split = done;
  *newcomm = child;
  const bool blocking = config == nullptr || config->blocking != 0;
  if (child == nullptr) {
    if (done->done()) return comm->error;
    if (!blocking) return ncclInProgress;
    emu::Cv().wait(lock, [&] { return done->done() || comm->error != ncclSuccess; });
    return comm->error;
  }
  if (child->clique != nullptr) return ncclSuccess;
  if (!blocking) return ncclInProgress;
  emu::Cv().wait(lock, [&] { return child->clique != nullptr || comm->error != ncclSuccess; });
  return comm->error;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  const emu::CallGuard guard(comm);
  if (guard.concurrent()) emu::ConcurrentCall(comm);  // *state says it
  std::lock_guard<std::mutex> lock(emu::Mu());
  if (comm->error != ncclSuccess) {
    *state = comm->error;
  } else if (comm->clique == nullptr || comm->clique->joined < comm->size ||
             (comm->split != nullptr && !comm->split->done())) {
    *state = ncclInProgress;  // init or split not complete
  } else {
    *state = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  const emu::CallGuard guard(comm);
  if (guard.concurrent()) return emu::ConcurrentCall(comm);
  std::lock_guard<std::mutex> lock(emu::Mu());
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  const emu::CallGuard guard(comm);
  if (guard.concurrent()) return emu::ConcurrentCall(comm);
  std::lock_guard<std::mutex> lock(emu::Mu());
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

// In progress (ncclCommGetAsyncError) while this rank's collectives are
// unfinished; the emulation reports that through the pending works.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  const emu::CallGuard guard(comm);
  if (guard.concurrent()) return emu::ConcurrentCall(comm);
  std::lock_guard<std::mutex> lock(emu::Mu());
  for (const auto& w : comm->outstanding) {
    if (!w->done()) return ncclInProgress;
  }
  return ncclSuccess;
}

namespace {

// Takes `comm` out of its clique; its part in unfinished calls fails them for
// every rank (the peers' communicators get ncclRemoteError). With Mu() held.
void Leave(ncclComm_t comm) {
  if (comm->clique != nullptr) {
    emu::Clique& clique = *comm->clique;
    for (auto it = clique.calls.begin(); it != clique.calls.end();) {
      emu::Call& call = it->second;
      if (call.parts[comm->rank].work == nullptr) {
        ++it;
        continue;
      }
      // Never execute it: this rank's buffers may be gone.
      call.failed = true;
      for (emu::Part& p : call.parts) {
        if (p.work == nullptr) continue;
        if (p.comm != comm) {
          emu::SetError(p.comm, ncclRemoteError,
                        "emulated NCCL: a peer aborted its communicator during a collective");
        }
        p.work->Finish();
      }
      // Ranks still to come find no call under this number and start a new
      // one that never completes: as on a GPU, they hang until they abort.
      emu::ForgetLaunches(&clique, it->first, -1);
      it = clique.calls.erase(it);
    }
    emu::ForgetLaunches(&clique, -1, comm->device);  // this rank's launches that remain
    if (clique.members[comm->rank] == comm) clique.members[comm->rank] = nullptr;
  }
  for (const auto& w : comm->outstanding) w->Finish();  // aborted kernels exit
  emu::CompleteUnblocked();  // calls that waited for the ones ended here
  emu::Cv().notify_all();
}

}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  const emu::CallGuard guard(comm);
  if (guard.concurrent()) emu::ConcurrentCall(comm);  // destroyed all the same
  std::lock_guard<std::mutex> lock(emu::Mu());
  Leave(comm);  // destroying with calls unfinished is an abort
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::lock_guard<std::mutex> lock(emu::Mu());
  Leave(comm);
  delete comm;
  return ncclSuccess;
}

// Tests: how deep a thread is inside calls on `comm`'s emulated process's
// communicators (0: none), to start a call while another is inside one.
int cuda_emu_nccl_calls_inside(ncclComm_t comm) { return emu::CallsInside(comm); }

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string last;
  std::lock_guard<std::mutex> lock(emu::Mu());
  last = comm != nullptr ? comm->last_error : "";
  return last.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return emu::Collective(0, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return emu::Collective(1, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return emu::Collective(2, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return emu::Collective(3, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

}  // extern "C"
