// Builds without --config=cuda: the fused attention kernels fail with a clear message.
#include "tensor/cuda/attention.h"
#include "tensor/cuda/stub.h"

namespace tensor {
namespace cuda {

void FlashAttentionForward(const Tensor& q, const Tensor&, const Tensor&, float, bool,
                           const Tensor&, const Tensor&, FlashAttentionKernel, const FlashDropout&,
                           const FlashScoreTerms&) {
  NotBuilt("flash_attention", q);
}
void FlashAttentionBackward(const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, float, bool, const Tensor&, const Tensor&,
                            const Tensor&, FlashAttentionKernel, const FlashDropout&,
                            const FlashScoreTerms&, const Tensor&, int64_t) {
  NotBuilt("flash_attention", q);
}
Tensor FlashKeyMaskBytes(const Tensor& key_mask) { NotBuilt("flash_attention", key_mask); }
// Nothing to switch without the kernels: the backward itself refuses to run.
void SetFlashAttentionAtomicDq(bool) {}
bool FlashAttentionAtomicDq() { return false; }
void SetFlashAttentionNarrowDkDv(bool) {}
bool FlashAttentionNarrowDkDv() { return false; }
void SetFlashAttentionCudnn(bool) {}
bool FlashAttentionCudnn() { return false; }
void SetFlashAttentionNarrowDq(bool) {}
bool FlashAttentionNarrowDq() { return false; }
void UnfusedAttentionSoftmax(const Tensor& scores, float, bool, const Tensor&) {
  NotBuilt("unfused_attention_softmax", scores);
}
void UnfusedAttentionSoftmaxBackward(const Tensor& dprobs, const Tensor&, float, const Tensor&) {
  NotBuilt("unfused_attention_softmax_backward", dprobs);
}

}  // namespace cuda
}  // namespace tensor
