// Linear layer forward and backward.
#include "nn/linear.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"

namespace nn {

using tensor::Dtype;
using tensor::MatmulOptions;

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : Module("Linear"),
      in_(in_features),
      out_(out_features),
      align_output_rows_(options.align_output_rows) {
  OP_CHECK(in_features > 0 && out_features > 0, "linear",
           "in_features and out_features must be > 0; got (", in_features, ",", out_features, ")");
  weight_ = RegisterParameter("weight", {out_, in_}, options.weight_init, /*weight_decay=*/true);
  bias_ = options.bias ? RegisterParameter("bias", {out_}, options.bias_init, false) : nullptr;
}

Tensor Linear::FlatInput(const Tensor& x_in, tensor::Shape* out_shape) const {
  const Tensor& w = weight_->value;
  OP_CHECK(w.defined(), "linear", "weight is not materialized");
  OP_CHECK(x_in.rank() >= 1 && x_in.dim(-1) == in_, "linear", "input ", x_in.shape().ToString(),
           " does not end in in_features ", in_);
  OP_CHECK(tensor::IsFloatingPoint(x_in.dtype()), "linear", "input ", x_in.shape().ToString(),
           " has dtype ", tensor::DtypeName(x_in.dtype()), "; expected f32, bf16 or f16");
  *out_shape = x_in.shape();
  (*out_shape)[out_shape->rank() - 1] = out_;
  return x_in.To(w.dtype()).Reshape({-1, in_});  // (N, in)
}

Tensor Linear::Product(const Tensor& x, Saved* saved) const {
  const Tensor& w = weight_->value;
  MatmulOptions opts;
  opts.trans_b = true;
  constexpr int64_t kAlign = 64;  // elements
  if (bias_ != nullptr) {
    return tensor::LinearForward(x, w, bias_->value.To(w.dtype()));  // the bias fused on a GPU
  }
  if (align_output_rows_ && w.device().is_cuda() && out_ % kAlign != 0) {
    const int64_t ld = (out_ + kAlign - 1) / kAlign * kAlign;
    if (x.dim(0) < kPaddedProductMinRows) {
      Tensor y =
          Tensor::Empty({x.dim(0), ld}, w.dtype(), w.device()).Narrow(1, 0, out_);  // rows ld apart
      tensor::MatmulInto(x, w, y, opts);
      return y;
    }
    // y_p (N, ld) = x @ w_p^T, w_p (ld, in) = [W; zeros]: y_p's pad columns are zeros.
    Tensor w_p = Tensor::Empty({ld, in_}, w.dtype(), w.device());
    w_p.Narrow(0, 0, out_).CopyFrom(w);
    tensor::Zero(w_p.Narrow(0, out_, ld - out_));  // the pad rows only (contiguous)
    const Tensor y_p = tensor::Matmul(x, w_p, opts);
    saved->padded_w = w_p;
    saved->padded_y = y_p.storage();
    return y_p.Narrow(1, 0, out_);  // (N, out), rows ld apart
  }
  return tensor::Matmul(x, w, opts);
}

Tensor Linear::PaddedGrad(const Tensor& g, const Saved& s) {
  const int64_t n = g.dim(0), out = g.dim(1), ld = s.padded_w.dim(0);
  const std::shared_ptr<tensor::Storage> y = s.padded_y.lock();
  if (y != nullptr && g.storage() == y && g.offset() == 0 && g.dtype() == s.padded_w.dtype() &&
      g.RowStride() == ld) {
    return Tensor(y, {n, ld}, {ld, 1}, 0, g.dtype());  // the product's buffer: zero pad columns
  }
  Tensor g_p = Tensor::Zeros({n, ld}, s.padded_w.dtype(), g.device());
  g_p.Narrow(1, 0, out).CopyFrom(g);
  return g_p;
}

Tensors Linear::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK(inputs.size() == 1, "linear", "takes one input, got ", inputs.size());
  const Tensor& x_in = inputs[0];
  tensor::Shape out_shape;
  const Tensor x = FlatInput(x_in, &out_shape);  // (N, in)
  Saved saved{SavedInput(x), x_in.dtype(), x_in.shape()};
  const Tensor y = Product(x, &saved);  // (N, out)
  ctx.Save(std::move(saved));
  return {y.Reshape(out_shape)};
}

Tensor Linear::RunResidual(const Tensor& x_in, const Tensor& residual, Context& ctx) {
  return RunFrame([&] {
           const Tensor& w = weight_->value;  // after the hooks (FSDP gathers it)
           tensor::Shape out_shape;
           const Tensor x = FlatInput(x_in, &out_shape);  // (N, in)
           OP_CHECK(residual.defined() && residual.shape() == out_shape, "linear", "the residual ",
                    residual.defined() ? residual.shape().ToString() : "undefined",
                    " is not shaped as the output ", out_shape.ToString());
           const Tensor r = residual.Reshape({-1, out_});  // (N, out)
           Tensor y;                                       // (N, out), the residual's dtype
           Saved saved{SavedInput(x), x_in.dtype(), x_in.shape()};
           if (r.dtype() == w.dtype() && !align_output_rows_) {
             y = tensor::LinearResidualForward(
                 x, w, bias_ != nullptr ? bias_->value.To(w.dtype()) : Tensor(), r);
           } else {
             y = tensor::Add(r, Product(x, &saved).To(r.dtype()));
           }
           ctx.Save(std::move(saved));
           return Tensors{y.Reshape(out_shape)};
         })
      .at(0);
}

Tensors Linear::RunGelu(const Tensor& x_in, Context& ctx) {
  return RunFrame([&] {
    const Tensor& w = weight_->value;
    tensor::Shape out_shape;
    const Tensor x = FlatInput(x_in, &out_shape);  // (N, in)
    tensor::LinearGeluResult r;                    // (N, out) each
    if (bias_ != nullptr) {
      r = tensor::LinearGeluForward(x, w, bias_->value.To(w.dtype()));
    } else {
      MatmulOptions opts;
      opts.trans_b = true;
      r.pre = tensor::Matmul(x, w, opts);
      r.out = tensor::Gelu(r.pre);
    }
    ctx.Save(Saved{SavedInput(x), x_in.dtype(), x_in.shape()});
    return Tensors{r.out.Reshape(out_shape), r.pre.Reshape(out_shape)};
  });
}

Tensor Linear::SavedInput(const Tensor& x) const {
  // Only dW reads x: a frozen weight's layer keeps none (as PyTorch's matmul
  // saves an input only for the other operand's gradient).
  return weight_->requires_grad ? x : Tensor();
}

Tensor Linear::AccumulateParamGrads(const Tensor& grad_y, const Saved& s,
                                    const Tensor& bias_grad) {
  // Checked before any GradToWrite: a refused gradient leaves the parameters'
  // gradients as they were.
  tensor::Shape out_shape = s.input_shape;
  out_shape[out_shape.rank() - 1] = out_;
  OP_CHECK(grad_y.defined() && grad_y.shape() == out_shape, "linear", "the output gradient ",
           grad_y.defined() ? grad_y.shape().ToString() : "undefined",
           " is not shaped as the output ", out_shape.ToString(), " (input ",
           s.input_shape.ToString(), ")");
  const Tensor& w = weight_->value;
  Tensor g = grad_y.To(w.dtype()).Reshape({-1, out_});  // (N, out)
  if (s.padded_w.defined()) {  // the padded product (no bias): g (N, ld) with zero pad columns
    const Tensor g_p = PaddedGrad(g, s);
    if (weight_->requires_grad) {
      // dW (out, in) += g^T @ x, g being g_p's first out columns (rows ld
      // apart: aligned for the GEMM), accumulated by the GEMM itself in fp32
      // (no (ld, in) product to add: 2 x 154 MB less traffic for GPT-2's head),
      // or written when the gradient is new.
      MatmulOptions opts;
      opts.trans_a = true;
      const Parameter::GradSink dw = weight_->GradToWrite();
      tensor::MatmulInto(g_p.Narrow(1, 0, out_), s.x, dw.grad, opts,
                         /*beta=*/dw.accumulate ? 1.0f : 0.0f);
    }
    return g_p;
  }
  const bool wants_bias_grad = bias_ != nullptr && bias_->requires_grad;
  // dW (out, in) += g^T @ x and db (out) += g's column sums, in fp32 (= for a
  // new gradient: no zeros written and read); frozen parameters get none.
  const bool summed = wants_bias_grad && bias_grad.defined();
  OP_CHECK(!summed || (bias_grad.rank() == 1 && bias_grad.dim(0) == out_), "linear",
           "the bias gradient ", bias_grad.shape().ToString(), " given is not (", out_, ")");
  const Parameter::GradSink db = wants_bias_grad ? bias_->GradToWrite() : Parameter::GradSink{};
  if (summed) {
    Tensor out = db.grad;  // a handle: writes the gradient's storage
    if (db.accumulate) {
      tensor::AddInPlace(out, bias_grad.To(out.dtype()));
    } else {
      out.CopyFrom(bias_grad);
    }
  }
  if (weight_->requires_grad) {
    const Parameter::GradSink dw = weight_->GradToWrite();
    tensor::LinearParamGradsInto(g, s.x, dw.grad, summed ? Tensor() : db.grad, dw.accumulate,
                                 db.accumulate);
  } else if (wants_bias_grad && !summed) {
    tensor::AddBiasBackwardInto(g, db.grad, db.accumulate);
  }
  return g;
}

Tensor Linear::InputGrad(const Tensor& g, const Saved& s) const {
  // dx (N, in) = g @ W (g_p @ w_p: the pad columns and rows add nothing).
  Tensor dx = tensor::Matmul(g, s.padded_w.defined() ? s.padded_w : weight_->value);
  return dx.To(s.input_dtype).Reshape(s.input_shape);
}

Tensors Linear::Backward(const Tensors& grad_outputs, Context& ctx) {
  const Saved& s = ctx.Saved<Saved>();
  // (N, out), or (N, ld) for the padded product
  const Tensor g = AccumulateParamGrads(grad_outputs.at(0), s);
  return {InputGrad(g, s)};
}

Tensor Linear::RunBackwardWithBiasGrad(const Tensor& grad_y, Context& ctx,
                                       const Tensor& bias_grad) {
  if (!bias_grad.defined()) return RunBackward(grad_y, ctx);
  return RunBackwardFrame(ctx,
                          [&] {
                            const Saved& s = ctx.Saved<Saved>();
                            OP_CHECK(bias_ != nullptr, "linear",
                                     "a bias gradient was given to a layer without a bias");
                            const Tensor g = AccumulateParamGrads(grad_y, s, bias_grad);
                            return Tensors{InputGrad(g, s)};
                          })
      .at(0);
}

Tensor Linear::RunBackwardThroughGelu(const Tensor& grad_y, Context& ctx, const Tensor& pre,
                                      Tensor* pre_bias_grad) {
  return RunBackwardFrame(
             ctx,
             [&] {
               const Saved& s = ctx.Saved<Saved>();
               OP_CHECK(pre.shape() == s.input_shape, "linear", "the GELU's input ",
                        pre.shape().ToString(), " is not shaped as x ", s.input_shape.ToString());
               const Tensor g = AccumulateParamGrads(grad_y, s);  // (N, out)
               // d pre (N, in) = gelu'(pre) * (g @ W).
               const Tensor dpre =
                   tensor::LinearGeluInputGrad(g, weight_->value,
                                               pre.To(weight_->value.dtype()).Reshape({-1, in_}),
                                               pre_bias_grad);
               return Tensors{dpre.To(pre.dtype()).Reshape(pre.shape())};
             })
      .at(0);
}

}  // namespace nn
