// The language-model loss of a training step with its loss scale: the fused
// cross-entropy (tensor::CrossEntropyForwardBackwardInPlace) overwrites the
// logits with d(loss * loss_scale)/d logits.
//
// The scale goes into the gradient as each entry is formed, in fp32, before it
// is rounded to the logits' dtype. Scaling afterwards (a second pass over the
// logits) would first round (softmax - onehot) / count to fp16, where entries
// below 6e-5 lose bits and those below 3e-8 flush to zero: the small gradients
// loss scaling exists to keep. A power-of-two scale changes no fp32 or bf16
// gradient by a bit (it only moves exponents).
#ifndef MODELS_COMMON_LM_LOSS_H_
#define MODELS_COMMON_LM_LOSS_H_

#include "tensor/ops/loss.h"
#include "tensor/tensor.h"

namespace train {

// logits (B, T, V) (or any (..., V) the op takes), overwritten with the scaled
// gradient; targets (B, T). loss_scale > 0. The result's loss is unscaled and
// stays on the logits' device. A scale beyond fp32's range makes the
// gradients inf/nan, as it would in any fp32 pass: the step is then skipped by
// the loss scaler (train::LossScaling), not refused.
tensor::CrossEntropyResult ScaledCrossEntropyInPlace(const tensor::Tensor& logits,
                                                     const tensor::Tensor& targets,
                                                     double loss_scale);

}  // namespace train

#endif  // MODELS_COMMON_LM_LOSS_H_
