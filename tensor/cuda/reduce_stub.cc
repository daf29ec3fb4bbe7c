// Builds without --config=cuda: the reduction kernels fail with a clear message.
#include "tensor/cuda/reduce.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void SumDim(const Tensor& x, int64_t, int64_t, int64_t, double, bool, const Tensor&) {
  NotBuilt("sum", x);
}
void MaxDim(const Tensor& x, int64_t, int64_t, int64_t, const Tensor&, const Tensor&) {
  NotBuilt("max", x);
}
void BroadcastDim(const Tensor& grad_out, int64_t, int64_t, int64_t, double, const Tensor&) {
  NotBuilt("sum_backward", grad_out);
}
void ScatterDim(const Tensor& grad_out, const Tensor&, int64_t, int64_t, int64_t, const Tensor&) {
  NotBuilt("max_backward", grad_out);
}
double SumSquares(const Tensor& x) { NotBuilt("sum_squares", x); }

}  // namespace cuda
}  // namespace tensor
