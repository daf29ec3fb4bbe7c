// RMSNorm layer over the last dimension, T5 style (T5LayerNorm): no mean
// subtraction, no bias, y = x / sqrt(mean(x^2) + eps) * weight.
//
// Dtypes as LayerNorm (nn/layer_norm.h): with an f32 weight x keeps its dtype
// (the op takes an f32 weight with bf16/f16 x) and y has x's dtype; with a
// bf16/f16 weight x is cast to it, as Linear does. The input's gradient comes
// back in the caller's dtype; the weight gradient is computed in f32 and
// accumulated into the fp32 gradient buffer.
#ifndef NN_RMS_NORM_H_
#define NN_RMS_NORM_H_

#include <cstdint>

#include "nn/module.h"

namespace nn {

class RMSNorm : public Module {
 public:
  // weight init ones, no weight decay.
  explicit RMSNorm(int64_t dim, float eps = 1e-6f);

  int64_t dim() const { return dim_; }
  float eps() const { return eps_; }
  Parameter* weight() { return weight_; }

  // RunBackward plus `add`, as LayerNorm::RunBackwardAdding.
  Tensor RunBackwardAdding(const Tensor& grad_y, const Tensor& add, Context& ctx);

 protected:
  // inputs[0]: x (..., dim) -> (..., dim).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (..., dim) -> grad_x (..., dim) in x's dtype; accumulates weight.grad.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor x;     // (..., dim) compute dtype, contiguous
    Tensor rstd;  // (...) f32
    tensor::Dtype input_dtype;
  };
  // Backward's gradient of x with `add` added (undefined: none) in the
  // kernel: the compute dtype.
  Tensor GradX(const Tensor& grad_y, const Tensor& add, const Saved& s);
  const int64_t dim_;
  const float eps_;
  Parameter* weight_;  // (dim)
};

}  // namespace nn

#endif  // NN_RMS_NORM_H_
