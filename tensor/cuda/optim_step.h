// CUDA kernels of the optimizers (optim/adamw.cc, optim/sgd.cc) and of
// global-norm clipping (optim/clip_grad.cc): fused per-element updates over an
// element range [begin, end) of f32 tensors on one device, in the float
// operations and order of the CPU kernels (see common.cuh for conventions).
#ifndef TENSOR_CUDA_OPTIM_STEP_H_
#define TENSOR_CUDA_OPTIM_STEP_H_

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace tensor {
namespace cuda {

struct AdamWScalars {
  float decay;  // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float neg_step_size;          // -lr / (1 - beta1^t)
  float eps;
};

// An AdamW step over elements [begin, end) of p, g, m, v (f32, contiguous,
// same numel, one CUDA device): (decay: p *= s.decay), m = beta1 m +
// (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
// p += neg_step_size * m / (sqrt(v) / bc2 + eps).
struct AdamWSegment {
  Tensor p, g, m, v;
  int64_t begin = 0;
  int64_t end = 0;
  AdamWScalars s{};
  bool decay = false;
  // Optional: a bf16 or f16 copy of p (contiguous, p's numel and device)
  // whose elements [begin, end) get the updated p, rounded to nearest even
  // as a cast would, in the same pass (a 2-byte write per element where a
  // cast afterwards would read p's 4 bytes again).
  Tensor low;
};
// Every segment's step (all on one device; segments of different
// tensors, or disjoint ranges of one) in one launch per 32 segments of one
// kind of copy (none, bf16, f16): the same results, without a launch per
// parameter.
void AdamWStepMany(const std::vector<AdamWSegment>& segments);

struct SgdScalars {
  float lr;
  float weight_decay;
  float momentum;
  float one_minus_dampening;
};
struct SgdFlags {
  bool decay = false;     // d = g + weight_decay p
  bool momentum = false;  // buf = first ? d : momentum buf + (1 - dampening) d
  bool first = false;
  bool nesterov = false;  // d = d + momentum buf, else d = buf
};
// An SGD step over elements [begin, end) of p, g (and buf when
// flags.momentum): f32, contiguous, one device; p -= lr d. low as
// AdamWSegment's.
struct SgdSegment {
  Tensor p, g, buf;
  int64_t begin = 0;
  int64_t end = 0;
  SgdScalars s{};
  SgdFlags flags{};
  Tensor low;
};
// Every segment's step (one device) in one launch per 32 segments of one
// kind of copy, 4 elements a thread where aligned: the same results.
void SgdStepMany(const std::vector<SgdSegment>& segments);

// The clipping and loss-scaling kernels take lists of f32 contiguous tensors
// on one CUDA device and launch once per 64 tensors (a launch's blocks find
// their tensor in a table passed as the launch's parameters).

// Sum of squares of all their elements: per-block (8192 elements) float sums
// of squares, read back in one copy (one host wait however many tensors),
// added in double on the host in block order within a tensor, then tensor by
// tensor (deterministic).
double GradSumSquares(const std::vector<Tensor>& grads);
// Every g *= factor.
void ScaleGrads(const std::vector<Tensor>& grads, float factor);
// Every g *= factor (the loss scaler's unscale): true when any result is inf
// or NaN. One host wait (the flag's read back).
bool ScaleGradsAndCheckNonFinite(const std::vector<Tensor>& grads, float factor);

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_OPTIM_STEP_H_
