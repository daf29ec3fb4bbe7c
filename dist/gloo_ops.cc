// The gloo engine's data plane (gloo_ops.h).
#include "dist/gloo_ops.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/context.h"

namespace dist {
namespace internal {
namespace gloo_ops {
namespace {

using tensor::Dtype;
using tensor::Tensor;

// Elementwise reductions for gloo::AllreduceOptions::setReduceFunction:
// c[i] = op(a[i], b[i]). Max/min propagate NaN (as the threads engine does).
template <typename T>
void SumFn(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(x[i] + y[i]);
}
// kMax: the larger, else the smaller; a NaN wins either way.
template <typename T, bool kMax>
void ExtremumFn(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x[i]) || std::isnan(y[i])) {
        out[i] = std::isnan(x[i]) ? x[i] : y[i];
        continue;
      }
    }
    out[i] = (kMax ? x[i] > y[i] : x[i] < y[i]) ? x[i] : y[i];
  }
}

template <typename T>
void GlooAllReduce(gloo::Context* ctx, T* data, size_t count, ReduceOp op,
                   std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
  opts.setOutput<T>(data, count);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      opts.setReduceFunction(&SumFn<T>);
      break;
    case ReduceOp::kMax:
      opts.setReduceFunction(&ExtremumFn<T, /*kMax=*/true>);
      break;
    case ReduceOp::kMin:
      opts.setReduceFunction(&ExtremumFn<T, /*kMax=*/false>);
      break;
  }
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
  if (op == ReduceOp::kAvg) {
    if constexpr (std::is_floating_point_v<T>) {
      const T n = static_cast<T>(ctx->size);
      for (size_t i = 0; i < count; ++i) data[i] /= n;
    }
  }
}

// In-place all-reduce of a contiguous tensor whose dtype Gloo reduces natively
// here (f32, i32, i64, u8).
void AllReduceNative(gloo::Context* ctx, const Tensor& t, ReduceOp op,
                     std::chrono::milliseconds timeout) {
  const size_t n = static_cast<size_t>(t.numel());
  switch (t.dtype()) {
    case Dtype::kF32:
      GlooAllReduce<float>(ctx, static_cast<float*>(t.raw_data()), n, op, timeout);
      return;
    case Dtype::kI32:
      GlooAllReduce<int32_t>(ctx, static_cast<int32_t*>(t.raw_data()), n, op, timeout);
      return;
    case Dtype::kI64:
      GlooAllReduce<int64_t>(ctx, static_cast<int64_t*>(t.raw_data()), n, op, timeout);
      return;
    case Dtype::kU8:
      GlooAllReduce<uint8_t>(ctx, static_cast<uint8_t*>(t.raw_data()), n, op, timeout);
      return;
    default:
      throw std::logic_error("AllReduceNative: unsupported dtype");
  }
}

bool IsHalf(Dtype d) { return d == Dtype::kF16 || d == Dtype::kBF16; }

}  // namespace

Staged Stage(const CollectiveCall& call) {
  // Gloo reads and writes host memory: a GPU tensor would need the issuing
  // stream's work ordered before its reads, and its result copied back
  // before the Work completes, which this engine does not do.
  for (const Tensor* t : {&call.input, &call.output}) {
    if (t->defined() && !t->device().is_cpu()) {
      throw std::invalid_argument(absl::StrCat(
          "the gloo engine takes CPU tensors; the ", t == &call.input ? "input" : "output",
          " is on ", t->device().ToString(),
          " (the nccl engine takes GPU tensors, the threads engine ranks sharing a GPU)"));
    }
  }
  Staged s;
  const Tensor& in = call.input;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      s.work = IsHalf(in.dtype()) ? in.To(Dtype::kF32) : in.Contiguous();
      break;
    case CollectiveKind::kReduceScatter:
      s.work = (IsHalf(in.dtype()) ? in.To(Dtype::kF32) : in.Clone()).Flatten();
      break;
    case CollectiveKind::kAllGather:
      s.work = in.is_contiguous() ? in.Clone() : in.Contiguous();
      s.out = call.output.is_contiguous() ? call.output
                                          : Tensor::Empty(call.output.shape(), call.output.dtype());
      break;
    case CollectiveKind::kBroadcast:
      s.work = in.Contiguous();
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  return s;
}

void AllGatherBytes(gloo::Context* ctx, const void* in, void* out, size_t bytes_per_rank,
                    std::chrono::milliseconds timeout) {
  gloo::AllgatherOptions opts(std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
  opts.setInput<uint8_t>(static_cast<uint8_t*>(const_cast<void*>(in)), bytes_per_rank);
  opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), bytes_per_rank * ctx->size);
  opts.setTimeout(timeout);
  gloo::allgather(opts);
}

std::vector<int64_t> Describe(const CollectiveCall& call, const absl::Status& staging) {
  return {1,
          !call.error.ok() || absl::IsInvalidArgument(staging) ? 1
          : staging.ok()                                       ? 0
                                                               : 2,
          static_cast<int64_t>(call.kind),
          static_cast<int64_t>(call.op),
          call.input.defined() ? static_cast<int64_t>(call.input.dtype()) : -1,
          call.input.defined() ? call.input.numel() : -1,
          call.output.defined() ? call.output.numel() : -1,
          call.root};
}

std::string DescribeRemote(const int64_t* d) {
  CollectiveKind kind = static_cast<CollectiveKind>(d[2]);
  const std::string name(CollectiveName(kind));
  const std::string dtype =
      d[4] >= 0 ? std::string(tensor::DtypeName(static_cast<Dtype>(d[4]))) : "?";
  const std::string op(ReduceOpName(static_cast<ReduceOp>(d[3])));
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return absl::StrCat(name, "(", op, ", ", dtype, ", ", d[5], " elements)");
    case CollectiveKind::kReduceScatter:
      return absl::StrCat(name, "(", op, ", ", dtype, ", ", d[5], " -> ", d[6], " elements)");
    case CollectiveKind::kAllGather:
      return absl::StrCat(name, "(", dtype, ", ", d[5], " -> ", d[6], " elements)");
    case CollectiveKind::kBroadcast:
      return absl::StrCat(name, "(root ", d[7], ", ", dtype, ", ", d[5], " elements)");
    case CollectiveKind::kBarrier:
      return absl::StrCat(name, "()");
  }
  return name;
}

bool SameCall(const int64_t* a, const int64_t* b) {
  for (int i = 2; i < kDescLen; ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

void RunData(gloo::Context* ctx, const CollectiveCall& call, const Staged& staged,
             std::chrono::milliseconds timeout) {
  const Tensor& work = staged.work;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduceScatter:  // all-reduce the whole input; Finish keeps chunk `rank`
      if (work.numel() > 0) AllReduceNative(ctx, work, call.op, timeout);
      return;
    case CollectiveKind::kAllGather:
      if (work.nbytes() > 0) {
        AllGatherBytes(ctx, work.raw_data(), staged.out.raw_data(),
                       static_cast<size_t>(work.nbytes()), timeout);
      }
      return;
    case CollectiveKind::kBroadcast:
      if (work.nbytes() > 0) {
        gloo::BroadcastOptions opts(
            std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
        opts.setOutput<uint8_t>(static_cast<uint8_t*>(work.raw_data()),
                                static_cast<size_t>(work.nbytes()));
        opts.setRoot(call.root);
        opts.setTimeout(timeout);
        gloo::broadcast(opts);
      }
      return;
    case CollectiveKind::kBarrier: {
      gloo::BarrierOptions opts(std::shared_ptr<gloo::Context>(ctx, [](gloo::Context*) {}));
      opts.setTimeout(timeout);
      gloo::barrier(opts);
      return;
    }
  }
}

void Finish(const CollectiveCall& call, const Staged& staged, int rank) {
  const Tensor& work = staged.work;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      if (!work.SharesStorageWith(call.input)) {
        Tensor target = call.input;
        target.CopyFrom(work);
      }
      return;
    case CollectiveKind::kReduceScatter: {
      const int64_t k = call.output.numel();
      Tensor out = call.output;
      out.CopyFrom(work.Narrow(0, rank * k, k).Reshape(call.output.shape()));
      return;
    }
    case CollectiveKind::kAllGather:
      if (!staged.out.SharesStorageWith(call.output)) {
        Tensor target = call.output;
        target.CopyFrom(staged.out);
      }
      return;
    case CollectiveKind::kBarrier:
      return;
  }
}

}  // namespace gloo_ops
}  // namespace internal
}  // namespace dist
