// Builds without --config=cuda: the cross-entropy kernels fail with a clear message.
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

}  // namespace cuda
}  // namespace tensor
