// Linear: y = x @ W^T + b, with W (out, in) as in torch.nn.Linear.
//
// The layer computes in the dtype of its weight's value (f32, or bf16 under a
// mixed-precision policy); inputs of another dtype are cast to it. Parameter
// gradients are always accumulated in fp32 (GEMMs with an fp32 output).
#ifndef NN_LINEAR_H_
#define NN_LINEAR_H_

#include <cstdint>
#include <memory>

#include "nn/module.h"

namespace nn {

struct LinearOptions {
  bool bias = true;
  InitSpec weight_init = InitSpec::Normal(0.0f, 0.02f);  // minGPT's init
  InitSpec bias_init = InitSpec::Zeros();
  // On a CUDA device, without a bias: when out_features is not a multiple of
  // 64, the output's rows are laid out 64-element aligned (a (N, out) view of
  // an (N, ld) buffer, ld = ceil64(out); Tensor::RowStride() gives the
  // stride); its consumers must take strided rows (the cross-entropy does).
  // For a language-model head over an odd vocabulary (GPT-2's 50257; llm.c
  // pads it to 50304). With at least kPaddedProductMinRows rows the three
  // GEMMs also run at the padded size, as llm.c's do: the forward with the
  // weight copied into (ld, in) rows whose last ld - out are zeros (so the
  // output's pad columns are zeros), the backward with the gradient's pad
  // columns zero (in place when the gradient is the output's buffer, as the
  // cross-entropy leaves it; else a padded copy: any finite values would do,
  // since they meet W's zero rows, but a NaN or inf would spread) and dW
  // computed (ld, in) and its first out rows added. On an H200 cuBLASLt's bf16 GEMM of gpt2's head
  // (16384 x 768 x N) ran at 95 TFLOP/s with N = 50257 (strided output rows
  // or not) and 610 with N = 50304 (//tensor/cuda:matmul_benchmark).
  bool align_output_rows = false;
};

class Linear : public Module {
 public:
  // align_output_rows pads the GEMMs from this many rows (tokens) on; fewer
  // (decoding a token at a time) are bound by reading W, which the padded
  // copy would triple.
  static constexpr int64_t kPaddedProductMinRows = 256;

  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Parameter* weight() { return weight_; }
  Parameter* bias() { return bias_; }  // nullptr without bias

  // Run for a layer followed by a GELU: {gelu(y), y} for y = x W^T (+ b), both
  // (..., out), with the bias and GELU in the GEMM's epilogue on a GPU
  // (tensor::LinearGeluForward). Saves x as Run does, so RunBackward takes the
  // gradient of y (the GELU input).
  Tensors RunGelu(const Tensor& x, Context& ctx);

  // Run for a layer whose output joins a residual stream: residual + x W^T
  // (+ b), (..., out) in the residual's dtype (residual shaped as the output).
  // With the residual in the compute dtype the sum comes out of the GEMM
  // (tensor::LinearResidualForward: on a GPU the residual is cuBLASLt's C), so
  // x W^T + b is never written on its own; otherwise Run then Add. Saves x as
  // Run does: RunBackward gives x's gradient (the residual's is the output's).
  Tensor RunResidual(const Tensor& x, const Tensor& residual, Context& ctx);

  // RunBackward for a layer whose input x was gelu(pre): returns the gradient
  // of pre instead of x's, gelu'(pre) * (grad @ W) (..., in) in pre's dtype,
  // with the GELU's backward in the GEMM's epilogue on a GPU
  // (tensor::LinearGeluInputGrad). pre has x's shape. Accumulates W.grad and
  // b.grad as RunBackward does. With pre_bias_grad, that GEMM may also sum
  // the result over its rows (a GPU, cuda::MatmulDGeluBiasGrad on): then
  // *pre_bias_grad is the f32 (in) bias gradient of the layer that made pre,
  // for its RunBackwardWithBiasGrad; else it is left undefined.
  Tensor RunBackwardThroughGelu(const Tensor& grad_y, Context& ctx, const Tensor& pre,
                                Tensor* pre_bias_grad = nullptr);

  // RunBackward given this layer's bias gradient already summed (f32 (out),
  // from the next layer's RunBackwardThroughGelu): b.grad takes it and the
  // weight gradient's GEMM sums nothing. An undefined bias_grad: RunBackward.
  Tensor RunBackwardWithBiasGrad(const Tensor& grad_y, Context& ctx, const Tensor& bias_grad);

 protected:
  // inputs[0]: x (..., in) -> (..., out)
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (..., out) -> grad_x (..., in) in x's dtype; accumulates W.grad, b.grad.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor x;                   // (N, in), compute dtype; undefined for a frozen weight
    tensor::Dtype input_dtype;  // dtype of the caller's x, for grad_x
    tensor::Shape input_shape;
    // The padded product's (align_output_rows): W in (ld, in) rows, the last
    // ld - out zeros; undefined otherwise.
    Tensor padded_w;
    // The storage of its (N, ld) output, whose pad columns are zeros: the
    // backward takes a gradient over it in place (not kept alive from here).
    std::weak_ptr<tensor::Storage> padded_y;
  };

  // x (..., in) checked against the layer and flattened to (N, in) in the
  // compute dtype; out_shape gets (..., out).
  Tensor FlatInput(const Tensor& x_in, tensor::Shape* out_shape) const;

  // x (N, in) in the compute dtype -> x W^T (+ b) (N, out); fills
  // saved->padded_w / padded_y when it computes at the padded size.
  Tensor Product(const Tensor& x, Saved* saved) const;

  // The gradient (N, out) of a padded product as the (N, ld) buffer with
  // zero pad columns: g's own storage when g is the product's output, else a
  // padded copy.
  static Tensor PaddedGrad(const Tensor& g, const Saved& s);

  // The weight and bias gradients of the saved x; returns grad (N, out) in
  // the compute dtype. A defined bias_grad (f32 (out)) is the bias gradient,
  // summed already.
  Tensor AccumulateParamGrads(const Tensor& grad_y, const Saved& s,
                              const Tensor& bias_grad = Tensor());
  // dx (..., in) in x's dtype from g (N, out) (or the padded product's (N, ld)).
  Tensor InputGrad(const Tensor& g, const Saved& s) const;
  // What Saved::x holds: x, or nothing when the weight is frozen.
  Tensor SavedInput(const Tensor& x) const;

  const int64_t in_;
  const int64_t out_;
  const bool align_output_rows_;
  Parameter* weight_;  // (out, in)
  Parameter* bias_;    // (out) or nullptr
};

}  // namespace nn

#endif  // NN_LINEAR_H_
