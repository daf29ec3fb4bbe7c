// Dynamic loss scaling for fp16 training (as torch.cuda.amp.GradScaler):
// the loss is multiplied by scale() before backward; gradients are unscaled and
// checked; a step with inf/nan on any rank is skipped on every rank and the
// scale backs off; after growth_interval good steps in a row it grows.
#ifndef PRECISION_LOSS_SCALER_H_
#define PRECISION_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace precision {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class DynamicLossScaler {
 public:
  // Options must have a finite init_scale > 0, a finite growth_factor > 1,
  // 0 < backoff_factor < 1, growth_interval >= 1. The scale grows no further
  // than fp32's largest value (it multiplies the loss in fp32).
  static absl::StatusOr<DynamicLossScaler> Create(LossScalerOptions options = {});

  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }

  // Records the outcome of one step. `found_non_finite` must already be agreed
  // across ranks (OR of every rank's flag). Returns true when the optimizer
  // step should be applied, false when it must be skipped.
  bool Update(bool found_non_finite);

  // Checkpointed state: scale and the current run of good steps.
  struct State {
    double scale;
    int64_t good_steps;
    int64_t skipped_steps;
  };
  State GetState() const { return {scale_, good_steps_, skipped_steps_}; }
  // InvalidArgument (and nothing changed) for a scale that is not finite and
  // positive, or a negative count.
  absl::Status SetState(const State& state);

 private:
  explicit DynamicLossScaler(LossScalerOptions options)
      : options_(options), scale_(options.init_scale) {}
  LossScalerOptions options_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_steps_ = 0;
};

// True when any element of a floating tensor (CPU) is inf or NaN.
bool HasNonFinite(const tensor::Tensor& t);
// grad *= factor in place (floating, contiguous); returns true when any
// element of the result is inf or NaN. f32 CUDA gradients are scaled and
// checked on their device with one host wait per call and device (the flag's
// read back), whatever their number: pass them all at once. Other CUDA
// gradients go through a host copy.
bool ScaleAndCheckNonFinite(absl::Span<tensor::Tensor> grads, float factor);
bool ScaleAndCheckNonFinite(tensor::Tensor& grad, float factor);

}  // namespace precision

#endif  // PRECISION_LOSS_SCALER_H_
