// The part of cuBLASLt the project calls, for the CPU emulation (see
// cuda_emu.h): D = alpha op(A) op(B) + beta C over column-major layouts with
// leading dimensions, strided batches, TRANSA / TRANSB, f32 / bf16 / f16
// storage and f32 accumulation, as cublasLtMatmul defines it. The point is to
// check how the project describes its GEMMs to cuBLASLt (row-major tensors
// as transposed column-major matrices, leading dimensions, batch strides), so
// descriptors are validated the way the library validates them and anything
// else the project does not use is refused with CUBLAS_STATUS_NOT_SUPPORTED.
// Epilogues: BIAS, GELU_AUX_BIAS (the tanh GELU, its input stored in the
// aux matrix), DGELU (the product times the tanh GELU's derivative at the
// aux matrix), DGELU_BGRAD (DGELU, and D's row sums over its columns, before
// D's rounding, written to the bias pointer) and BGRADB (op(B)'s sums over k
// written to the bias pointer), the bias vectors (read or written) in
// BIAS_DATA_TYPE (D's type unless set), unbatched, with the library's rules on their attributes (a
// bias pointer for the bias ones; an aux pointer and an aux leading dimension
// that is a multiple of 8 and at least D's rows for the GELU ones).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "third_party/cuda/emu/counters.h"
#include "third_party/cuda/emu/pending.h"
#include "third_party/cuda/emu/stream_device.h"

namespace {

// Algorithms the heuristic offers (the first is what callers run untuned).
constexpr int kEmuAlgorithms = 3;

// F32 and F32_FAST_TF32 both accumulate in f32 here (no TF32 rounding).
struct Desc {
  int32_t trans_a = CUBLAS_OP_N;
  int32_t trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // read; written by BGRADB and DGELU_BGRAD
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t bias_type = -1;  // BIAS_DATA_TYPE; -1: D's type
};

struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t batch_stride = 0;
};

struct Pref {};

Desc* D(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* L(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }

size_t Size(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
  }
}

float Load(const void* base, cudaDataType t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(base)[i];
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return __half2float(static_cast<const __half*>(base)[i]);
  }
}

void Store(void* base, cudaDataType t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(base)[i] = v; break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
  }
}

bool ValidLayout(const Layout& l) {
  return Size(l.type) != 0 && l.ld >= static_cast<int64_t>(l.rows > 0 ? l.rows : 1) &&
         l.batch >= 1;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete reinterpret_cast<int*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS (cuda_emu)";
  }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (scale != CUDA_R_32F ||
      (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new Desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete D(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  if (desc == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Desc& d = *D(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      if (bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      uint32_t e;
      std::memcpy(&e, buf, sizeof(e));
      if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS &&
          e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS && e != CUBLASLT_EPILOGUE_DGELU &&
          e != CUBLASLT_EPILOGUE_DGELU_BGRAD && e != CUBLASLT_EPILOGUE_BGRADB) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
      }
      d.epilogue = e;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (bytes != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.bias, buf, bytes);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      if (bytes != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.aux, buf, bytes);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      if (bytes != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&d.aux_ld, buf, bytes);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      int32_t t;
      std::memcpy(&t, buf, sizeof(t));
      if (t != CUDA_R_32F && t != CUDA_R_16BF && t != CUDA_R_16F) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
      }
      d.bias_type = t;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t op;
  std::memcpy(&op, buf, sizeof(op));
  if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
  (attr == CUBLASLT_MATMUL_DESC_TRANSA ? D(desc)->trans_a : D(desc)->trans_b) = op;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  auto* l = new Layout{type, rows, cols, ld};
  if (!ValidLayout(*l)) {
    delete l;
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete L(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  if (layout == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
    if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&L(layout)->batch, buf, bytes);
    return L(layout)->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  }
  if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
    if (bytes != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&L(layout)->batch_stride, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Pref*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void* buf, size_t) {
  return pref != nullptr && buf != nullptr ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

// Shapes agree: op(A) is m x k, op(B) k x n, C and D m x n, batches equal.
static cublasStatus_t CheckShapes(const Desc& d, const Layout& a, const Layout& b,
                                  const Layout& c, const Layout& dd) {
  const uint64_t m = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t k = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t kb = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t n = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  if (k != kb || c.rows != m || c.cols != n || dd.rows != m || dd.cols != n) {
    std::fprintf(stderr,
                 "cuda_emu cublasLt: shapes disagree: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, "
                 "D %llux%llu\n",
                 (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb,
                 (unsigned long long)n, (unsigned long long)c.rows, (unsigned long long)c.cols,
                 (unsigned long long)dd.rows, (unsigned long long)dd.cols);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a.batch != dd.batch || b.batch != dd.batch || c.batch != dd.batch) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (c.type != dd.type || a.type != b.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    if (dd.batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;  // not emulated
    const bool aux = d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                     d.epilogue == CUBLASLT_EPILOGUE_DGELU ||
                     d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    if (d.epilogue != CUBLASLT_EPILOGUE_DGELU && d.bias == nullptr) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (aux &&
        (d.aux == nullptr || d.aux_ld % 8 != 0 || d.aux_ld < static_cast<int64_t>(dd.rows))) {
      std::fprintf(stderr, "cuda_emu cublasLt: GELU aux %p with ld %lld for D of %llu rows\n",
                   d.aux, (long long)d.aux_ld, (unsigned long long)dd.rows);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The tanh GELU and its derivative in fp32.
static float Gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}

static float GeluGrad(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (handle == nullptr || desc == nullptr || pref == nullptr || requested <= 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const cublasStatus_t st = CheckShapes(*D(desc), *L(a), *L(b), *L(c), *L(d));
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // kEmuAlgorithms candidates, told apart by the first word of the algo
  // (cublasLtMatmul computes the same for each), so that callers that time
  // the candidates (GEMM tuning) run their code.
  const int n = std::min(requested, kEmuAlgorithms);
  for (int i = 0; i < n; ++i) {
    std::memset(&results[i], 0, sizeof(results[i]));
    results[i].algo.data[0] = static_cast<uint64_t>(i);
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].workspaceSize = 0;
    results[i].wavesCount = 1.0f;
  }
  *returned = n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t adesc, const void* B,
                              cublasLtMatrixLayout_t bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t cdesc, void* Dp, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
  if (handle == nullptr || desc == nullptr || alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Copies: the descriptors may change or go before the deferred work runs.
  const Desc d = *D(desc);
  const Layout a = *L(adesc), b = *L(bdesc), c = *L(cdesc), dl = *L(ddesc);
  const cublasStatus_t st = CheckShapes(d, a, b, c, dl);
  // Tests of the caller's fallback: CUDA_EMU_LT_REFUSE_EPILOGUES=1 refuses every
  // fused epilogue here, after the heuristic took it, as cuBLASLt may (it
  // checks more at the call, e.g. the bias vector's dtype): nothing launched.
  // Read at each call.
  const char* refuse = std::getenv("CUDA_EMU_LT_REFUSE_EPILOGUES");
  if (st == CUBLAS_STATUS_SUCCESS && d.epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
      refuse != nullptr && std::strcmp(refuse, "1") == 0) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    cuda_emu::CountLaunch("cublasLtMatmul");
    return st;
  }
  // Its kernels launch on the current device: on another device's stream they
  // fail, and so does the call (whose launch error cuBLASLt keeps to itself).
  if (!cuda_emu::StreamOnCurrentDevice(stream, "cublasLtMatmul", /*sets_last_error=*/false)) {
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  cuda_emu::CountLaunch("cublasLtMatmul");
  if (!cuda_emu::KernelsRun()) {
    cuda_emu::RunOnStream(stream, [] {});
    return CUBLAS_STATUS_SUCCESS;
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // In the stream's order (deferred where the stream defers, pending.h).
  cuda_emu::RunOnStream(stream, [=] {
    const int64_t m = dl.rows, n = dl.cols;
    const int64_t k = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
    const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
    const cudaDataType bias_type =
        d.bias_type < 0 ? dl.type : static_cast<cudaDataType>(d.bias_type);
    const bool dgelu = d.epilogue == CUBLASLT_EPILOGUE_DGELU ||
                       d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    // DGELU_BGRAD: D's row sums (over its columns), of the values before D's rounding.
    std::vector<float> row_sums(d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD ? m : 0, 0.0f);
    for (int32_t batch = 0; batch < dl.batch; ++batch) {
      const int64_t oa = batch * a.batch_stride, ob = batch * b.batch_stride;
      const int64_t oc = batch * c.batch_stride, od = batch * dl.batch_stride;
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < m; ++i) {
          float acc = 0.0f;
          for (int64_t p = 0; p < k; ++p) {
            // Column-major: element (r, s) of a stored matrix is at r + s * ld.
            const int64_t ia = ta ? p + i * a.ld : i + p * a.ld;
            const int64_t ib = tb ? j + p * b.ld : p + j * b.ld;
            acc += Load(A, a.type, oa + ia) * Load(B, b.type, ob + ib);
          }
          float out = al * acc;
          if (be != 0.0f) out += be * Load(C, c.type, oc + i + j * c.ld);
          if (d.epilogue == CUBLASLT_EPILOGUE_BIAS ||
              d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            out += Load(d.bias, bias_type, i);
          }
          if (dgelu) out *= GeluGrad(Load(d.aux, dl.type, i + j * d.aux_ld));
          if (!row_sums.empty()) row_sums[i] += out;
          if (d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            Store(d.aux, dl.type, i + j * d.aux_ld, out);
            out = Gelu(out);
          }
          Store(Dp, dl.type, od + i + j * dl.ld, out);
        }
        if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
          float sum = 0.0f;
          for (int64_t p = 0; p < k; ++p)
            sum += Load(B, b.type, ob + (tb ? j + p * b.ld : p + j * b.ld));
          Store(d.bias, bias_type, j, sum);
        }
      }
    }
    for (int64_t i = 0; i < static_cast<int64_t>(row_sums.size()); ++i) {
      Store(d.bias, bias_type, i, row_sums[i]);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
