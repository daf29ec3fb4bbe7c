// A training step's language-model loss with its loss scale (lm_loss.h).
#include "models/common/lm_loss.h"

#include <cmath>
#include <limits>

#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace train {

tensor::CrossEntropyResult ScaledCrossEntropyInPlace(const tensor::Tensor& logits,
                                                     const tensor::Tensor& targets,
                                                     double loss_scale) {
  OP_CHECK(std::isfinite(loss_scale) && loss_scale > 0, "lm_loss",
           "loss_scale must be finite and > 0; got ", loss_scale);
  if (loss_scale <= std::numeric_limits<float>::max()) {
    return tensor::CrossEntropyForwardBackwardInPlace(logits, targets,
                                                      static_cast<float>(loss_scale));
  }
  // Beyond fp32: the op takes a finite fp32 scale, so scale afterwards; every
  // nonzero gradient overflows, as the loss scaler expects of such a scale.
  tensor::CrossEntropyResult ce = tensor::CrossEntropyForwardBackwardInPlace(logits, targets);
  tensor::ScaleInPlace(logits, loss_scale);
  return ce;
}

}  // namespace train
