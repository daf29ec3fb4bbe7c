// Builds without --config=cuda: the optimizer kernels fail with a clear message.
#include "tensor/cuda/optim_step.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void AdamWStep(const Tensor& p, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t,
               const AdamWScalars&, bool) {
  NotBuilt("adamw", p);
}
void SgdStep(const Tensor& p, const Tensor&, const Tensor&, int64_t, int64_t, const SgdScalars&,
             const SgdFlags&) {
  NotBuilt("sgd", p);
}
double GradSumSquares(const std::vector<Tensor>& grads) {
  NotBuilt("grad_norm", grads.empty() ? Tensor() : grads[0]);
}
void ScaleGrad(const Tensor& g, float) { NotBuilt("clip_grad", g); }
bool ScaleGradsAndCheckNonFinite(const std::vector<Tensor>& grads, float) {
  NotBuilt("unscale_grads", grads.empty() ? Tensor() : grads[0]);
}

}  // namespace cuda
}  // namespace tensor
