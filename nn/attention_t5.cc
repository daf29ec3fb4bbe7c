// T5Attention forward and backward.
#include "nn/attention_t5.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/ops/check.h"
#include "tensor/ops/elementwise.h"

namespace nn {
namespace {

constexpr char kOp[] = "t5_attention";

// Context children, in forward order.
enum ChildIndex : size_t { kQ = 0, kK = 1, kV = 2, kBias = 3, kO = 4 };

LinearOptions NoBias(float std) {
  LinearOptions o;
  o.bias = false;
  o.weight_init = InitSpec::Normal(0.0f, std);
  return o;
}

// "(2,3,4)" or "undefined", for error messages.
std::string ShapeText(const Tensor& t) { return t.defined() ? t.shape().ToString() : "undefined"; }

}  // namespace

T5Attention::T5Attention(int64_t d_model, int64_t n_heads, int64_t d_kv, T5AttentionOptions options)
    : Module("T5Attention"),
      d_model_(d_model),
      n_heads_(n_heads),
      d_kv_(d_kv),
      options_(options),
      gen_(options.seed) {
  OP_CHECK(d_model > 0 && n_heads > 0 && d_kv > 0, kOp,
           "d_model, n_heads and d_kv must be positive; got ", d_model, ", ", n_heads, ", ", d_kv);
  OP_CHECK(!(options.cross_attention && (options.causal || options.has_relative_bias)), kOp,
           "cross-attention takes neither a causal mask nor its own relative bias");
  OP_CHECK(options.dropout >= 0.0f && options.dropout <= 1.0f, kOp,
           "dropout must be in [0, 1]; got ", options.dropout);
  const int64_t inner = n_heads * d_kv;
  const float f = options.initializer_factor;
  const float kv_std = f / std::sqrt(static_cast<float>(d_model));
  q_ = RegisterModule(
      "q", std::make_unique<Linear>(d_model, inner,
                                    NoBias(f / std::sqrt(static_cast<float>(d_model * d_kv)))));
  k_ = RegisterModule("k", std::make_unique<Linear>(d_model, inner, NoBias(kv_std)));
  v_ = RegisterModule("v", std::make_unique<Linear>(d_model, inner, NoBias(kv_std)));
  o_ = RegisterModule("o", std::make_unique<Linear>(
                               inner, d_model, NoBias(f / std::sqrt(static_cast<float>(inner)))));
  if (options.has_relative_bias) {
    RelativePositionBiasOptions rpb;
    rpb.n_buckets = options.relative_attention_num_buckets;
    rpb.max_distance = options.relative_attention_max_distance;
    rpb.init = InitSpec::Normal(0.0f, kv_std);
    relative_bias_ = RegisterModule(
        "relative_attention_bias",
        std::make_unique<RelativePositionBias>(n_heads, /*bidirectional=*/!options.causal, rpb));
  }
}

T5Attention::Inputs T5Attention::CheckedInputs(const Tensors& inputs) const {
  OP_CHECK(!inputs.empty() && inputs.size() <= 5 && inputs[0].defined(), kOp,
           "expects inputs {x, kv, position_bias, key_mask, residual} (x defined, the others "
           "optional); got ",
           inputs.size(), " inputs");
  auto input = [&](size_t i) { return i < inputs.size() ? inputs[i] : Tensor(); };
  Inputs in{inputs[0], input(1), input(2), input(3), input(4)};
  OP_CHECK(in.x.rank() == 3 && in.x.dim(2) == d_model_, kOp, "input ", in.x.shape().ToString(),
           " is not (B, T, d_model) with d_model ", d_model_);
  OP_CHECK(!in.residual.defined() || in.residual.shape() == in.x.shape(), kOp, "the residual ",
           ShapeText(in.residual), " is not shaped as x ", in.x.shape().ToString());
  OP_CHECK(!(in.bias.defined() && relative_bias_ != nullptr), kOp, "got a position_bias ",
           ShapeText(in.bias), " but this layer computes its own relative_attention_bias");
  return in;
}

std::pair<Tensor, Tensor> T5Attention::ProjectQ(const Tensor& x, Context& ctx) {
  const Tensor& w = q_->weight()->value;
  if (!w.defined()) return {q_->Run(x, ctx.Child(kQ)), Tensor()};  // gathered inside its Run
  const Tensor xc = x.To(w.dtype());  // (B, T, d_model)
  return {q_->Run(xc, ctx.Child(kQ)), xc};
}

Tensors T5Attention::Forward(const Tensors& inputs, Context& ctx) {
  const auto [x, kv, bias, mask, residual] = CheckedInputs(inputs);
  if (options_.cross_attention) {
    OP_CHECK(kv.defined() && kv.rank() == 3 && kv.dim(0) == x.dim(0) && kv.dim(2) == d_model_, kOp,
             "cross-attention needs kv (B, S, d_model) for x ", x.shape().ToString(), "; got ",
             ShapeText(kv));
  } else {
    OP_CHECK(!kv.defined(), kOp, "self-attention takes no kv input; got ", ShapeText(kv),
             " (construct with cross_attention for encoder-decoder attention)");
  }
  Saved s;
  s.num_inputs = inputs.size();
  s.x_shape = x.shape();
  s.x_dtype = x.dtype();
  const auto [q_proj, xc] = ProjectQ(x, ctx);             // (B, T, nh * d_kv), (B, T, d_model)
  const tensor::Dtype dt = q_proj.dtype();                 // the compute dtype
  const Tensor q = SplitHeads(q_proj, n_heads_);           // (B, nh, T, d_kv)
  const Tensor kvc = options_.cross_attention ? kv.To(dt)  // (B, S, d_model)
                                              : (xc.defined() ? xc : x.To(dt));
  if (options_.cross_attention) s.kv_dtype = kv.dtype();
  const int64_t t_q = x.dim(1), t_k = kvc.dim(1);

  const Tensor k = SplitHeads(k_->Run(kvc, ctx.Child(kK)), n_heads_);  // (B, nh, S, d_kv)
  const Tensor v = SplitHeads(v_->Run(kvc, ctx.Child(kV)), n_heads_);  // (B, nh, S, d_kv)
  Tensor own_bias;                                                     // (1, nh, T, S)
  if (relative_bias_ != nullptr) {
    own_bias = relative_bias_->Run(t_q, t_k, ctx.Child(kBias));
    s.own_bias_shape = own_bias.shape();
  }
  AttentionOptions opts;
  opts.op = kOp;
  opts.scale = 1.0f;  // T5: no 1/sqrt(d_kv)
  opts.causal = options_.causal;
  opts.dropout = options_.dropout;
  opts.training = is_training();
  const Tensor y = AttentionForward(q, k, v, own_bias.defined() ? own_bias : bias, mask, opts, gen_,
                                    &s.attn);                // (B, nh, T, d_kv)
  const Tensor merged = MergeHeads(y);                       // (B, T, nh * d_kv)
  const Tensor out = residual.defined()
                         ? o_->RunResidual(merged, residual, ctx.Child(kO))  // residual + o(merged)
                         : o_->Run(merged, ctx.Child(kO));                   // (B, T, d_model)
  ctx.Save(std::move(s));
  if (own_bias.defined()) return {out, own_bias};
  return {out};
}

Tensors T5Attention::Decode(const Tensors& inputs, KvCache& cache, int64_t capacity) {
  return RunFrame([&]() -> Tensors {  // the hooks Forward runs in (an FSDP unit's gather)
    OP_CHECK(options_.causal || options_.cross_attention, kOp,
             "decoding needs a causal self-attention or a cross-attention; this layer attends "
             "both ways (an encoder's)");
    const auto [x, kv, bias, mask, residual] = CheckedInputs(inputs);
    const int64_t B = x.dim(0), t_new = x.dim(1);
    Context ctx;  // forward only: what the layers save is dropped on return
    const auto [q_proj, x_cast] = ProjectQ(x, ctx);  // (B, T_new, nh * d_kv), (B, T_new, d_model)
    const tensor::Dtype dt = q_proj.dtype();         // the compute dtype
    const Tensor q = SplitHeads(q_proj, n_heads_);   // (B, nh, T_new, d_kv)
    Tensor own_bias;                                                    // (1, nh, T_new, keys)
    if (options_.cross_attention) {
      if (!cache.k.defined()) {
        OP_CHECK(kv.defined() && kv.rank() == 3 && kv.dim(0) == B && kv.dim(2) == d_model_, kOp,
                 "the first decoding call of a cross-attention needs kv (B, S, d_model) for x ",
                 x.shape().ToString(), "; got ", ShapeText(kv));
        const Tensor kvc = kv.To(dt);  // (B, S, d_model)
        // Views of the projections, as Forward attends them.
        cache.k = SplitHeads(k_->Run(kvc, ctx.Child(kK)), n_heads_);  // (B, nh, S, d_kv)
        cache.v = SplitHeads(v_->Run(kvc, ctx.Child(kV)), n_heads_);  // (B, nh, S, d_kv)
        cache.length = kvc.dim(1);
      }
      CheckKvCache(cache, q, kOp);
    } else {
      OP_CHECK(!kv.defined(), kOp, "self-attention takes no kv input; got ", ShapeText(kv));
      const Tensor xc = x_cast.defined() ? x_cast : x.To(dt);              // (B, T_new, d_model)
      const Tensor k = SplitHeads(k_->Run(xc, ctx.Child(kK)), n_heads_);  // (B, nh, T_new, d_kv)
      const Tensor v = SplitHeads(v_->Run(xc, ctx.Child(kV)), n_heads_);  // (B, nh, T_new, d_kv)
      const int64_t start = cache.length;
      AppendToKvCache(cache, k, v, capacity, kOp);  // (B, nh, capacity, d_kv)
      if (relative_bias_ != nullptr) {
        own_bias =
            relative_bias_->Run(t_new, cache.length, ctx.Child(kBias), /*query_offset=*/start);
      }
    }
    const int64_t keys = cache.length;
    const Tensor& use_bias = own_bias.defined() ? own_bias : bias;
    OP_CHECK(!use_bias.defined() || (use_bias.rank() == 4 && use_bias.dim(1) == n_heads_ &&
                                     use_bias.dim(2) == t_new && use_bias.dim(3) == keys),
             kOp, "position_bias ", ShapeText(use_bias), " is not (B or 1, ", n_heads_, ", ", t_new,
             ", ", keys, ")");
    OP_CHECK(!mask.defined() || (mask.rank() == 2 && mask.dim(0) == B && mask.dim(1) == keys), kOp,
             "key mask ", ShapeText(mask), " is not (B, keys) = (", B, ", ", keys, ")");
    AttentionOptions opts;
    opts.op = kOp;
    opts.scale = 1.0f;              // T5: no 1/sqrt(d_kv)
    opts.causal = options_.causal;  // query i of T_new attends keys j <= i + (keys - T_new)
    opts.training = false;
    AttentionState state;
    const Tensor y = AttentionForward(q, cache.k.Narrow(2, 0, keys), cache.v.Narrow(2, 0, keys),
                                      use_bias, mask, opts, gen_, &state);  // (B, nh, T_new, d_kv)
    const Tensor merged = MergeHeads(y);                                    // (B, T_new, nh * d_kv)
    const Tensor out = residual.defined() ? o_->RunResidual(merged, residual,
                                                            ctx.Child(kO))   // residual + o(merged)
                                          : o_->Run(merged, ctx.Child(kO));  // (B, T_new, d_model)
    if (own_bias.defined()) return {out, own_bias};
    return {out};
  });
}

Tensors T5Attention::Backward(const Tensors& grad_outputs, Context& ctx) {
  Saved& s = ctx.Saved<Saved>();
  const Tensor gy = grad_outputs.at(0);
  OP_CHECK(gy.defined() && gy.shape() == s.x_shape, kOp, "grad ", ShapeText(gy),
           " does not match the output ", s.x_shape.ToString());
  const Tensor g_bias_out = grad_outputs.size() > 1 ? grad_outputs[1] : Tensor();
  OP_CHECK(!g_bias_out.defined() ||
               (relative_bias_ != nullptr && g_bias_out.shape() == s.own_bias_shape),
           kOp, "grad of the returned bias ", ShapeText(g_bias_out),
           relative_bias_ != nullptr
               ? absl::StrCat(" does not match the bias ", s.own_bias_shape.ToString())
               : std::string(" given, but this layer returns no bias"));

  // Children in reverse order: o, relative bias, v, k, q.
  const Tensor dmerged = o_->RunBackward(gy, ctx.Child(kO));  // (B, T, nh * d_kv)
  const AttentionGrads ag = AttentionBackward(SplitHeads(dmerged, n_heads_), s.attn);
  Tensors grads(s.num_inputs);
  if (relative_bias_ != nullptr) {
    // Its own use (ag.dbias) plus the other layers' uses of the returned bias.
    const Tensor g = g_bias_out.defined()
                         ? tensor::SumAs({ag.dbias, g_bias_out}, tensor::Dtype::kF32)
                         : ag.dbias.To(tensor::Dtype::kF32);  // (1, nh, T, S)
    relative_bias_->RunBackward(Tensors{g}, ctx.Child(kBias));
  } else if (ag.dbias.defined()) {
    grads.at(2) = ag.dbias;  // the position_bias input's shape and dtype
  }
  const Tensor dv = v_->RunBackward(MergeHeads(ag.dv), ctx.Child(kV));  // (B, S, d_model)
  const Tensor dk = k_->RunBackward(MergeHeads(ag.dk), ctx.Child(kK));  // (B, S, d_model)
  const Tensor dq = q_->RunBackward(MergeHeads(ag.dq), ctx.Child(kQ));  // (B, T, d_model)
  // Added in f32 and rounded once to the input's dtype, in one pass.
  if (options_.cross_attention) {
    grads[0] = dq.To(s.x_dtype);
    grads[1] = tensor::SumAs({dk, dv}, s.kv_dtype);
  } else {
    grads[0] = tensor::SumAs({dq, dk, dv}, s.x_dtype);
  }
  if (s.num_inputs > 4) grads[4] = gy;  // the residual's gradient is the output's
  return grads;
}

}  // namespace nn
