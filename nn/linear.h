// Linear: y = x @ W^T + b, with W (out, in) as in torch.nn.Linear.
//
// The layer computes in the dtype of its weight's value (f32, or bf16 under a
// mixed-precision policy); inputs of another dtype are cast to it. Parameter
// gradients are always accumulated in fp32 (GEMMs with an fp32 output).
#ifndef NN_LINEAR_H_
#define NN_LINEAR_H_

#include <cstdint>

#include "nn/module.h"

namespace nn {

struct LinearOptions {
  bool bias = true;
  InitSpec weight_init = InitSpec::Normal(0.0f, 0.02f);  // minGPT's init
  InitSpec bias_init = InitSpec::Zeros();
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Parameter* weight() { return weight_; }
  Parameter* bias() { return bias_; }  // nullptr without bias

 protected:
  // inputs[0]: x (..., in) -> (..., out)
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (..., out) -> grad_x (..., in) in x's dtype; accumulates W.grad, b.grad.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor x;                   // (N, in), compute dtype
    tensor::Dtype input_dtype;  // dtype of the caller's x, for grad_x
    tensor::Shape input_shape;
  };
  const int64_t in_;
  const int64_t out_;
  Parameter* weight_;  // (out, in)
  Parameter* bias_;    // (out) or nullptr
};

}  // namespace nn

#endif  // NN_LINEAR_H_
