// Builds without cuDNN (the CUDA emulation, --config=cuda_emu): cuDNN's attention
// is never taken; the flash attention entry points run our kernels.
#include "tensor/cuda/attention_cudnn.h"

namespace tensor {
namespace cuda {
namespace {
constexpr char kNotBuilt[] = "cuDNN is not linked in this build (the CUDA emulation has none)";
}  // namespace

bool CudnnAttentionBuilt() { return false; }

int64_t CudnnRuntimeVersion() { return 0; }

bool CudnnAttentionEligible(const Tensor&, const Tensor&, const Tensor&, bool, std::string* why) {
  *why = kNotBuilt;
  return false;
}

bool CudnnAttentionForward(const Tensor&, const Tensor&, const Tensor&, float, bool,
                           const Tensor&, const Tensor&, std::string* why) {
  *why = kNotBuilt;
  return false;
}

bool CudnnAttentionBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, float, bool, const Tensor&,
                            const Tensor&, const Tensor&, std::string* why) {
  *why = kNotBuilt;
  return false;
}

std::string CudnnAttentionCheckDescriptors(const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&) {
  return kNotBuilt;
}

}  // namespace cuda
}  // namespace tensor
