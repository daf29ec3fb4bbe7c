// Builds without --config=cuda: the batch norm kernels fail with a clear message.
#include "tensor/cuda/batch_norm.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void BatchNormForward(const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&, bool, float, float, const Tensor&, const Tensor&,
                      const Tensor&) {
  NotBuilt("batch_norm", x);
}
void BatchNormBackward(const Tensor&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&,
                       bool, const Tensor&, const Tensor&, const Tensor&) {
  NotBuilt("batch_norm_backward", x);
}

}  // namespace cuda
}  // namespace tensor
