// Builds without --config=cuda: the dropout kernel fails with a clear message.
#include "tensor/cuda/dropout.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void DropoutApply(const char* op, const Tensor& in, const Tensor&, float, uint64_t, uint64_t) {
  NotBuilt(op, in);
}

void DropoutAddApply(const char* op, const Tensor& res, const Tensor&, const Tensor&, float,
                     uint64_t, uint64_t) {
  NotBuilt(op, res);
}

}  // namespace cuda
}  // namespace tensor
