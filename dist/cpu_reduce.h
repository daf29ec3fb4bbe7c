// Elementwise reductions and copies over several same-sized host buffers: the
// arithmetic of the CPU collectives (threads engine; gloo's custom ops later).
#ifndef DIST_CPU_REDUCE_H_
#define DIST_CPU_REDUCE_H_

#include <cstdint>

#include "absl/types/span.h"
#include "dist/process_group.h"
#include "tensor/dtype.h"

namespace dist {
namespace internal {

// For i in [0, count): v = op(inputs[0][i], inputs[1][i], ...) combined in
// rank order (avg = sum / inputs.size(); f16 and bf16 accumulate in f32 and
// round once; integer sums wrap; max/min propagate NaN), then
// outputs[j][i] = v for every j. An output may be one of the inputs (each
// element is read before it is written); otherwise they must not overlap.
// Avg on an integer dtype is a caller error (CHECK).
void ReduceBuffers(tensor::Dtype dtype, ReduceOp op, absl::Span<const void* const> inputs,
                   absl::Span<void* const> outputs, int64_t count);

}  // namespace internal
}  // namespace dist

#endif  // DIST_CPU_REDUCE_H_
