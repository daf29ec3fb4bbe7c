// The gloo engine's data plane: a call's tensors staged into the contiguous
// buffers in gloo's dtypes (f16/bf16 reduced as f32), gloo's collectives on
// them, the result copied back, and the descriptor every rank publishes
// before a call so that mismatched calls fail on every rank instead of
// hanging. Private to the gloo engine (gloo_group.cc runs the protocol).
#ifndef DIST_GLOO_OPS_H_
#define DIST_GLOO_OPS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dist/process_group.h"
#include "tensor/tensor.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace dist {
namespace internal {
namespace gloo_ops {

// The contiguous buffers in Gloo's dtypes that a call's data phase works on,
// allocated before the descriptors are exchanged: a rank short of memory
// tells its peers there, while the group is still in step, instead of
// leaving them inside a collective it cannot join. Copied back by Finish.
struct Staged {
  // all_reduce, reduce_scatter: what is reduced in place (f16/bf16 as f32;
  // reduce_scatter: a flat copy of the whole input). all_gather: this rank's
  // piece (a copy: the input may alias the output). broadcast: the buffer.
  tensor::Tensor work;
  tensor::Tensor out;  // all_gather: where the pieces land
};

// Stages `call`'s tensors; throws std::invalid_argument for a tensor not on
// the CPU, std::bad_alloc when short of memory.
Staged Stage(const CollectiveCall& call);

// The collective itself, on the staged buffers (throws gloo's exceptions).
void RunData(gloo::Context* ctx, const CollectiveCall& call, const Staged& staged,
             std::chrono::milliseconds timeout);

// Copies the staged result into the call's tensors (converting the dtype;
// nothing is allocated); `rank` picks a reduce_scatter's chunk.
void Finish(const CollectiveCall& call, const Staged& staged, int rank);

// `bytes_per_rank` at `in` from every rank, in rank order, into `out`.
void AllGatherBytes(gloo::Context* ctx, const void* in, void* out, size_t bytes_per_rank,
                    std::chrono::milliseconds timeout);

// The descriptor every rank publishes before a call: kDescLen values.
// d[1] is the rank's state: 0 ready, 1 invalid arguments (or tensors it
// could not stage), 2 out of memory while staging.
inline constexpr int kDescLen = 8;
std::vector<int64_t> Describe(const CollectiveCall& call, const absl::Status& staging);
// A peer's descriptor as its call: "all_reduce(sum, f32, 8 elements)".
std::string DescribeRemote(const int64_t* d);
// True when two descriptors describe the same call (their states aside).
bool SameCall(const int64_t* a, const int64_t* b);

}  // namespace gloo_ops
}  // namespace internal
}  // namespace dist

#endif  // DIST_GLOO_OPS_H_
