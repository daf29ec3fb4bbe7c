// cuDNN's fused attention through the backend API (see attention_cudnn.h): the
// graphs, their plans (cached per device, thread and shape) and their runs.
#include "tensor/cuda/attention_cudnn.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/thread_device_slot.h"
#include "tensor/dtype.h"

namespace tensor {
namespace cuda {
namespace {

// A cuDNN call that failed while building a plan: what, and cuDNN's words.
struct CudnnFailure {
  std::string what;
};

// " (cuDNN's last error)", or "" when it has none.
std::string LastError() {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return last[0] ? std::string(" (") + last + ")" : "";
}

void Check(cudnnStatus_t status, const std::string& what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw CudnnFailure{what + ": " + cudnnGetErrorString(status) + LastError()};
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type, const char* name) : name_(name) {
    Check(cudnnBackendCreateDescriptor(type, &d_), std::string("create ") + name);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  void Set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    Check(cudnnBackendSetAttribute(d_, attr, type, count, values),
          std::string(name_) + " attribute " + std::to_string(static_cast<int>(attr)));
  }
  void SetDesc(cudnnBackendAttributeName_t attr, const Desc& value) {
    cudnnBackendDescriptor_t v = value.get();
    Set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  void Finalize() { Check(cudnnBackendFinalize(d_), std::string("finalize ") + name_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  const char* name_;
};

using Dims4 = std::vector<int64_t>;  // 4 entries

Dims4 Packed(const Dims4& dims) {
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}

// The tensors, operations and descriptors of one graph, kept alive with its plan.
class GraphBuilder {
 public:
  // handle nullptr: the tensors and operations only (no device needed), no
  // operation graph or plan (Plan returns nullptr).
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  const Desc& Tensor4(int64_t uid, cudnnDataType_t type, const Dims4& dims, const Dims4& strides,
                      bool is_virtual = false, bool by_value = false) {
    Desc& t = Keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    t.Set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    t.Set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    t.Set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    t.Set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    const int64_t alignment = 16;
    t.Set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (is_virtual) {
      const bool yes = true;
      t.Set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    if (by_value) {
      const bool yes = true;
      t.Set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    t.Finalize();
    return t;
  }
  // A virtual (intermediate) tensor, packed unless strides are given.
  const Desc& Virtual(int64_t uid, cudnnDataType_t type, const Dims4& dims,
                      const Dims4& strides = {}) {
    return Tensor4(uid, type, dims, strides.empty() ? Packed(dims) : strides, true);
  }
  // A by-value f32 scalar (its host pointer goes in the variant pack).
  const Desc& Scalar(int64_t uid) {
    return Tensor4(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b][, t]) computed in `prec` (GEN_INDEX along `axis`).
  void Pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t,
                 const Desc& y, cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc& pw = Keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    pw.Set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.Set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.Set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.Finalize();
    Desc& op = Keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (b != nullptr) op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) op.SetDesc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    const float one = 1.0f;
    op.Set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    op.Set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    AddOperation(op);
  }
  void Binary(cudnnPointwiseMode_t mode, const Desc& x, const Desc& b, const Desc& y,
              cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    Pointwise(mode, x, &b, nullptr, y, prec);
  }
  void Unary(cudnnPointwiseMode_t mode, const Desc& x, const Desc& y) {
    Pointwise(mode, x, nullptr, nullptr, y);
  }

  // c = a @ b (batched over the first two dimensions), f32 accumulation.
  void Matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc& mm = Keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    mm.Set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    mm.Finalize();
    Desc& op = Keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    op.SetDesc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.SetDesc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.SetDesc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    op.SetDesc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    AddOperation(op);
  }

  // y (B, H, T, 1) = reduce(x) over the last dimension.
  void Reduce(cudnnReduceTensorOp_t reduce, const Desc& x, const Desc& y) {
    Desc& r = Keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    r.Set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    r.Set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
#if CUDNN_VERSION >= 91100
    // An attribute of cuDNN 9.11 on (cudnn-frontend sets it only there too):
    // an older cuDNN refuses it, and every plan would fail.
    if (cudnnGetVersion() >= 91100) {
      const bool deterministic = false;
      r.Set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic);
    }
#endif
    r.Finalize();
    Desc& op = Keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    op.SetDesc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    op.SetDesc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.SetDesc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    AddOperation(op);
  }

  // y = x seen with y's dimensions and strides (the graphs' transposes).
  void Reshape(const Desc& x, const Desc& y) {
    Desc& op = Keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    op.SetDesc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.SetDesc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    AddOperation(op);
  }

  // The operation graph, cuDNN's heuristics (mode A, as the frontend) and the
  // first engine configuration whose plan finalizes. Returns the plan (nullptr
  // without a handle).
  cudnnBackendDescriptor_t Plan(int64_t* workspace_bytes) {
    if (handle_ == nullptr) return nullptr;
    Desc& graph = Keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    graph.Set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
              static_cast<int64_t>(ops_.size()), ops_.data());
    graph.Set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    graph.Finalize();
    Desc& heur = Keep(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    heur.SetDesc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.Set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heur.Finalize();
    int64_t count = 0;
    Check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          "engine heuristics: count of results");
    if (count <= 0) {
      throw CudnnFailure{"cuDNN's heuristics found no engine for the graph" + LastError()};
    }
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(Keep(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config").get());
    }
    int64_t returned = 0;
    Check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, configs.data()),
          "engine heuristics: results");
    std::string failures;
    for (int64_t i = 0; i < returned; ++i) {
      try {
        Desc& plan = Keep(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        // Both required: cudnn-frontend's plan builder refuses a plan without
        // its handle ("Check and Set the CUDNN_ATTR_EXECUTION_PLAN_HANDLE").
        plan.Set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        plan.Set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &configs[i]);
        plan.Finalize();
        Check(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, nullptr, workspace_bytes),
              "execution plan workspace size");
        return plan.get();
      } catch (const CudnnFailure& f) {
        failures += (failures.empty() ? "" : "; ") +
                    ("engine config " + std::to_string(i) + ": " + f.what);
      }
    }
    throw CudnnFailure{"no engine configuration finalized (" + failures + ")"};
  }

 private:
  // Finalizes an operation descriptor and makes it the graph's next operation.
  void AddOperation(Desc& op) {
    op.Finalize();
    ops_.push_back(op.get());
  }

  Desc& Keep(cudnnBackendDescriptorType_t type, const char* name) {
    descs_.push_back(std::make_unique<Desc>(type, name));
    return *descs_.back();
  }

  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Desc>> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// A built plan (or why there is none) for one shape and set of strides.
struct Plan {
  std::unique_ptr<GraphBuilder> graph;  // owns every descriptor, the plan's included
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
  std::string failure;  // non-empty: cuDNN has no plan; the caller falls back
};

// The uids of the graphs' non-virtual tensors (PyTorch's numbering).
enum Uid : int64_t {
  kQ = 0,
  kK = 1,  // K^T (B, H, D, T)
  kV = 2,  // forward V (B, H, T, D); backward V^T (B, H, D, T)
  kO = 3,
  kScale = 5,
  kOne = 7,       // backward: delta's factor (1: no dropout)
  kStats = 8,     // lse (B, H, T, 1)
  kDo = 9,        // backward
  kDq = 10,
  kDk = 11,
  kDv = 12,
  kDelta = 13,    // backward: rowsum(dO * O) (B, H, T, 1) f32
  kNegInfFwd = 11,  // PyTorch's too: kDk's number, in the forward graph, which has no dk
  kNegInfBwd = 20,
  kDqAccum = 30,  // backward: dq's f32 accumulator (B, H, T, D), zeroed (by cuDNN >= 9.6)
};

cudnnDataType_t CudnnType(Dtype d) {
  return d == Dtype::kBF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

Dims4 Dims(const Tensor& t) { return {t.dim(0), t.dim(1), t.dim(2), t.dim(3)}; }
// t's strides, where a dimension of size 1 with stride 0 (never stepped over)
// gets the packed stride over the next one, as PyTorch gives cuDNN: the same
// addresses, and no zero stride for cuDNN to refuse.
Dims4 Strides(const Tensor& t) {
  Dims4 s = {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]};
  for (int i = 2; i >= 0; --i) {
    if (t.dim(i) == 1 && s[i] == 0) s[i] = s[i + 1] * t.dim(i + 1);
  }
  return s;
}
// x (B, H, T, D) seen as x^T (B, H, D, T): the same memory.
Dims4 TransposedDims(const Tensor& t) { return {t.dim(0), t.dim(1), t.dim(3), t.dim(2)}; }
Dims4 TransposedStrides(const Tensor& t) {
  const Dims4 s = Strides(t);
  return {s[0], s[1], s[3], s[2]};
}

// The causal mask of a (B, H, T, T) f32 score tensor: keep where row >= column,
// -inf elsewhere (uid `neg_inf`, a by-value scalar). Returns the masked scores.
const Desc& CausalMask(GraphBuilder& g, const Desc& scores, const Dims4& tt, int64_t first_uid,
                       int64_t neg_inf) {
  const Desc& row = g.Virtual(first_uid, CUDNN_DATA_INT32, tt);
  const Desc& column = g.Virtual(first_uid + 1, CUDNN_DATA_INT32, tt);
  const Desc& keep = g.Virtual(first_uid + 2, CUDNN_DATA_BOOLEAN, tt);
  const Desc& minus_inf = g.Scalar(neg_inf);
  const Desc& masked = g.Virtual(first_uid + 3, CUDNN_DATA_FLOAT, tt);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.Pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, nullptr, column, CUDNN_DATA_FLOAT, 3);
  g.Binary(CUDNN_POINTWISE_CMP_GE, row, column, keep, CUDNN_DATA_BOOLEAN);
  g.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, &minus_inf, &keep, masked);
  return masked;
}

// The forward graph (PyTorch's node for node; virtual uids from 100).
std::unique_ptr<Plan> BuildForward(cudnnHandle_t handle, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out) {
  auto p = std::make_unique<Plan>();
  p->graph = std::make_unique<GraphBuilder>(handle);
  GraphBuilder& g = *p->graph;
  const cudnnDataType_t io = CudnnType(q.dtype());
  const int64_t b = q.dim(0), h = q.dim(1), t = q.dim(2);
  const Dims4 tt = {b, h, t, t}, rows = {b, h, t, 1};
  const Desc& vd = g.Tensor4(kV, io, Dims(v), Strides(v));
  const Desc& kt = g.Tensor4(kK, io, TransposedDims(k), TransposedStrides(k));
  const Desc& qd = g.Tensor4(kQ, io, Dims(q), Strides(q));
  const Desc& scale = g.Scalar(kScale);
  const Desc& stats = g.Tensor4(kStats, CUDNN_DATA_FLOAT, rows, Packed(rows));
  const Desc& o = g.Tensor4(kO, io, Dims(out), Strides(out));
  const Desc& s = g.Virtual(100, CUDNN_DATA_FLOAT, tt);
  const Desc& scaled = g.Virtual(101, CUDNN_DATA_FLOAT, tt);
  g.Matmul(qd, kt, s);
  g.Binary(CUDNN_POINTWISE_MUL, s, scale, scaled);
  const Desc& masked = CausalMask(g, scaled, tt, 102, kNegInfFwd);
  const Desc& row_max = g.Virtual(110, CUDNN_DATA_FLOAT, rows);
  const Desc& shifted = g.Virtual(111, CUDNN_DATA_FLOAT, tt);
  const Desc& e = g.Virtual(112, CUDNN_DATA_FLOAT, tt);
  const Desc& row_sum = g.Virtual(113, CUDNN_DATA_FLOAT, rows);
  const Desc& log_sum = g.Virtual(114, CUDNN_DATA_FLOAT, rows);
  const Desc& probs = g.Virtual(115, io, tt);
  g.Reduce(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  g.Binary(CUDNN_POINTWISE_SUB, masked, row_max, shifted);
  g.Unary(CUDNN_POINTWISE_EXP, shifted, e);
  g.Reduce(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  g.Unary(CUDNN_POINTWISE_LOG, row_sum, log_sum);
  g.Binary(CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
  g.Binary(CUDNN_POINTWISE_DIV, e, row_sum, probs);
  g.Matmul(probs, vd, o);
  p->plan = g.Plan(&p->workspace_bytes);
  return p;
}

// The backward graph (PyTorch's node for node; virtual uids from 100).
std::unique_ptr<Plan> BuildBackward(cudnnHandle_t handle, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& grad_out,
                                    const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  auto p = std::make_unique<Plan>();
  p->graph = std::make_unique<GraphBuilder>(handle);
  GraphBuilder& g = *p->graph;
  const cudnnDataType_t io = CudnnType(q.dtype());
  const int64_t b = q.dim(0), h = q.dim(1), t = q.dim(2), d = q.dim(3);
  const Dims4 tt = {b, h, t, t}, rows = {b, h, t, 1}, td = {b, h, t, d};
  const Dims4 transposed_tt = {b, h, t, t}, transposed_tt_strides = {h * t * t, t * t, 1, t};
  const Desc& stats = g.Tensor4(kStats, CUDNN_DATA_FLOAT, rows, Packed(rows));
  const Desc& d_o = g.Tensor4(kDo, io, Dims(grad_out), Strides(grad_out));
  const Desc& o = g.Tensor4(kO, io, Dims(out), Strides(out));
  const Desc& vt = g.Tensor4(kV, io, TransposedDims(v), TransposedStrides(v));
  const Desc& kt = g.Tensor4(kK, io, TransposedDims(k), TransposedStrides(k));
  const Desc& qd = g.Tensor4(kQ, io, Dims(q), Strides(q));
  const Desc& scale = g.Scalar(kScale);
  const Desc& d_v = g.Tensor4(kDv, io, Dims(dv), Strides(dv));
  const Desc& d_k = g.Tensor4(kDk, io, Dims(dk), Strides(dk));
  const Desc& d_q = g.Tensor4(kDq, io, Dims(dq), Strides(dq));
  // delta = rowsum(dO * O) * 1
  // PyTorch's strides for this one: (H T D, T D, H D, 1), as its log shows.
  const Desc& d_o_o = g.Virtual(100, CUDNN_DATA_FLOAT, td, {h * t * d, t * d, h * d, 1});
  const Desc& delta_sum = g.Virtual(101, CUDNN_DATA_FLOAT, rows);
  const Desc& one = g.Scalar(kOne);
  const Desc& delta = g.Tensor4(kDelta, CUDNN_DATA_FLOAT, rows, Packed(rows));
  g.Binary(CUDNN_POINTWISE_MUL, d_o, o, d_o_o);
  g.Reduce(CUDNN_REDUCE_TENSOR_ADD, d_o_o, delta_sum);
  g.Binary(CUDNN_POINTWISE_MUL, delta_sum, one, delta);
  // P = exp(scale q k^T - lse), masked
  const Desc& s = g.Virtual(102, CUDNN_DATA_FLOAT, tt);
  const Desc& scaled = g.Virtual(103, CUDNN_DATA_FLOAT, tt);
  const Desc& shifted = g.Virtual(104, CUDNN_DATA_FLOAT, tt);
  g.Matmul(qd, kt, s);
  g.Binary(CUDNN_POINTWISE_MUL, s, scale, scaled);
  g.Binary(CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  const Desc& masked = CausalMask(g, shifted, tt, 105, kNegInfBwd);
  const Desc& probs = g.Virtual(110, CUDNN_DATA_FLOAT, tt);
  g.Unary(CUDNN_POINTWISE_EXP, masked, probs);
  // dv = P^T dO
  const Desc& probs_t = g.Virtual(111, io, transposed_tt, transposed_tt_strides);
  g.Reshape(probs, probs_t);
  g.Matmul(probs_t, d_o, d_v);
  // dS = P * (dO v^T - delta) * scale
  const Desc& dp = g.Virtual(112, CUDNN_DATA_FLOAT, tt);
  const Desc& dp_centered = g.Virtual(113, CUDNN_DATA_FLOAT, tt);
  const Desc& ds_unscaled = g.Virtual(114, CUDNN_DATA_FLOAT, tt);
  const Desc& ds = g.Virtual(115, CUDNN_DATA_FLOAT, tt);
  g.Matmul(d_o, vt, dp);
  g.Binary(CUDNN_POINTWISE_SUB, dp, delta, dp_centered);
  g.Binary(CUDNN_POINTWISE_MUL, dp_centered, probs, ds_unscaled);
  g.Binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);
  // dk = dS^T q
  const Desc& ds_t = g.Virtual(116, io, transposed_tt, transposed_tt_strides);
  g.Reshape(ds, ds_t);
  g.Matmul(ds_t, qd, d_k);
  // dq = dS k, through the f32 accumulator
  const Desc& k_rows = g.Virtual(117, CUDNN_DATA_FLOAT, Dims(k), Strides(k));
  g.Reshape(kt, k_rows);
  const Desc& dq_accum = g.Tensor4(kDqAccum, CUDNN_DATA_FLOAT, td, Packed(td));
  g.Matmul(ds, k_rows, dq_accum);
  g.Unary(CUDNN_POINTWISE_IDENTITY, dq_accum, d_q);
  p->plan = g.Plan(&p->workspace_bytes);
  return p;
}

// The causal mask's fill: -inf, or the lowest float before cuDNN 9.10, whose
// softmax prefers it (cudnn-frontend's choice, by the loaded version).
float MaskValue() {
  return cudnnGetVersion() >= 91000 ? -INFINITY : std::numeric_limits<float>::lowest();
}

// The calling thread's cuDNN handle on one device, and its plans; or why
// there is no handle (kept: not retried, said once).
struct ThreadContext {
  int device = 0;
  cudnnHandle_t handle = nullptr;
  std::string unusable;  // non-empty: no handle, for this reason
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans;
  std::set<std::string> warned;

  ThreadContext() = default;
  ThreadContext(const ThreadContext&) = delete;
  ThreadContext& operator=(const ThreadContext&) = delete;
  ~ThreadContext() {
    // Attention this thread queued may still run its plans: let it finish
    // first (at a thread's exit; errors then are of no interest).
    if (cudaSetDevice(device) == cudaSuccess) cudaStreamSynchronize(cudaStreamPerThread);
    cudaGetLastError();
    plans.clear();  // descriptors before the handle
    if (handle != nullptr) cudnnDestroy(handle);
  }
};

// The calling thread's context for `device` (made current by the caller).
ThreadContext& Context(int device) {
  return *ThreadDeviceSlot<ThreadContext>(device, [&] {
    auto made = std::make_unique<ThreadContext>();
    made->device = device;
    const cudnnStatus_t created = cudnnCreate(&made->handle);
    if (created != CUDNN_STATUS_SUCCESS) {
      made->handle = nullptr;
      made->unusable = std::string("cudnnCreate: ") + cudnnGetErrorString(created);
      return made;
    }
    // The workspace and the backward's buffers are freed right after a run is
    // queued: safe only on the thread's stream, where their next use waits.
    const cudnnStatus_t stream = cudnnSetStream(made->handle, cudaStreamPerThread);
    if (stream != CUDNN_STATUS_SUCCESS) {
      made->unusable = std::string("cudnnSetStream: ") + cudnnGetErrorString(stream);
    }
    return made;
  });
}

// Whether ctx has a handle; else *why.
bool Usable(const ThreadContext& ctx, std::string* why) {
  if (ctx.unusable.empty()) return true;
  *why = ctx.unusable;
  return false;
}

void AppendTensorKey(std::vector<int64_t>* key, const Tensor& t) {
  for (int i = 0; i < 4; ++i) key->push_back(t.dim(i));
  for (int i = 0; i < 4; ++i) key->push_back(t.strides()[i]);
}

bool Aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// Strides (all but D's) multiples of 8 elements, none 0 over a dimension
// longer than 1 (a broadcast: outputs written there would collide), D's 1,
// and a 16-byte aligned start.
bool Vectorizable(const Tensor& t) {
  for (int i = 0; i < 3; ++i) {
    if (t.strides()[i] % 8 != 0 || (t.strides()[i] == 0 && t.dim(i) > 1)) return false;
  }
  return t.strides()[3] == 1 && Aligned16(t);
}

// The plan for `key`, built by `build` on its first use; nullptr with *why
// where cuDNN has none (remembered, and said once on stderr).
template <typename Build>
Plan* FindOrBuild(ThreadContext& ctx, const std::vector<int64_t>& key, Build build,
                  std::string* why) {
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) {
    std::unique_ptr<Plan> plan;
    try {
      plan = build(ctx.handle);
    } catch (const CudnnFailure& f) {
      plan = std::make_unique<Plan>();
      plan->failure = f.what;
    }
    it = ctx.plans.emplace(key, std::move(plan)).first;
  }
  if (!it->second->failure.empty()) {
    *why = "cuDNN has no attention plan here: " + it->second->failure;
    return nullptr;
  }
  return it->second.get();
}

// Runs `plan` with the (uid, pointer) pairs and a fresh workspace.
bool Execute(ThreadContext& ctx, const Plan& plan, const Device& device,
             std::vector<int64_t> uids, std::vector<void*> pointers, std::string* why) {
  Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = Tensor::Empty({plan.workspace_bytes}, Dtype::kU8, device);
  }
  try {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    pack.Set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
             static_cast<int64_t>(uids.size()), uids.data());
    pack.Set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             static_cast<int64_t>(pointers.size()), pointers.data());
    void* ws = workspace.defined() ? workspace.raw_data() : nullptr;
    pack.Set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    pack.Finalize();
    Check(cudnnBackendExecute(ctx.handle, plan.plan, pack.get()), "cudnnBackendExecute");
  } catch (const CudnnFailure& f) {
    *why = "cuDNN attention failed to run: " + f.what;
    return false;
  }
  return true;
}

// Says *why on stderr once per thread and kind of reason (its numbers left
// out: sampling's lengths, one more each token, would print a line a token):
// a run asked for cuDNN and gets our kernels.
void WarnOnce(ThreadContext& ctx, const std::string& why) {
  std::string kind = why;
  kind.erase(std::remove_if(kind.begin(), kind.end(), [](char c) { return c >= '0' && c <= '9'; }),
             kind.end());
  if (!ctx.warned.insert(kind).second) return;
  std::fprintf(stderr, "[flash_attention] cuDNN attention not used, our kernels instead: %s\n",
               why.c_str());
}

}  // namespace

bool CudnnAttentionBuilt() { return true; }

int64_t CudnnRuntimeVersion() { return static_cast<int64_t>(cudnnGetVersion()); }

bool CudnnAttentionEligible(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                            std::string* why) {
  if (q.dtype() != Dtype::kBF16 && q.dtype() != Dtype::kF16) {
    *why = "dtype " + std::string(DtypeName(q.dtype())) + " (bf16 or f16 only)";
  } else if (q.dim(3) != 64 && q.dim(3) != 128) {
    *why = "head size " + std::to_string(q.dim(3)) + " (64 or 128 only)";
  } else if (!causal) {
    *why = "non-causal attention (the causal graph only)";
  } else if (q.dim(2) != k.dim(2)) {
    *why = "T_q " + std::to_string(q.dim(2)) + " != T_k " + std::to_string(k.dim(2));
  } else if (q.numel() == 0) {
    *why = "empty q (B, H or T is 0)";
  } else if (!Vectorizable(q) || !Vectorizable(k) || !Vectorizable(v)) {
    *why = "q, k or v strides not multiples of 8 elements, or not 16-byte aligned";
  } else if (std::string decline = CudnnSdpaVersionDecline(CudnnRuntimeVersion(), q.dim(2));
             !decline.empty()) {
    *why = decline;
  } else {
    return true;
  }
  return false;
}

std::string CudnnAttentionCheckDescriptors(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& out, const Tensor& grad_out,
                                           const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  try {
    BuildForward(nullptr, q, k, v, out);
  } catch (const CudnnFailure& f) {
    return "forward: " + f.what;
  }
  try {
    BuildBackward(nullptr, q, k, v, out, grad_out, dq, dk, dv);
  } catch (const CudnnFailure& f) {
    return "backward: " + f.what;
  }
  return "";
}

bool CudnnAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                           bool causal, const Tensor& out, const Tensor& lse, std::string* why) {
  ThreadContext& ctx = Context(q.device().index);
  bool ok = Usable(ctx, why) && CudnnAttentionEligible(q, k, v, causal, why);
  if (ok && (!Vectorizable(out) || !Aligned16(lse))) {
    *why = "out's strides not multiples of 8 elements, or out / lse not 16-byte aligned";
    ok = false;
  }
  Plan* plan = nullptr;
  if (ok) {
    std::vector<int64_t> key = {0, static_cast<int64_t>(q.dtype())};
    for (const Tensor* t : {&q, &k, &v, &out}) AppendTensorKey(&key, *t);
    plan = FindOrBuild(
        ctx, key, [&](cudnnHandle_t handle) { return BuildForward(handle, q, k, v, out); }, why);
    ok = plan != nullptr;
  }
  if (ok) {
    float neg_inf = MaskValue();
    ok = Execute(ctx, *plan, q.device(), {kQ, kK, kV, kO, kStats, kScale, kNegInfFwd},
                 {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(),
                  &scale, &neg_inf},
                 why);
  }
  if (!ok) WarnOnce(ctx, *why);
  return ok;
}

bool CudnnAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, float scale, bool causal,
                            const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            std::string* why) {
  ThreadContext& ctx = Context(q.device().index);
  bool ok = Usable(ctx, why) && CudnnAttentionEligible(q, k, v, causal, why);
  if (ok && !(Vectorizable(out) && Vectorizable(grad_out) && Vectorizable(dq) &&
              Vectorizable(dk) && Vectorizable(dv) && Aligned16(lse))) {
    *why = "out, grad_out, dq, dk or dv strides not multiples of 8 elements, or not 16-byte "
           "aligned";
    ok = false;
  }
  Plan* plan = nullptr;
  if (ok) {
    std::vector<int64_t> key = {1, static_cast<int64_t>(q.dtype())};
    for (const Tensor* t : {&q, &k, &v, &out, &grad_out, &dq, &dk, &dv}) AppendTensorKey(&key, *t);
    plan = FindOrBuild(
        ctx, key,
        [&](cudnnHandle_t handle) {
          return BuildBackward(handle, q, k, v, out, grad_out, dq, dk, dv);
        },
        why);
    ok = plan != nullptr;
  }
  if (ok) {
    const int64_t b = q.dim(0), h = q.dim(1), t = q.dim(2), d = q.dim(3);
    Tensor delta = Tensor::Empty({b, h, t}, Dtype::kF32, q.device());
    Tensor dq_accum = Tensor::Empty({b, h, t, d}, Dtype::kF32, q.device());
    // cuDNN zeroes the dq accumulator itself from 9.6 on (the frontend memsets
    // it only before): one B*H*T*D*4-byte write fewer a call.
    const cudaError_t zeroed =
        cudnnGetVersion() >= 90600
            ? cudaSuccess
            : cudaMemsetAsync(dq_accum.raw_data(), 0, dq_accum.numel() * sizeof(float),
                              cudaStreamPerThread);
    if (zeroed != cudaSuccess) {
      cudaGetLastError();  // handled (our kernels run instead): not left for their launch check
      *why = std::string("zeroing the dq accumulator: ") + cudaGetErrorString(zeroed);
      ok = false;
    } else {
      float neg_inf = MaskValue(), one = 1.0f;
      ok = Execute(ctx, *plan, q.device(),
                   {kQ, kK, kV, kO, kDo, kStats, kScale, kOne, kNegInfBwd, kDq, kDk, kDv,
                    kDelta, kDqAccum},
                   {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(),
                    grad_out.raw_data(), lse.raw_data(), &scale, &one, &neg_inf, dq.raw_data(),
                    dk.raw_data(), dv.raw_data(), delta.raw_data(), dq_accum.raw_data()},
                   why);
    }
  }
  if (!ok) WarnOnce(ctx, *why);
  return ok;
}

}  // namespace cuda
}  // namespace tensor
