// GEMM kernels: oneDNN matmul primitives (cached, thread-safe) with an OpenBLAS
// fallback, and the OpenMP spin-wait throttle described below.
#include "tensor/cpu/matmul.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tensor/error.h"
#include "tensor/lru_cache.h"
#include "tensor/tensor.h"

namespace tensor {
namespace cpu {
namespace {

constexpr char kOp[] = "matmul";

thread_local std::string last_gemm_path;

// ---------------------------------------------------------------------------
// OpenMP spinning.
//
// oneDNN (Debian's build) runs every primitive on a libgomp team. When a
// parallel region ends, libgomp's idle workers busy-wait (spin on `pause`)
// before they sleep: GOMP_SPINCOUNT = 300000 spins when OMP_WAIT_POLICY is
// unset, measured here at 1-7 ms of CPU per worker after *every* GEMM. On 2
// cores that spinning worker takes the core our own ThreadPool
// (tensor/thread_pool.h) wants next. Measured on this machine
// (BM_ParallelForAfterGemm in tensor/ops_benchmark.cc): a compute-bound
// ParallelFor right after a 256^3 GEMM took 1.64-1.66x as long as the same
// ParallelFor 10 ms later. Spinning also hurts when other processes compete
// for the cores: 200k back-to-back 64^3 bf16 GEMMs once took 62 s instead of
// 1.5 s while a compiler ran next to them.
//
// Setting OMP_WAIT_POLICY=passive (or GOMP_SPINCOUNT) fixes it, but libgomp
// reads its environment once, in its ELF constructor, which runs before
// main() and before any constructor of ours (we depend on it), so setenv() from
// inside the program is too late. OpenMP has no API to change the wait policy
// later, and omp_pause_resource_all() after each GEMM (which destroys the
// team) made every GEMM ~2 ms slower.
//
// What works from inside the program: libgomp shortens the spin to
// "throttled" (100 spins when OMP_WAIT_POLICY is unset, i.e. a few
// microseconds) whenever the threads it manages outnumber the available CPUs
// (gomp_managed_threads > gomp_available_cpus in libgomp/config/linux/wait.h,
// unchanged since GCC 4.4). A second, permanently parked team of 2 threads
// (one thread of ours that ran an empty parallel region, plus its one libgomp
// worker, both asleep in futex waits, using no CPU) adds one managed thread,
// so oneDNN's team of n workers on n CPUs gives n + 1 > n and every later wait
// is throttled. With it the ParallelFor above runs 0.93-0.96x as long right
// after a GEMM as later (no penalty). The price: each GEMM now wakes its
// sleeping worker with a futex, ~8-12 us per call, which shows only on tiny
// GEMMs (BM_SmallGemm64: 16-23 us per 64^3 GEMM instead of 6-11 us); the
// transformer-sized GEMMs take milliseconds.
//
// We do this once, before the first oneDNN call, only when the OpenMP runtime
// is libgomp and the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT;
// FSDP_OMP_SPIN=default turns it off (e.g. for a loop of tiny GEMMs on an
// otherwise idle machine). With ranks as threads (several teams at once)
// libgomp already throttles by the same rule.
// ---------------------------------------------------------------------------
void ThrottleOpenMpSpinning() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* mode = std::getenv("FSDP_OMP_SPIN");
    if (mode != nullptr && std::strcmp(mode, "default") == 0) return;
    if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
      return;  // The user chose a policy; libgomp follows it.
    }
    void* sym = dlsym(RTLD_DEFAULT, "GOMP_parallel");
    Dl_info info;
    if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr ||
        std::strstr(info.dli_fname, "libgomp") == nullptr) {
      return;  // Not libgomp (or no OpenMP at all): the rule above is libgomp's.
    }
    using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
    const auto gomp_parallel = reinterpret_cast<GompParallel>(sym);
    struct Started {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
    };
    auto started = std::make_shared<Started>();
    std::thread([gomp_parallel, started] {
      gomp_parallel([](void*) {}, nullptr, /*num_threads=*/2, /*flags=*/0);
      {
        std::lock_guard<std::mutex> lock(started->mu);
        started->done = true;
      }
      started->cv.notify_all();
      // Park forever; the thread's libgomp pool lives as long as it does.
      // Leaked on purpose so no exit-time destructor waits on them.
      auto* park_mu = new std::mutex;
      auto* park_cv = new std::condition_variable;
      std::unique_lock<std::mutex> lock(*park_mu);
      park_cv->wait(lock, [] { return false; });
    }).detach();
    std::unique_lock<std::mutex> lock(started->mu);
    started->cv.wait(lock, [&] { return started->done; });
  });
}

// ---------------------------------------------------------------------------
// Matrix layouts.
// ---------------------------------------------------------------------------

// A strided matrix as BLAS sees it: row major (col stride 1) or column major
// (row stride 1), with its leading dimension.
struct MatrixLayout {
  bool col_major = false;
  int64_t ld = 0;
};

bool GetLayout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
               MatrixLayout* layout) {
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1))) {
    layout->col_major = false;
    layout->ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    return true;
  }
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1))) {
    layout->col_major = true;
    layout->ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    return true;
  }
  return false;
}

MatrixLayout LayoutOrDie(int64_t rows, int64_t cols, const GemmOperand& op) {
  MatrixLayout layout;
  CHECK(GetLayout(rows, cols, op.row_stride, op.col_stride, &layout))
      << "matmul kernel got a matrix that is not GEMM-friendly: " << rows << "x" << cols
      << " strides " << op.row_stride << "," << op.col_stride;
  return layout;
}

int64_t BatchCount(const Dims& batch) {
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  return n;
}

// Element offset of batch item `flat` (row-major over `batch`) in `op`.
int64_t BatchOffset(const Dims& batch, const GemmOperand& op, int64_t flat) {
  int64_t offset = 0;
  for (int d = static_cast<int>(batch.size()) - 1; d >= 0; --d) {
    offset += (flat % batch[d]) * op.batch_strides[d];
    flat /= batch[d];
  }
  return offset;
}

// ---------------------------------------------------------------------------
// oneDNN.
// ---------------------------------------------------------------------------

struct OneDnn {
  dnnl::engine engine;
};

// The process's CPU engine, or nullptr when oneDNN cannot make one.
const OneDnn* GetOneDnn() {
  static const OneDnn* const onednn = []() -> const OneDnn* {
    try {
      auto* o = new OneDnn{dnnl::engine(dnnl::engine::kind::cpu, 0)};
      ThrottleOpenMpSpinning();
      return o;
    } catch (const dnnl::error& e) {
      LOG(WARNING) << "oneDNN CPU engine unavailable (" << e.what() << "); using OpenBLAS";
      return nullptr;
    }
  }();
  return onednn;
}

// Streams are not thread-safe: one per calling thread.
dnnl::stream& ThreadStream(const OneDnn& onednn) {
  thread_local dnnl::stream stream(onednn.engine);
  return stream;
}

dnnl::memory::data_type ToDnnl(Dtype dtype) {
  return dtype == Dtype::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// Dims and strides of one operand for a oneDNN memory descriptor: the batch
// dims (1 where the operand is broadcast) and the matrix, in the normalized
// layout.
struct DnnlShape {
  dnnl::memory::dims dims;
  dnnl::memory::dims strides;
};

DnnlShape OperandShape(const Dims& batch, const GemmOperand& op, int64_t rows, int64_t cols) {
  const MatrixLayout layout = LayoutOrDie(rows, cols, op);
  const int nb = static_cast<int>(batch.size());
  DnnlShape s;
  s.dims.assign(nb + 2, 1);
  s.strides.assign(nb + 2, 1);
  s.dims[nb] = rows;
  s.dims[nb + 1] = cols;
  s.strides[nb] = layout.col_major ? 1 : layout.ld;
  s.strides[nb + 1] = layout.col_major ? layout.ld : 1;
  // Elements spanned so far, used as the stride of size-1 (broadcast) dims.
  int64_t span = layout.col_major ? (cols - 1) * layout.ld + rows : (rows - 1) * layout.ld + cols;
  for (int d = nb - 1; d >= 0; --d) {
    if (batch[d] == 1 || op.batch_strides[d] == 0) {
      s.dims[d] = 1;
      s.strides[d] = span;
    } else {
      s.dims[d] = batch[d];
      s.strides[d] = op.batch_strides[d];
      span = std::max(span, (batch[d] - 1) * op.batch_strides[d] + span);
    }
  }
  return s;
}

// A primitive for one (shapes, strides, dtypes, beta); usable is false when
// oneDNN offered no implementation or only its slow reference one.
struct Primitive {
  bool usable = false;
  std::string impl;
  dnnl::matmul matmul;
  dnnl::memory::desc a_md, b_md, c_md, bias_md, scratch_md;
  int64_t scratch_bytes = 0;
};

using CacheKey = absl::InlinedVector<int64_t, 40>;

struct CacheKeyHash {
  size_t operator()(const CacheKey& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// LRU cache of primitives. Creation (milliseconds: JIT code generation) runs
// outside the lock (tensor/lru_cache.h).
using PrimitiveCache = LruCache<CacheKey, Primitive, CacheKeyHash>;

PrimitiveCache& Cache() {
  static PrimitiveCache* const cache = new PrimitiveCache(kGemmCacheCapacity);
  return *cache;
}

std::shared_ptr<const Primitive> CreatePrimitive(const OneDnn& onednn, const GemmArgs& args,
                                                 const DnnlShape& a, const DnnlShape& b,
                                                 const DnnlShape& c) {
  auto p = std::make_shared<Primitive>();
  try {
    p->a_md = dnnl::memory::desc(a.dims, ToDnnl(args.in_dtype), a.strides);
    p->b_md = dnnl::memory::desc(b.dims, ToDnnl(args.in_dtype), b.strides);
    p->c_md = dnnl::memory::desc(c.dims, ToDnnl(args.out_dtype), c.strides);
    if (args.bias != nullptr) {  // (1, ..., 1, n): one row broadcast over the rest
      dnnl::memory::dims bias_dims(c.dims.size(), 1);
      bias_dims.back() = args.n;
      dnnl::memory::dims bias_strides(c.dims.size(), args.n);
      bias_strides.back() = 1;
      p->bias_md = dnnl::memory::desc(bias_dims, ToDnnl(args.bias_dtype), bias_strides);
    }
    dnnl::primitive_attr attr;
    // A caller-provided scratchpad makes one primitive safe to run from several
    // threads at once (the library scratchpad of Debian's build is tied to the
    // thread that created the primitive).
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (args.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(args.beta);  // c = a @ b + beta * c
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(args.bias != nullptr
                                        ? dnnl::matmul::desc(p->a_md, p->b_md, p->bias_md, p->c_md)
                                        : dnnl::matmul::desc(p->a_md, p->b_md, p->c_md),
                                    attr, onednn.engine);
    p->impl = pd.impl_info_str();
    // "ref:any" is oneDNN's scalar reference code: far slower than OpenBLAS.
    if (p->impl.rfind("ref", 0) == 0) return p;
    p->scratch_md = pd.scratchpad_desc();
    p->scratch_bytes = static_cast<int64_t>(p->scratch_md.get_size());
    p->matmul = dnnl::matmul(pd);
    p->usable = true;
  } catch (const dnnl::error& e) {
    p->impl = absl::StrCat("unavailable: ", e.what());
    p->usable = false;
  }
  if (!p->usable) {
    VLOG(1) << "oneDNN matmul " << p->impl << " for " << args.m << "x" << args.k << " @ " << args.k
            << "x" << args.n << "; using OpenBLAS";
  }
  return p;
}

// Runs the GEMM with oneDNN; false when oneDNN has no usable primitive for it.
bool RunOneDnn(const GemmArgs& args) {
  const OneDnn* onednn = GetOneDnn();
  if (onednn == nullptr) return false;
  const DnnlShape a = OperandShape(args.batch, args.a, args.m, args.k);
  const DnnlShape b = OperandShape(args.batch, args.b, args.k, args.n);
  const DnnlShape c = OperandShape(args.batch, args.c, args.m, args.n);

  CacheKey key;
  key.push_back(static_cast<int64_t>(args.in_dtype));
  key.push_back(static_cast<int64_t>(args.out_dtype));
  uint32_t beta_bits;
  std::memcpy(&beta_bits, &args.beta, sizeof(beta_bits));
  key.push_back(beta_bits);
  key.push_back(args.bias == nullptr ? -1 : static_cast<int64_t>(args.bias_dtype));
  key.push_back(static_cast<int64_t>(a.dims.size()));
  for (const DnnlShape* s : {&a, &b, &c}) {
    key.insert(key.end(), s->dims.begin(), s->dims.end());
    key.insert(key.end(), s->strides.begin(), s->strides.end());
  }

  std::shared_ptr<const Primitive> p = Cache().Find(key);
  if (p == nullptr) p = Cache().Insert(key, CreatePrimitive(*onednn, args, a, b, c));
  if (!p->usable) return false;

  const dnnl::engine& engine = onednn->engine;
  std::unordered_map<int, dnnl::memory> exec_args = {
      {DNNL_ARG_SRC, dnnl::memory(p->a_md, engine, args.a.data)},
      {DNNL_ARG_WEIGHTS, dnnl::memory(p->b_md, engine, args.b.data)},
      {DNNL_ARG_DST, dnnl::memory(p->c_md, engine, args.c.data)},
  };
  if (args.bias != nullptr) {
    exec_args.emplace(DNNL_ARG_BIAS,
                      dnnl::memory(p->bias_md, engine, const_cast<void*>(args.bias)));
  }
  Tensor scratch;  // charged to the caller's memory ledger as a temporary
  if (p->scratch_bytes > 0) {
    scratch = Tensor::Empty({p->scratch_bytes}, Dtype::kU8);
    exec_args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p->scratch_md, engine, scratch.raw_data()));
  }
  dnnl::stream& stream = ThreadStream(*onednn);
  try {
    p->matmul.execute(stream, exec_args);
    stream.wait();
  } catch (const dnnl::error& e) {
    ThrowOpError(kOp, "oneDNN matmul (", p->impl, ") failed: ", e.what());
  }
  last_gemm_path = "onednn:" + p->impl;
  return true;
}

// ---------------------------------------------------------------------------
// OpenBLAS.
// ---------------------------------------------------------------------------

// A contiguous f32 copy of a bf16 operand: broadcast batch dims stay broadcast
// (stored once). `packed` receives the operand that describes the copy.
Tensor PackToF32(const Dims& batch, const GemmOperand& op, int64_t rows, int64_t cols,
                 GemmOperand* packed) {
  Shape shape;
  for (size_t d = 0; d < batch.size(); ++d)
    shape.push_back(op.batch_strides[d] == 0 ? 1 : batch[d]);
  shape.push_back(rows);
  shape.push_back(cols);
  Tensor out = Tensor::Empty(shape, Dtype::kF32);
  const Dims strides = ContiguousStrides(shape);
  float* dst = out.data<float>();
  const bf16* src = static_cast<const bf16*>(op.data);
  const Dims packed_batch(shape.dims().begin(), shape.dims().end() - 2);
  const int64_t count = BatchCount(packed_batch);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t src_off = BatchOffset(packed_batch, op, i);
    float* d = dst + i * rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        d[r * cols + c] = Bf16ToFloat(src[src_off + r * op.row_stride + c * op.col_stride]);
      }
    }
  }
  packed->data = dst;
  packed->batch_strides.assign(batch.size(), 0);
  for (size_t d = 0; d < batch.size(); ++d) {
    if (op.batch_strides[d] != 0) packed->batch_strides[d] = strides[d];
  }
  packed->row_stride = cols;
  packed->col_stride = 1;
  return out;
}

int BlasInt(int64_t v) {
  OP_CHECK(v <= INT_MAX, kOp, "dimension ", v, " is too large for OpenBLAS (32-bit ints)");
  return static_cast<int>(v);
}

void RunOpenBlas(const GemmArgs& args) {
  GemmArgs f = args;  // the same GEMM over f32 buffers
  Tensor a32, b32, c32;
  if (args.in_dtype == Dtype::kBF16) {
    a32 = PackToF32(args.batch, args.a, args.m, args.k, &f.a);
    b32 = PackToF32(args.batch, args.b, args.k, args.n, &f.b);
  }
  const int64_t count = BatchCount(args.batch);
  const bool c_is_bf16 = args.out_dtype == Dtype::kBF16;
  if (c_is_bf16) {
    Shape shape(args.batch);
    shape.push_back(args.m);
    shape.push_back(args.n);
    c32 = Tensor::Empty(shape, Dtype::kF32);
    const Dims strides = ContiguousStrides(shape);
    f.c.data = c32.raw_data();
    f.c.batch_strides.assign(strides.begin(), strides.end() - 2);
    f.c.row_stride = args.n;
    f.c.col_stride = 1;
    if (args.beta != 0.0f) {
      for (int64_t i = 0; i < count; ++i) {
        const bf16* src =
            static_cast<const bf16*>(args.c.data) + BatchOffset(args.batch, args.c, i);
        float* dst = c32.data<float>() + i * args.m * args.n;
        for (int64_t r = 0; r < args.m; ++r) {
          for (int64_t c = 0; c < args.n; ++c)
            dst[r * args.n + c] = Bf16ToFloat(src[r * args.c.row_stride + c]);
        }
      }
    }
  }
  std::vector<float> bias;  // f32 copy, added after each product (before rounding to bf16)
  if (args.bias != nullptr) {
    bias.resize(args.n);
    for (int64_t j = 0; j < args.n; ++j) {
      bias[j] = args.bias_dtype == Dtype::kBF16
                    ? Bf16ToFloat(static_cast<const bf16*>(args.bias)[j])
                    : static_cast<const float*>(args.bias)[j];
    }
  }
  const MatrixLayout la = LayoutOrDie(f.m, f.k, f.a);
  const MatrixLayout lb = LayoutOrDie(f.k, f.n, f.b);
  for (int64_t i = 0; i < count; ++i) {
    const float* a = static_cast<const float*>(f.a.data) + BatchOffset(f.batch, f.a, i);
    const float* b = static_cast<const float*>(f.b.data) + BatchOffset(f.batch, f.b, i);
    float* c = static_cast<float*>(f.c.data) + BatchOffset(f.batch, f.c, i);
    cblas_sgemm(CblasRowMajor, la.col_major ? CblasTrans : CblasNoTrans,
                lb.col_major ? CblasTrans : CblasNoTrans, BlasInt(f.m), BlasInt(f.n), BlasInt(f.k),
                1.0f, a, BlasInt(la.ld), b, BlasInt(lb.ld), f.beta, c, BlasInt(f.c.row_stride));
    if (bias.empty()) continue;
    for (int64_t r = 0; r < f.m; ++r) {
      float* row = c + r * f.c.row_stride;
      for (int64_t j = 0; j < f.n; ++j) row[j] += bias[j];
    }
  }
  if (c_is_bf16) {
    for (int64_t i = 0; i < count; ++i) {
      const float* src = c32.data<float>() + i * args.m * args.n;
      bf16* dst = static_cast<bf16*>(args.c.data) + BatchOffset(args.batch, args.c, i);
      for (int64_t r = 0; r < args.m; ++r) {
        for (int64_t c = 0; c < args.n; ++c)
          dst[r * args.c.row_stride + c] = FloatToBf16(src[r * args.n + c]);
      }
    }
  }
  last_gemm_path = "openblas";
}

GemmBackend BackendFromEnv() {
  const char* env = std::getenv("FSDP_GEMM");
  if (env == nullptr || std::strcmp(env, "onednn") == 0) return GemmBackend::kOneDnn;
  if (std::strcmp(env, "openblas") == 0) return GemmBackend::kOpenBlas;
  LOG(WARNING) << "FSDP_GEMM=" << env << " is not one of onednn, openblas; using onednn";
  return GemmBackend::kOneDnn;
}

std::atomic<GemmBackend>& Backend() {
  static std::atomic<GemmBackend> backend{BackendFromEnv()};
  return backend;
}

}  // namespace

bool GemmFriendly(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  MatrixLayout layout;
  return GetLayout(rows, cols, row_stride, col_stride, &layout);
}

void Gemm(const GemmArgs& args) {
  CHECK(args.m > 0 && args.n > 0 && args.k > 0) << "empty GEMM reached the kernel";
  CHECK(args.in_dtype == Dtype::kF32 || args.in_dtype == Dtype::kBF16);
  CHECK(args.out_dtype == args.in_dtype || args.out_dtype == Dtype::kF32);
  CHECK_EQ(args.c.col_stride, 1);
  CHECK(args.bias == nullptr || args.bias_dtype == Dtype::kF32 || args.bias_dtype == Dtype::kBF16);
  if (Backend().load(std::memory_order_relaxed) == GemmBackend::kOneDnn && RunOneDnn(args)) return;
  RunOpenBlas(args);
}

GemmBackend GetGemmBackend() { return Backend().load(); }

void SetGemmBackend(GemmBackend backend) { Backend().store(backend); }

std::string LastGemmPath() { return last_gemm_path; }

GemmCacheStats GetGemmCacheStats() {
  const LruCacheStats s = Cache().Stats();
  return {s.entries, s.hits, s.misses};
}

}  // namespace cpu
}  // namespace tensor
