// Builds without --config=cuda: the cross-entropy kernels fail with a clear
// message; the row-threads switch still answers.
#include <atomic>

#include "tensor/cuda/loss.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

CrossEntropyStats CrossEntropyForward(const Tensor& logits, const Tensor&, int64_t, const Tensor&,
                                      const Tensor&) {
  NotBuilt("cross_entropy", logits);
}
CrossEntropyStats CrossEntropyBackward(const Tensor& logits, const Tensor&, const Tensor&, int64_t,
                                       float, const Tensor&) {
  NotBuilt("cross_entropy_backward", logits);
}
CrossEntropyStats CrossEntropyForwardBackwardInPlace(const Tensor& logits, const Tensor&, int64_t,
                                                     float, const Tensor&, const Tensor&) {
  NotBuilt("cross_entropy", logits);
}

// The switch alone works without CUDA (there are no kernels to size).
namespace {
std::atomic<int> row_threads{0};
}  // namespace
void SetCrossEntropyRowThreads(int threads) {
  OP_CHECK(threads == 0 || ValidCrossEntropyRowThreads(threads), "cross_entropy",
           "row threads must be 0 (the default) or a multiple of 32 in [32, 1024]; got ", threads);
  row_threads.store(threads);
}
int CrossEntropyRowThreads() { return row_threads.load(); }
int CrossEntropyBlockThreads(int64_t v, int per_load) {
  OP_CHECK(false, "cross_entropy", "CUDA support was not built into this binary (rows of ", v,
           " elements loaded ", per_load, " at a time)");
  return 0;
}

}  // namespace cuda
}  // namespace tensor
