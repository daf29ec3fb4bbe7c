// One rank's share of a threads-engine collective (dist/thread_group.h) over
// the buffers every rank published: all_reduce and reduce_scatter reduce
// chunk `rank` of every input, all_gather and broadcast copy. The ranks run
// their shares in parallel and together they make the whole collective, with
// no intermediate copies. On host buffers (ShareOnHost: dist/cpu_reduce.h's
// arithmetic and memcpy) or on one GPU (QueueShareOnDevice: the same
// arithmetic in a kernel, device copies, queued on a stream).
#ifndef DIST_COLLECTIVE_SHARE_H_
#define DIST_COLLECTIVE_SHARE_H_

#include <vector>

#include "dist/process_group.h"
#include "tensor/cuda_backend.h"

namespace dist {
namespace internal {

// A rank's contiguous buffers: the call's input (k or size * k elements, as
// the call says) and output (the input for in-place calls).
struct RankBuffers {
  const void* in = nullptr;
  void* out = nullptr;
};

// `call` is this rank's (matched on every rank and valid); all[r] are rank
// r's buffers, all on the host.
void ShareOnHost(const CollectiveCall& call, int rank, const std::vector<RankBuffers>& all);

// The same with every buffer on cuda:`device`, queued on `stream` (which
// must already wait for the work producing every rank's input). At most
// tensor::cuda::kMaxReduceBuffers ranks. Throws tensor::OpError when CUDA fails.
void QueueShareOnDevice(const CollectiveCall& call, int rank, const std::vector<RankBuffers>& all,
                        int device, tensor::cuda::StreamHandle stream);

}  // namespace internal
}  // namespace dist

#endif  // DIST_COLLECTIVE_SHARE_H_
