// FeedForward: the position-wise MLP of a transformer block, in the three
// forms the models here use, with Hugging Face child names:
//   kGelu      (GPT-2):   c_fc -> gelu (tanh) -> c_proj [-> dropout]
//                         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", ...
//   kRelu      (T5 v1.0): wi -> relu [-> dropout] -> wo, no biases
//   kGatedGelu (T5 v1.1): gelu(x wi_0) * (x wi_1) [-> dropout] -> wo, no biases
// The children are Linear layers, so each computes in its weight's dtype and
// accumulates fp32 gradients (see nn/linear.h); the input's gradient comes
// back in the caller's dtype.
//
// The GELU form fuses the activation into the GEMMs around it: c_fc runs
// through Linear::RunGelu (on a GPU the bias and GELU run in cuBLASLt's
// epilogue, which also keeps x W^T + b for the backward), and, without dropout
// on the hidden activations, the backward takes c_proj straight to the GELU
// input's gradient (Linear::RunBackwardThroughGelu: on a GPU the GELU's
// backward runs in the epilogue of c_proj's input-gradient GEMM). Bias
// gradients are summed into the fp32 buffers from the activations' dtype
// (bf16 under a bf16 policy, as PyTorch computes them).
#ifndef NN_FEED_FORWARD_H_
#define NN_FEED_FORWARD_H_

#include <cstdint>

#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace nn {

enum class FfnActivation { kGelu, kRelu, kGatedGelu };

struct FeedForwardOptions {
  FfnActivation activation = FfnActivation::kGelu;
  bool bias = true;                                   // on every projection
  InitSpec in_init = InitSpec::Normal(0.0f, 0.02f);   // c_fc / wi / wi_0 / wi_1
  InitSpec out_init = InitSpec::Normal(0.0f, 0.02f);  // c_proj / wo
  // Dropout probability (no dropout layer when 0) and where it goes: after the
  // output projection (GPT-2's resid dropout) or on the hidden activations
  // before it (T5's DenseReluDense dropout). Child name "dropout".
  float dropout = 0.0f;
  bool dropout_on_hidden = false;
  uint64_t dropout_seed = 0;

  // GPT-2 / minGPT: GELU, biases, c_proj init scaled by 1/sqrt(2 n_layer).
  static FeedForwardOptions Gpt2(int n_layer, float dropout = 0.0f);
  // T5: ReLU (v1.0) or gated GELU (v1.1), no biases, Mesh-TF init
  // N(0, factor / sqrt(d_model)) for wi, N(0, factor / sqrt(d_ff)) for wo.
  static FeedForwardOptions T5(int64_t d_model, int64_t d_ff, bool gated, float dropout = 0.0f,
                               float factor = 1.0f);
};

class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t hidden_dim, FeedForwardOptions options = {});

  int64_t dim() const { return dim_; }
  int64_t hidden_dim() const { return hidden_; }
  FfnActivation activation() const { return activation_; }
  // c_fc / wi / wi_0 (i = 0) and wi_1 (i = 1, gated only).
  Linear* in_proj(int i = 0) { return in_[i]; }
  Linear* out_proj() { return out_; }      // c_proj / wo
  Dropout* dropout() { return dropout_; }  // nullptr without dropout

 protected:
  // inputs[0]: x (..., dim) -> (..., dim) in the output projection's dtype.
  // With inputs[1], a residual shaped as the output: residual + the above, in
  // the residual's dtype (a pre-norm block's x + mlp(ln(x))); without dropout
  // after the output projection (none, p 0, or eval mode) the sum comes out
  // of that projection's GEMM (Linear::RunResidual).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // grad (..., dim) -> grad_x (..., dim) in x's dtype (and, with a residual,
  // the residual's gradient: grad itself).
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    Tensor h0;   // (N, hidden) pre-activation: GELU (c_fc / wi_0 output, with c_fc's bias)
    Tensor h1;   // (N, hidden) gated: wi_1 output
    Tensor act;  // (N, hidden) ReLU: relu output; gated: gelu(h0)
    tensor::Dtype input_dtype;
    tensor::Shape input_shape;
    bool has_residual = false;            // inputs[1] was given
    bool residual_in_projection = false;  // added in c_proj's GEMM: the output dropout did not run
  };

  // Backward's gradient of x.
  Tensors BackwardOfX(const Tensor& grad, Context& ctx);

  const int64_t dim_;
  const int64_t hidden_;
  const FfnActivation activation_;
  const bool dropout_on_hidden_;
  Linear* in_[2] = {nullptr, nullptr};
  Linear* out_ = nullptr;
  Dropout* dropout_ = nullptr;
};

}  // namespace nn

#endif  // NN_FEED_FORWARD_H_
