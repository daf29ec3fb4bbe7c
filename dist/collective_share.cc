// One rank's share of a threads-engine collective, on the host or a GPU
// (dist/collective_share.h).
#include "dist/collective_share.h"

#include <cstdint>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "dist/cpu_reduce.h"

namespace dist {
namespace internal {
namespace {

using ReduceFn = absl::FunctionRef<void(const std::vector<const void*>& ins,
                                        const std::vector<void*>& outs, int64_t count)>;
using CopyFn = absl::FunctionRef<void(void* dst, const void* src, int64_t bytes)>;

// The chunks of the share, whichever memory they are in.
void Share(const CollectiveCall& call, int rank, const std::vector<RankBuffers>& all,
           ReduceFn reduce, CopyFn copy) {
  const int n = static_cast<int>(all.size());
  const tensor::Dtype dtype = call.input.defined() ? call.input.dtype() : tensor::Dtype::kF32;
  const int64_t es = tensor::DtypeSize(dtype);
  switch (call.kind) {
    case CollectiveKind::kAllReduce: {
      const int64_t numel = call.input.numel();
      const int64_t begin = numel * rank / n;
      const int64_t end = numel * (rank + 1) / n;
      std::vector<const void*> ins;
      std::vector<void*> outs;
      for (const RankBuffers& b : all) {
        ins.push_back(static_cast<const char*>(b.in) + begin * es);
        outs.push_back(static_cast<char*>(b.out) + begin * es);
      }
      if (end > begin) reduce(ins, outs, end - begin);
      break;
    }
    case CollectiveKind::kReduceScatter: {
      const int64_t k = call.output.numel();
      std::vector<const void*> ins;
      for (const RankBuffers& b : all) ins.push_back(static_cast<const char*>(b.in) + rank * k * es);
      if (k > 0) reduce(ins, {all[rank].out}, k);
      break;
    }
    case CollectiveKind::kAllGather: {
      const int64_t bytes = call.input.numel() * es;
      char* out = static_cast<char*>(all[rank].out);
      for (int r = 0; r < n; ++r) {
        if (bytes > 0 && out + r * bytes != all[r].in) copy(out + r * bytes, all[r].in, bytes);
      }
      break;
    }
    case CollectiveKind::kBroadcast: {
      const int64_t bytes = call.input.numel() * es;
      if (bytes > 0 && rank != call.root && all[rank].out != all[call.root].in) {
        copy(all[rank].out, all[call.root].in, bytes);
      }
      break;
    }
    case CollectiveKind::kBarrier:
      break;
  }
}

tensor::cuda::BufferReduceOp ToBufferOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return tensor::cuda::BufferReduceOp::kSum;
    case ReduceOp::kAvg:
      return tensor::cuda::BufferReduceOp::kAvg;
    case ReduceOp::kMax:
      return tensor::cuda::BufferReduceOp::kMax;
    case ReduceOp::kMin:
      return tensor::cuda::BufferReduceOp::kMin;
  }
  return tensor::cuda::BufferReduceOp::kSum;
}

}  // namespace

void ShareOnHost(const CollectiveCall& call, int rank, const std::vector<RankBuffers>& all) {
  Share(
      call, rank, all,
      [&](const std::vector<const void*>& ins, const std::vector<void*>& outs, int64_t count) {
        ReduceBuffers(call.input.dtype(), call.op, ins, outs, count);
      },
      [](void* dst, const void* src, int64_t bytes) { std::memcpy(dst, src, bytes); });
}

void QueueShareOnDevice(const CollectiveCall& call, int rank, const std::vector<RankBuffers>& all,
                        int device, tensor::cuda::StreamHandle stream) {
  Share(
      call, rank, all,
      [&](const std::vector<const void*>& ins, const std::vector<void*>& outs, int64_t count) {
        tensor::cuda::ReduceBuffersOnDevice(call.input.dtype(), ToBufferOp(call.op), ins, outs,
                                            count, device, stream);
      },
      [&](void* dst, const void* src, int64_t bytes) {
        tensor::cuda::CopyOnStream(dst, src, bytes, device, stream);
      });
}

}  // namespace internal
}  // namespace dist
