// LayerNorm layer over the last dimension, as torch.nn.LayerNorm with a single
// normalized dimension (GPT-2's ln_1, ln_2, ln_f).
//
// Dtypes. The norm op computes in f32 whatever the storage dtypes, and it
// accepts an f32 weight with a bf16/f16 x. So:
//   - weight f32 (fp32 parameters, or a policy that keeps norms fp32) or no
//     weight: x stays in its own dtype and y has x's dtype (no cast copy);
//   - weight bf16/f16 (a mixed-precision policy's compute copy): x is cast to
//     the weight's dtype, as Linear does, and y has that dtype.
// Gradients: the input's in the caller's dtype; weight and bias gradients are
// computed in f32 (the op is given an f32 copy of the weight) and accumulated
// into the fp32 gradient buffers, never rounded to bf16.
#ifndef NN_LAYER_NORM_H_
#define NN_LAYER_NORM_H_

#include <cstdint>

#include "nn/module.h"

namespace nn {

struct LayerNormOptions {
  float eps = 1e-5f;
  // Learnable weight (init ones) and bias (init zeros), as PyTorch's default.
  bool elementwise_affine = true;
  // The bias, when elementwise_affine (PyTorch's bias=False drops only it).
  bool bias = true;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, LayerNormOptions options = {});

  int64_t dim() const { return dim_; }
  float eps() const { return eps_; }
  Parameter* weight() { return weight_; }  // nullptr without elementwise_affine
  Parameter* bias() { return bias_; }      // nullptr without bias

  // RunBackward plus `add` (x's shape, the caller's x dtype): add + grad_x,
  // in add's dtype. A pre-norm block's residual gradient (the block output's
  // plus this norm's input's) written by the norm's backward kernel in one
  // pass when add has the compute dtype (tensor::LayerNormBackward's
  // grad_x_add); otherwise RunBackward then Add.
  Tensor RunBackwardAdding(const Tensor& grad_y, const Tensor& add, Context& ctx);

 protected:
  // inputs[0]: x (..., dim) -> (..., dim); see the dtype rule above.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (..., dim) -> grad_x (..., dim) in x's dtype; accumulates weight/bias grads.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor x;     // (..., dim) compute dtype, contiguous
    Tensor mean;  // (...) f32
    Tensor rstd;  // (...) f32
    tensor::Dtype input_dtype;
  };
  // Backward's gradient of x with `add` added (undefined: none) in the
  // kernel: the compute dtype.
  Tensor GradX(const Tensor& grad_y, const Tensor& add, const Saved& s);
  const int64_t dim_;
  const float eps_;
  Parameter* weight_;  // (dim) or nullptr
  Parameter* bias_;    // (dim) or nullptr
};

}  // namespace nn

#endif  // NN_LAYER_NORM_H_
