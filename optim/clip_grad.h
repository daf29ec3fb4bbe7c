// Gradient clipping by global norm (as torch.nn.utils.clip_grad_norm_ with
// the 2-norm), working on shards: the squared norms of a rank's shards are
// summed across ranks through a hook the dist package provides.
#ifndef OPTIM_CLIP_GRAD_H_
#define OPTIM_CLIP_GRAD_H_

#include <functional>
#include <vector>

#include "absl/types/span.h"
#include "optim/param_ref.h"
#include "tensor/tensor.h"

namespace optim {

// Sum of squares of every element of every tensor (f32, contiguous, CPU),
// accumulated in double in an order that depends only on the tensors' sizes
// (not on the thread count), so the result is reproducible.
double GradNormSquared(absl::Span<const tensor::Tensor> grads);

// grads[i] *= factor in place (f32, contiguous, CPU).
void ScaleGrads(absl::Span<tensor::Tensor> grads, float factor);

// Clips the gradients of `params` to a global 2-norm of at most max_norm
// (> 0) and returns the norm before clipping. total = sqrt(S), where S is this
// process's GradNormSquared, passed through all_reduce_sum when given (which
// must return the sum of its argument over all ranks). When
// max_norm / (total + 1e-6) < 1 every gradient is multiplied by it. A
// non-finite total changes nothing (and is returned, for the caller to skip
// the step).
double ClipGradNorm(const std::vector<ParamRef>& params, double max_norm,
                    const std::function<double(double)>& all_reduce_sum = nullptr);

}  // namespace optim

#endif  // OPTIM_CLIP_GRAD_H_
