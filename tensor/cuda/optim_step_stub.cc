// Builds without --config=cuda: the optimizer kernels fail with a clear message.
#include "tensor/cuda/optim_step.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void AdamWStepMany(const std::vector<AdamWSegment>& segments) {
  NotBuilt("adamw", segments.empty() ? Tensor() : segments[0].p);
}
void SgdStepMany(const std::vector<SgdSegment>& segments) {
  NotBuilt("sgd", segments.empty() ? Tensor() : segments[0].p);
}
double GradSumSquares(const std::vector<Tensor>& grads) {
  NotBuilt("grad_norm", grads.empty() ? Tensor() : grads[0]);
}
void ScaleGrads(const std::vector<Tensor>& grads, float) {
  NotBuilt("clip_grad", grads.empty() ? Tensor() : grads[0]);
}
bool ScaleGradsAndCheckNonFinite(const std::vector<Tensor>& grads, float) {
  NotBuilt("unscale_grads", grads.empty() ? Tensor() : grads[0]);
}

}  // namespace cuda
}  // namespace tensor
