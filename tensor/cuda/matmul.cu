// CUDA GEMMs through cuBLASLt: the row-major -> column-major plan (see
// matmul.h for the operand swap), a per-(device, thread) handle and
// workspace, an LRU cache of descriptors, layouts and heuristic results
// (optionally tuned: the fastest of the heuristic's candidates, timed), and
// the scale kernel for an empty K.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda/thread_device_slot.h"
#include "tensor/cuda_backend.h"
#include "tensor/lru_cache.h"
#include "tensor/memory_ledger.h"

namespace tensor {
namespace cuda {
namespace {

constexpr char kOp[] = "matmul";
// Most items handed to one strided-batched cuBLASLt call; longer batches are
// split (the grid's z dimension is 65535 for some kernels).
constexpr int64_t kMaxLtBatch = 65535;

void CheckLt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    ThrowOpError(kOp, what, " failed: ", cublasLtGetStatusString(status));
  }
}

// A strided matrix as BLAS sees it (as in tensor/cpu/matmul.cc): row major
// (col stride 1) or column major (row stride 1), with its leading dimension.
// Strides of size-1 dims are ignored; row major is preferred when both fit.
bool GetLayout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, bool* col_major,
               int64_t* ld) {
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1))) {
    *col_major = false;
    *ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    return true;
  }
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1))) {
    *col_major = true;
    *ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    return true;
  }
  return false;
}

cudaDataType_t LtType(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBF16:
      return CUDA_R_16BF;
    case Dtype::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// ---------------------------------------------------------------------------
// Per-(device, thread) cuBLASLt handle and workspace.
// ---------------------------------------------------------------------------

struct ThreadContext {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  Allocator* allocator = nullptr;
  void* workspace = nullptr;

  ThreadContext() = default;
  ThreadContext(const ThreadContext&) = delete;
  ThreadContext& operator=(const ThreadContext&) = delete;
  ~ThreadContext() {
    if (workspace != nullptr) {
      // GEMMs this thread queued may still be using the workspace: let them
      // finish before the block goes back to the (shared) caching allocator.
      if (cudaSetDevice(device) == cudaSuccess) cudaStreamSynchronize(cudaStreamPerThread);
      cudaGetLastError();  // errors at process exit are of no interest
      allocator->Deallocate(workspace, kMatmulWorkspaceBytes);
    }
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

// The calling thread's context for `device` (the device is current).
ThreadContext& Context(int device) {
  return *ThreadDeviceSlot<ThreadContext>(device, [device] {
    auto ctx = std::make_unique<ThreadContext>();
    ctx->device = device;
    CheckLt(cublasLtCreate(&ctx->handle), "cublasLtCreate");
    ctx->allocator = &DeviceAllocator(device);
    ctx->workspace = ctx->allocator->Allocate(kMatmulWorkspaceBytes);
    return ctx;
  });
}

// ---------------------------------------------------------------------------
// Cached descriptors.
// ---------------------------------------------------------------------------

// Everything one cublasLtMatmul needs besides the pointers and beta. The
// descriptors are only read by cublasLtMatmul, so threads share an entry.
struct LtEntry {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t c = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo = {};
  size_t workspace_bytes = 0;
  // False: cuBLASLt has no algorithm for this fused epilogue, or refused its
  // first call (RunLt); only fused entries are kept in that state (plain
  // GEMMs without one throw). Fused entries are one thread's.
  mutable std::atomic<bool> supported{true};

  LtEntry() = default;
  LtEntry(const LtEntry&) = delete;
  LtEntry& operator=(const LtEntry&) = delete;
  ~LtEntry() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

using CacheKey = absl::InlinedVector<int64_t, 24>;

struct CacheKeyHash {
  size_t operator()(const CacheKey& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// LRU cache of entries (as the CPU primitive cache). Creation runs outside
// the lock; two threads missing on one key both create and the first wins.
using LtCache = LruCache<CacheKey, LtEntry, CacheKeyHash>;

LtCache& Cache() {
  static LtCache* const cache = new LtCache(kMatmulCacheCapacity);  // leaked: no exit-time destruction
  return *cache;
}

// The switches below read the environment once (EnvIs), at their first use.
std::atomic<bool>& AllowTf32Flag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_TF32", "1")};
  return flag;
}

std::atomic<int64_t> epilogues_fused{0};
std::atomic<int64_t> epilogues_unfused{0};

std::atomic<bool>& TuneFlag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_GEMM_TUNE", "1")};
  return flag;
}

std::atomic<int64_t> gemms_tuned{0};
std::atomic<int64_t> tuned_other_than_first{0};

std::atomic<bool>& FuseEpiloguesFlag() {
  static std::atomic<bool> flag{!EnvIs("FSDP_CUDA_FUSE_EPILOGUES", "0")};
  return flag;
}

std::atomic<bool>& FuseBiasGradFlag() {
  static std::atomic<bool> flag{!EnvIs("FSDP_CUDA_BIAS_GRAD_EPILOGUE", "0")};
  return flag;
}

std::atomic<bool>& DGeluBiasGradFlag() {
  static std::atomic<bool> flag{EnvIs("FSDP_CUDA_DGELU_BIAS_GRAD", "1")};
  return flag;
}

cublasLtEpilogue_t LtEpilogue(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kBiasGradA:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our a
    case GemmEpilogue::kDGeluBiasGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;  // sums over D's columns: our c's rows
    default:
      return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

const char* EpilogueName(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kGeluAuxBias:
      return "gelu_aux_bias";
    case GemmEpilogue::kDGelu:
      return "dgelu";
    case GemmEpilogue::kBiasGradA:
      return "bias_grad_a";
    case GemmEpilogue::kDGeluBiasGrad:
      return "dgelu_bias_grad";
    default:
      return "none";
  }
}

// Sets the epilogue's pointers on a (per-thread) fused descriptor; before
// the heuristic query too, which reads their alignment.
bool EpilogueHasBias(GemmEpilogue kind) {
  return kind == GemmEpilogue::kBias || kind == GemmEpilogue::kGeluAuxBias;
}

bool EpilogueHasAux(GemmEpilogue kind) {
  return kind == GemmEpilogue::kGeluAuxBias || kind == GemmEpilogue::kDGelu ||
         kind == GemmEpilogue::kDGeluBiasGrad;
}

bool EpilogueHasBiasGrad(GemmEpilogue kind) {
  return kind == GemmEpilogue::kBiasGradA || kind == GemmEpilogue::kDGeluBiasGrad;
}

void SetEpiloguePointers(cublasLtMatmulDesc_t desc, const GemmEpilogueArgs& epi) {
  if (EpilogueHasBias(epi.kind) || EpilogueHasBiasGrad(epi.kind)) {
    const void* bias = EpilogueHasBiasGrad(epi.kind) ? epi.bias_grad : epi.bias;
    CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)),
            "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  if (EpilogueHasAux(epi.kind)) {
    CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &epi.aux, sizeof(epi.aux)),
            "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
  }
}

// One cuBLASLt call: `count` items of the strided batch.
struct LtCall {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  int64_t count = 1;
  int align_a = 256;  // bytes, of cuBLASLt's A (our b)
  int align_b = 256;  // of cuBLASLt's B (our a)
  int align_c = 256;
  // A fused epilogue (kNone: a plain GEMM) and the alignment of its vectors.
  const GemmEpilogueArgs* epilogue = nullptr;
  int align_bias = 256;
  int align_aux = 256;

  GemmEpilogue kind() const { return epilogue == nullptr ? GemmEpilogue::kNone : epilogue->kind; }
};

std::string Describe(const GemmArgs& args, const LtPlan& plan, const LtCall& call) {
  return absl::StrCat(DtypeName(args.in_dtype), " -> ", DtypeName(args.out_dtype), " (", args.m,
                      "x", args.k, ") @ (", args.k, "x", args.n, "), batch ", call.count,
                      ", cuBLASLt m=", plan.m, " n=", plan.n, " k=", plan.k,
                      " op(A)=", plan.a.trans ? "T" : "N", " lda=", plan.a.ld,
                      " op(B)=", plan.b.trans ? "T" : "N", " ldb=", plan.b.ld, " ldc=", plan.c.ld,
                      ", alignment ", call.align_a, "/", call.align_b, "/", call.align_c, " bytes",
                      call.compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? ", tf32" : "",
                      call.kind() == GemmEpilogue::kNone
                          ? ""
                          : absl::StrCat(", epilogue ", EpilogueName(call.kind())));
}

cublasLtMatrixLayout_t MakeLayout(cudaDataType_t type, const LtMatrix& m, int64_t count) {
  cublasLtMatrixLayout_t layout = nullptr;
  CheckLt(cublasLtMatrixLayoutCreate(&layout, type, m.rows, m.cols, m.ld),
          "cublasLtMatrixLayoutCreate");
  if (count > 1) {
    const int32_t count32 = static_cast<int32_t>(count);
    const int64_t stride = m.batch_stride;
    cublasStatus_t st = cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count32, sizeof(count32));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof(stride));
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      cublasLtMatrixLayoutDestroy(layout);
      CheckLt(st, "cublasLtMatrixLayoutSetAttribute");
    }
  }
  return layout;
}

// The operands of the call that creates an entry: tuning times the
// candidates on them (see SetMatmulTuning).
struct LtOperands {
  const void* a;  // our a (cuBLASLt's B)
  const void* b;  // our b (cuBLASLt's A)
  const void* c;  // read when beta != 0, never written by tuning
  ThreadContext* ctx;
};

// Elements from the first to the last of a column-major layout's batch.
int64_t LayoutSpan(const LtMatrix& m, int64_t count) {
  return (count - 1) * m.batch_stride + (m.cols - 1) * m.ld + m.rows;
}

// Tuning: the index of the fastest of `candidates` for this call, each run
// once to warm up and then kTuneRuns times between two events on the
// compute stream (one host wait in all). D is a scratch buffer laid out like
// C, so C (an accumulator when beta != 0) keeps its values; the epilogue's
// outputs (GELU's aux, the bias gradient) are written again by the real call.
// A candidate that fails to run is skipped; ties keep the heuristic's order.
int FastestCandidate(const LtEntry& e,
                     const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                     const GemmArgs& args, const LtPlan& plan, const LtCall& call,
                     const LtOperands& ops) {
  constexpr int kTuneRuns = 3;
  Tensor scratch;
  {
    ScopedMemoryCategory category(MemoryCategory::kTemporaries);
    scratch = Tensor::Empty({LayoutSpan(plan.c, call.count) * DtypeSize(args.out_dtype)},
                            Dtype::kU8, Device::Cuda(args.device));
  }
  const float alpha = 1.0f;
  const float beta = args.beta;
  const cudaStream_t stream = ComputeStream();
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(ops.ctx->handle, e.desc, &alpha, ops.b, e.a, ops.a, e.b, &beta, ops.c,
                          e.c, scratch.raw_data(), e.c, &algo, ops.ctx->workspace,
                          kMatmulWorkspaceBytes, stream);
  };
  std::vector<cudaEvent_t> events(2 * candidates.size(), nullptr);
  for (cudaEvent_t& ev : events) CheckCuda(cudaEventCreate(&ev), kOp, "cudaEventCreate");
  std::vector<bool> ran(candidates.size(), false);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (run(candidates[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up
    CheckCuda(cudaEventRecord(events[2 * i], stream), kOp, "cudaEventRecord");
    bool ok = true;
    for (int r = 0; r < kTuneRuns && ok; ++r) ok = run(candidates[i].algo) == CUBLAS_STATUS_SUCCESS;
    CheckCuda(cudaEventRecord(events[2 * i + 1], stream), kOp, "cudaEventRecord");
    ran[i] = ok;
  }
  CheckCuda(cudaStreamSynchronize(stream), kOp, "cudaStreamSynchronize (GEMM tuning)");
  int best = -1;
  float best_ms = 0.0f;
  for (size_t i = 0; i < candidates.size(); ++i) {
    float ms = 0.0f;
    if (ran[i] && cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]) == cudaSuccess &&
        (best < 0 || ms < best_ms)) {
      best = static_cast<int>(i);
      best_ms = ms;
    }
  }
  for (cudaEvent_t ev : events) cudaEventDestroy(ev);
  return best < 0 ? 0 : best;
}

std::shared_ptr<const LtEntry> CreateEntry(cublasLtHandle_t handle, const GemmArgs& args,
                                           const LtPlan& plan, const LtCall& call,
                                           const LtOperands& ops) {
  auto e = std::make_shared<LtEntry>();
  CheckLt(cublasLtMatmulDescCreate(&e->desc, call.compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const int32_t trans_a = plan.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = plan.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  CheckLt(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                         sizeof(trans_a)),
          "cublasLtMatmulDescSetAttribute(TRANSA)");
  CheckLt(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                         sizeof(trans_b)),
          "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (call.kind() != GemmEpilogue::kNone) {
    const uint32_t epilogue = LtEpilogue(call.kind());
    CheckLt(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (EpilogueHasAux(call.kind())) {
      const int64_t aux_ld = call.epilogue->aux_ld;
      CheckLt(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                             &aux_ld, sizeof(aux_ld)),
              "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
    }
    if (call.kind() == GemmEpilogue::kDGeluBiasGrad) {  // f32 sums of a 16-bit (or f32) D
      const cudaDataType_t bias_type = CUDA_R_32F;
      CheckLt(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                             &bias_type, sizeof(bias_type)),
              "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    }
    SetEpiloguePointers(e->desc, *call.epilogue);
  }
  e->a = MakeLayout(LtType(args.in_dtype), plan.a, call.count);
  e->b = MakeLayout(LtType(args.in_dtype), plan.b, call.count);
  e->c = MakeLayout(LtType(args.out_dtype), plan.c, call.count);

  cublasLtMatmulPreference_t pref = nullptr;
  CheckLt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_owner(pref, &cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace = kMatmulWorkspaceBytes;
  const uint32_t align_a = call.align_a, align_b = call.align_b, align_c = call.align_c;
  CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace, sizeof(workspace)),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const uint32_t*> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c},
  };
  for (const auto& [attr, value] : aligns) {
    CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, attr, value, sizeof(*value)),
            "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
  }
  // The heuristic's first algorithm, or with tuning its first candidates.
  const bool tune = MatmulTuning();
  std::vector<cublasLtMatmulHeuristicResult_t> results(tune ? kGemmTuneCandidates : 1);
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, e->desc, e->a, e->b, e->c, e->c, pref,
                                     static_cast<int>(results.size()), results.data(), &returned);
  const cublasLtMatmulHeuristicResult_t result = results[0];
  const bool found =
      st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (!found && call.kind() != GemmEpilogue::kNone) {
    e->supported = false;  // the caller runs the plain GEMM and its own kernel
    // Once per shape (the entry is kept): a timing of a fused switch would
    // otherwise measure the unfused path without a word.
    std::fprintf(stderr, "[matmul] cuBLASLt has no algorithm for %s: the unfused kernels run "
                 "instead\n", Describe(args, plan, call).c_str());
    return e;
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    ThrowOpError(kOp, "cublasLtMatmulAlgoGetHeuristic failed for ", Describe(args, plan, call),
                 ": ", cublasLtGetStatusString(st));
  }
  if (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    ThrowOpError(
        kOp, "cuBLASLt has no algorithm for ", Describe(args, plan, call),
        returned == 0 ? "" : absl::StrCat(" (", cublasLtGetStatusString(result.state), ")"));
  }
  e->algo = result.algo;
  e->workspace_bytes = result.workspaceSize;
  if (tune) {
    std::vector<cublasLtMatmulHeuristicResult_t> candidates;
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS &&
          results[i].workspaceSize <= static_cast<size_t>(kMatmulWorkspaceBytes)) {
        candidates.push_back(results[i]);
      }
    }
    if (candidates.size() > 1) {
      const int best = FastestCandidate(*e, candidates, args, plan, call, ops);
      e->algo = candidates[best].algo;
      e->workspace_bytes = candidates[best].workspaceSize;
      gemms_tuned.fetch_add(1, std::memory_order_relaxed);
      if (best != 0) tuned_other_than_first.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return e;
}

// One cublasLtMatmul over `call.count` batch items starting at a / b / c
// (our operands). False (nothing queued) when the call's fused epilogue has
// no algorithm, or cuBLASLt refuses the call (NOT_SUPPORTED, INVALID_VALUE).
bool RunLt(ThreadContext& ctx, const GemmArgs& args, const LtPlan& plan, const LtCall& call,
           const void* a, const void* b, void* c, const void* residual = nullptr) {
  const GemmEpilogue kind = call.kind();
  CacheKey key = {args.device,
                  static_cast<int64_t>(args.in_dtype),
                  static_cast<int64_t>(args.out_dtype),
                  static_cast<int64_t>(call.compute),
                  plan.m,
                  plan.n,
                  plan.k,
                  plan.a.trans,
                  plan.b.trans,
                  plan.a.ld,
                  plan.b.ld,
                  plan.c.ld,
                  call.count,
                  call.count > 1 ? plan.a.batch_stride : 0,
                  call.count > 1 ? plan.b.batch_stride : 0,
                  call.count > 1 ? plan.c.batch_stride : 0,
                  call.align_a,
                  call.align_b,
                  call.align_c};
  if (kind != GemmEpilogue::kNone) {
    // Fused entries are this thread's own (the pointers are set per call).
    key.insert(key.end(), {static_cast<int64_t>(kind), call.epilogue->aux_ld, call.align_bias,
                           call.align_aux, static_cast<int64_t>(reinterpret_cast<uintptr_t>(&ctx))});
  }
  std::shared_ptr<const LtEntry> e = Cache().Find(key);
  if (e == nullptr)
    e = Cache().Insert(key, CreateEntry(ctx.handle, args, plan, call,
                                        {a, b, residual != nullptr ? residual : c, &ctx}));
  if (!e->supported) return false;
  if (kind != GemmEpilogue::kNone) SetEpiloguePointers(e->desc, *call.epilogue);
  const float alpha = 1.0f;
  // cuBLASLt's A is our b and its B is our a (see matmul.h); D is C in place,
  // or C is the residual (read, beta 1) and D our c.
  const float beta = residual != nullptr ? 1.0f : args.beta;
  const void* c_in = residual != nullptr ? residual : c;
  const cublasStatus_t st =
      cublasLtMatmul(ctx.handle, e->desc, &alpha, b, e->a, a, e->b, &beta, c_in, e->c, c, e->c,
                     &e->algo, ctx.workspace, kMatmulWorkspaceBytes, ComputeStream());
  if (kind != GemmEpilogue::kNone &&
      (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
    // The heuristic took the fused epilogue and the call refuses it (it checks
    // more, e.g. the vector's dtype): nothing was queued, so the caller's
    // unfused path runs, now and for this entry's later calls.
    e->supported.store(false);
    std::fprintf(stderr, "[matmul] cublasLtMatmul refused %s (%s): the unfused kernels run "
                 "instead\n", Describe(args, plan, call).c_str(), cublasLtGetStatusString(st));
    return false;
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    ThrowOpError(kOp, "cublasLtMatmul failed for ", Describe(args, plan, call), ": ",
                 cublasLtGetStatusString(st));
  }
  return true;
}

// ---------------------------------------------------------------------------
// Kernels.
// ---------------------------------------------------------------------------

template <typename T>
__global__ void ScaleKernel(T* p, int64_t n, float beta) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = FromF<T>(beta == 0.0f ? 0.0f : beta * ToF(p[i]));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// The plan.
// ---------------------------------------------------------------------------

bool MakeLtPlan(const GemmArgs& args, LtPlan* plan, std::string* why) {
  const size_t nb = args.batch.size();
  if (args.a.batch_strides.size() != nb || args.b.batch_strides.size() != nb ||
      args.c.batch_strides.size() != nb) {
    *why = absl::StrCat("batch strides of a, b, c (", args.a.batch_strides.size(), ", ",
                        args.b.batch_strides.size(), ", ", args.c.batch_strides.size(),
                        ") do not match the ", nb, " batch dims");
    return false;
  }
  bool a_col = false, b_col = false, c_col = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  if (!GetLayout(args.m, args.k, args.a.row_stride, args.a.col_stride, &a_col, &lda)) {
    *why = absl::StrCat("a (", args.m, "x", args.k, ", strides ", args.a.row_stride, ",",
                        args.a.col_stride, ") is neither row nor column major");
    return false;
  }
  if (!GetLayout(args.k, args.n, args.b.row_stride, args.b.col_stride, &b_col, &ldb)) {
    *why = absl::StrCat("b (", args.k, "x", args.n, ", strides ", args.b.row_stride, ",",
                        args.b.col_stride, ") is neither row nor column major");
    return false;
  }
  if (!GetLayout(args.m, args.n, args.c.row_stride, args.c.col_stride, &c_col, &ldc) || c_col) {
    *why = absl::StrCat("c (", args.m, "x", args.n, ", strides ", args.c.row_stride, ",",
                        args.c.col_stride, ") is not row major");
    return false;
  }
  LtPlan p;
  p.m = args.n;
  p.n = args.m;
  p.k = args.k;
  // cuBLASLt's A = our b, to be read as b^T (n x k).
  p.a = b_col ? LtMatrix{true, args.k, args.n, ldb} : LtMatrix{false, args.n, args.k, ldb};
  // cuBLASLt's B = our a, to be read as a^T (k x m).
  p.b = a_col ? LtMatrix{true, args.m, args.k, lda} : LtMatrix{false, args.k, args.m, lda};
  // C = D = our c: column-major c^T (n x m).
  p.c = LtMatrix{false, args.n, args.m, ldc};
  if (nb > 0) {
    p.batch = args.batch.back();
    p.a.batch_stride = args.b.batch_strides.back();
    p.b.batch_stride = args.a.batch_strides.back();
    p.c.batch_stride = args.c.batch_strides.back();
    p.outer.assign(args.batch.begin(), args.batch.end() - 1);
    p.outer_a.assign(args.a.batch_strides.begin(), args.a.batch_strides.end() - 1);
    p.outer_b.assign(args.b.batch_strides.begin(), args.b.batch_strides.end() - 1);
    p.outer_c.assign(args.c.batch_strides.begin(), args.c.batch_strides.end() - 1);
  }
  *plan = std::move(p);
  return true;
}

int AlignmentBytes(const void* ptr, std::initializer_list<int64_t> offsets) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | 256;
  for (int64_t o : offsets) bits |= static_cast<uint64_t>(o < 0 ? -o : o);
  return static_cast<int>(bits & (~bits + 1));  // lowest set bit
}

// ---------------------------------------------------------------------------
// Entry points.
// ---------------------------------------------------------------------------

namespace {

// The checks both entry points make, the plan, and the call's compute type.
LtPlan CheckAndPlan(const GemmArgs& args, LtCall* call) {
  OP_CHECK(args.m > 0 && args.n > 0 && args.k > 0, kOp, "empty GEMM (", args.m, "x", args.k, " @ ",
           args.k, "x", args.n, ") reached the CUDA kernel");
  const Dtype in = args.in_dtype;
  OP_CHECK(in == Dtype::kF32 || in == Dtype::kBF16 || in == Dtype::kF16, kOp, "dtype ",
           DtypeName(in), " is not supported on CUDA; expected f32, bf16 or f16");
  OP_CHECK(args.out_dtype == in || args.out_dtype == Dtype::kF32, kOp, "output dtype ",
           DtypeName(args.out_dtype), " is not supported for ", DtypeName(in), " inputs");
  LtPlan plan;
  std::string why;
  OP_CHECK(MakeLtPlan(args, &plan, &why), kOp,
           "the CUDA kernel got operands it cannot take: ", why);
  CheckCuda(cudaSetDevice(args.device), kOp, "cudaSetDevice");
  call->compute =
      in == Dtype::kF32 && MatmulAllowTf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return plan;
}

}  // namespace

bool GemmWithEpilogue(const GemmArgs& args, const GemmEpilogueArgs& epilogue) {
  const bool has_bias = EpilogueHasBias(epilogue.kind);
  const bool has_aux = EpilogueHasAux(epilogue.kind);
  const bool has_bias_grad = EpilogueHasBiasGrad(epilogue.kind);
  const bool has_residual = epilogue.residual != nullptr;
  OP_CHECK((epilogue.kind != GemmEpilogue::kNone || has_residual) &&
               (!has_bias || epilogue.bias != nullptr) &&
               (!has_bias_grad || epilogue.bias_grad != nullptr),
           kOp, "a fused epilogue needs its kind (or a residual), and its vector for ",
           EpilogueName(epilogue.kind));
  OP_CHECK(
      !has_residual || epilogue.kind == GemmEpilogue::kNone || epilogue.kind == GemmEpilogue::kBias,
      kOp, "a residual goes with no epilogue or the bias one, not ", EpilogueName(epilogue.kind));
  OP_CHECK(args.batch.empty() && (args.beta == 0.0f || epilogue.kind == GemmEpilogue::kBiasGradA),
           kOp,
           "the ", EpilogueName(epilogue.kind),
           " epilogue takes one unbatched GEMM with beta 0 (got ", args.batch.size(),
           " batch dims, beta ", args.beta, ")");
  OP_CHECK(!has_aux || (epilogue.aux != nullptr && epilogue.aux_ld >= args.n), kOp, "the ",
           EpilogueName(epilogue.kind), " epilogue needs aux (", args.m, "x", args.n,
           ") with aux_ld >= ", args.n, "; got aux_ld ", epilogue.aux_ld);
  // cuBLASLt's rule for aux_ld; 16-byte vectors, as its fused kernels assume.
  const void* vector = has_bias ? epilogue.bias : has_bias_grad ? epilogue.bias_grad : nullptr;
  if (!MatmulFuseEpilogues() ||
      (epilogue.kind == GemmEpilogue::kBiasGradA && !MatmulFuseBiasGrad()) ||
      (has_aux && epilogue.aux_ld % 8 != 0) ||
      (vector != nullptr && AlignmentBytes(vector, {}) < 16) ||
      (has_aux && AlignmentBytes(epilogue.aux, {}) < 16)) {
    epilogues_unfused.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  LtCall call;
  const LtPlan plan = CheckAndPlan(args, &call);
  ThreadContext& ctx = Context(args.device);
  call.count = 1;
  call.epilogue = &epilogue;
  call.align_a = AlignmentBytes(args.b.data, {});
  call.align_b = AlignmentBytes(args.a.data, {});
  call.align_c = AlignmentBytes(args.c.data, {});
  if (has_residual) {  // C and D share the layout (and its alignment)
    call.align_c = std::min(call.align_c, AlignmentBytes(epilogue.residual, {}));
  }
  call.align_bias = vector != nullptr ? AlignmentBytes(vector, {}) : 256;
  call.align_aux = has_aux ? AlignmentBytes(epilogue.aux, {}) : 256;
  const bool fused =
      RunLt(ctx, args, plan, call, args.a.data, args.b.data, args.c.data, epilogue.residual);
  (fused ? epilogues_fused : epilogues_unfused).fetch_add(1, std::memory_order_relaxed);
  return fused;
}

void Gemm(const GemmArgs& args) {
  LtCall call;
  const LtPlan plan = CheckAndPlan(args, &call);
  ThreadContext& ctx = Context(args.device);
  const Dtype in = args.in_dtype;
  const int64_t in_size = DtypeSize(in);
  const int64_t out_size = DtypeSize(args.out_dtype);
  int64_t outer_count = 1;
  for (int64_t d : plan.outer) outer_count *= d;
  for (int64_t i = 0; i < outer_count; ++i) {
    // Element offsets of outer item i (row-major over plan.outer).
    int64_t oa = 0, ob = 0, oc = 0;
    int64_t rest = i;
    for (int d = static_cast<int>(plan.outer.size()) - 1; d >= 0; --d) {
      const int64_t idx = rest % plan.outer[d];
      rest /= plan.outer[d];
      oa += idx * plan.outer_a[d];
      ob += idx * plan.outer_b[d];
      oc += idx * plan.outer_c[d];
    }
    for (int64_t first = 0; first < plan.batch; first += kMaxLtBatch) {
      call.count = std::min(kMaxLtBatch, plan.batch - first);
      // Our a is cuBLASLt's B (plan.b), our b its A (plan.a).
      const char* a =
          static_cast<const char*>(args.a.data) + (oa + first * plan.b.batch_stride) * in_size;
      const char* b =
          static_cast<const char*>(args.b.data) + (ob + first * plan.a.batch_stride) * in_size;
      char* c = static_cast<char*>(args.c.data) + (oc + first * plan.c.batch_stride) * out_size;
      const bool batched = call.count > 1;
      call.align_a = AlignmentBytes(b, {batched ? plan.a.batch_stride * in_size : 0});
      call.align_b = AlignmentBytes(a, {batched ? plan.b.batch_stride * in_size : 0});
      call.align_c = AlignmentBytes(c, {batched ? plan.c.batch_stride * out_size : 0});
      RunLt(ctx, args, plan, call, a, b, c);
    }
  }
}

void MatmulScale(const Tensor& out, float beta) {
  SetDevice(out, kOp);
  const int64_t n = out.numel();
  if (n == 0) return;
  DispatchFloat(out.dtype(), kOp, [&](auto zero) {
    using T = decltype(zero);
    ScaleKernel<T><<<Blocks(n), kThreads, 0, ComputeStream()>>>(Ptr<T>(out), n, beta);
  });
  CheckLaunch(kOp);
}

void SetMatmulFuseEpilogues(bool fuse) { FuseEpiloguesFlag().store(fuse); }

bool MatmulFuseEpilogues() { return FuseEpiloguesFlag().load(std::memory_order_relaxed); }

void SetMatmulFuseBiasGrad(bool fuse) { FuseBiasGradFlag().store(fuse); }

bool MatmulFuseBiasGrad() { return FuseBiasGradFlag().load(std::memory_order_relaxed); }

void SetMatmulDGeluBiasGrad(bool fuse) { DGeluBiasGradFlag().store(fuse); }

bool MatmulDGeluBiasGrad() { return DGeluBiasGradFlag().load(std::memory_order_relaxed); }

void SetMatmulAllowTf32(bool allow) { AllowTf32Flag().store(allow); }

bool MatmulAllowTf32() { return AllowTf32Flag().load(std::memory_order_relaxed); }

void SetMatmulTuning(bool tune) { TuneFlag().store(tune); }

bool MatmulTuning() { return TuneFlag().load(std::memory_order_relaxed); }

MatmulCacheStats GetMatmulCacheStats() {
  const LruCacheStats s = Cache().Stats();
  return {s.entries,
          s.hits,
          s.misses,
          epilogues_fused.load(),
          epilogues_unfused.load(),
          gemms_tuned.load(),
          tuned_other_than_first.load()};
}

}  // namespace cuda
}  // namespace tensor
