// Builds without --config=cuda: the norm kernels fail with a clear message;
// the hold-rows switch still answers.
#include <atomic>

#include "tensor/cuda/norm.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void LayerNormForward(const Tensor& x, const Tensor&, const Tensor&, float, const Tensor&,
                      const Tensor&, const Tensor&) {
  NotBuilt("layer_norm", x);
}
void LayerNormBackward(const Tensor&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, bool) {
  NotBuilt("layer_norm_backward", x);
}
void RmsNormForward(const Tensor& x, const Tensor&, float, const Tensor&, const Tensor&) {
  NotBuilt("rms_norm", x);
}
void RmsNormBackward(const Tensor&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&,
                     const Tensor&, const Tensor&, bool) {
  NotBuilt("rms_norm_backward", x);
}

// The switch alone works without CUDA (there are no kernels to switch).
namespace {
std::atomic<bool> hold_rows{true};
}  // namespace
void SetNormHoldRows(bool hold) { hold_rows.store(hold); }
bool NormHoldRows() { return hold_rows.load(); }

}  // namespace cuda
}  // namespace tensor
