// CausalSelfAttention forward and backward.
#include "nn/attention.h"

#include <cmath>
#include <memory>
#include <utility>

#include "tensor/ops/dropout.h"
#include "tensor/ops/elementwise.h"

namespace nn {
namespace {

constexpr char kOp[] = "causal_self_attention";

LinearOptions ProjOptions(const InitSpec& weight_init) {
  LinearOptions o;
  o.weight_init = weight_init;
  return o;
}

}  // namespace

InitSpec MinGptProjInit(int64_t n_layer) {
  OP_CHECK(n_layer > 0, kOp, "n_layer must be positive; got ", n_layer);
  return InitSpec::Normal(0.0f, 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer)));
}

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, float attn_pdrop,
                                         float resid_pdrop, CausalSelfAttentionOptions options)
    : Module("CausalSelfAttention"),
      n_embd_(n_embd),
      n_head_(n_head),
      attn_pdrop_(attn_pdrop),
      resid_pdrop_(resid_pdrop),
      gen_(options.seed) {
  OP_CHECK(n_embd > 0 && n_head > 0 && n_embd % n_head == 0, kOp, "n_embd ", n_embd,
           " must be a positive multiple of n_head ", n_head);
  OP_CHECK(attn_pdrop >= 0.0f && attn_pdrop <= 1.0f && resid_pdrop >= 0.0f && resid_pdrop <= 1.0f,
           kOp, "dropout probabilities must be in [0, 1]; got attn_pdrop ", attn_pdrop,
           " and resid_pdrop ", resid_pdrop);
  c_attn_ = RegisterModule("c_attn", std::make_unique<Linear>(n_embd, 3 * n_embd));
  c_proj_ = RegisterModule(
      "c_proj", std::make_unique<Linear>(n_embd, n_embd, ProjOptions(options.c_proj_init)));
}

Tensors CausalSelfAttention::Forward(const Tensors& inputs, Context& ctx) {
  OP_CHECK((inputs.size() == 1 || inputs.size() == 2) && inputs[0].defined(), kOp,
           "expects x (B, T, C) and optionally a residual; got ", inputs.size(), " inputs");
  const Tensor& x = inputs[0];
  const int64_t c = n_embd_;
  OP_CHECK(x.rank() == 3 && x.dim(2) == c, kOp, "input ", x.shape().ToString(),
           " is not (B, T, C) with C = n_embd ", c);
  const Tensor residual = inputs.size() == 2 ? inputs[1] : Tensor();  // (B, T, C) or none
  OP_CHECK(!residual.defined() || residual.shape() == x.shape(), kOp, "the residual ",
           residual.defined() ? residual.shape().ToString() : "undefined", " is not shaped as x ",
           x.shape().ToString());
  Saved s;
  s.x_shape = x.shape();
  s.has_residual = inputs.size() == 2;

  const Tensor qkv = c_attn_->Run(x, ctx.Child(0));               // (B, T, 3C), compute dtype
  const Tensor q = SplitHeads(qkv.Narrow(2, 0, c), n_head_);      // (B, nh, T, hs)
  const Tensor k = SplitHeads(qkv.Narrow(2, c, c), n_head_);      // (B, nh, T, hs)
  const Tensor v = SplitHeads(qkv.Narrow(2, 2 * c, c), n_head_);  // (B, nh, T, hs)
  AttentionOptions opts;
  opts.op = kOp;
  opts.scale = 1.0f / std::sqrt(static_cast<float>(c / n_head_));
  opts.causal = true;
  opts.dropout = attn_pdrop_;
  opts.training = is_training();
  const Tensor y =
      AttentionForward(q, k, v, Tensor(), Tensor(), opts, gen_, &s.attn);  // (B, nh, T, hs)
  const Tensor merged = MergeHeads(y);                                     // (B, T, C)
  Tensor out;                                                              // (B, T, C)
  if (residual.defined() && !(resid_pdrop_ > 0 && is_training())) {
    // No residual dropout: residual + c_proj(merged) in c_proj's GEMM.
    out = c_proj_->RunResidual(merged, residual, ctx.Child(1));
    s.resid = tensor::DrawDropoutState(out.numel(), resid_pdrop_, gen_, /*training=*/false);
  } else {
    const Tensor proj = c_proj_->Run(merged, ctx.Child(1));  // (B, T, C)
    // residual + dropout(proj) in one pass.
    tensor::DropoutResult resid =
        residual.defined() ? tensor::DropoutAdd(residual, proj, resid_pdrop_, gen_, is_training())
                           : tensor::Dropout(proj, resid_pdrop_, gen_, is_training());
    s.resid = resid.state;
    out = resid.y;
  }
  ctx.Save(std::move(s));
  return {out};
}

Tensor CausalSelfAttention::Decode(const Tensor& x, KvCache& cache, int64_t capacity,
                                   const Tensor& key_mask) {
  // In Run's frame: the hooks Forward runs in (an FSDP unit's gather) run around it.
  return RunFrame([&] {
           const int64_t c = n_embd_;
           OP_CHECK(x.rank() == 3 && x.dim(2) == c, kOp, "input ", x.shape().ToString(),
                    " is not (B, T, C) with C = n_embd ", c);
           const int64_t B = x.dim(0), T = x.dim(1);
           Context ctx;  // forward only: what the layers save is dropped on return
           const Tensor qkv = c_attn_->Run(x, ctx.Child(0));           // (B, T, 3C), compute dtype
           const Tensor q = SplitHeads(qkv.Narrow(2, 0, c), n_head_);  // (B, nh, T, hs)
           const Tensor k = SplitHeads(qkv.Narrow(2, c, c), n_head_);  // (B, nh, T, hs)
           const Tensor v = SplitHeads(qkv.Narrow(2, 2 * c, c), n_head_);  // (B, nh, T, hs)
           const int64_t length = cache.length + T;  // positions after this call
           OP_CHECK(!key_mask.defined() ||
                        (key_mask.rank() == 2 && key_mask.dim(0) == B && key_mask.dim(1) == length),
                    kOp, "key mask ", key_mask.defined() ? key_mask.shape().ToString() : "",
                    " is not (B, positions) = (", B, ", ", length, ")");
           AppendToKvCache(cache, k, v, capacity, kOp);  // (B, nh, capacity, hs)
           AttentionOptions opts;
           opts.op = kOp;
           opts.scale = 1.0f / std::sqrt(static_cast<float>(c / n_head_));
           opts.causal = true;  // query i of T attends keys j <= i + (length - T)
           opts.training = false;
           AttentionState state;
           const Tensor y =
               AttentionForward(q, cache.k.Narrow(2, 0, length), cache.v.Narrow(2, 0, length),
                                Tensor(), key_mask, opts, gen_, &state);  // (B, nh, T, hs)
           return Tensors{c_proj_->Run(MergeHeads(y), ctx.Child(1))};     // (B, T, C)
         })
      .at(0);
}

Tensors CausalSelfAttention::Backward(const Tensors& grad_outputs, Context& ctx) {
  Saved& s = ctx.Saved<Saved>();
  const Tensor& g = grad_outputs.at(0);
  OP_CHECK(g.defined() && g.shape() == s.x_shape, kOp, "grad ",
           g.defined() ? g.shape().ToString() : "undefined", " does not match the output ",
           s.x_shape.ToString());
  const int64_t c = n_embd_;
  const Tensor g_out = tensor::DropoutBackward(g, s.resid);     // (B, T, C)
  const Tensor dy = c_proj_->RunBackward(g_out, ctx.Child(1));  // (B, T, C), compute dtype
  // dqkv (B, T, 3C): the heads' gradients written straight into the fused
  // layout (by the fused kernels, or the unfused path's GEMMs).
  const Tensor dqkv =
      Tensor::Empty({s.x_shape[0], s.x_shape[1], 3 * c}, s.attn.q.dtype(), s.attn.q.device());
  AttentionGrads into;
  into.dq = SplitHeads(dqkv.Narrow(2, 0, c), n_head_);      // (B, nh, T, hs)
  into.dk = SplitHeads(dqkv.Narrow(2, c, c), n_head_);      // (B, nh, T, hs)
  into.dv = SplitHeads(dqkv.Narrow(2, 2 * c, c), n_head_);  // (B, nh, T, hs)
  AttentionBackward(SplitHeads(dy, n_head_), s.attn, &into);
  Tensors grads = {c_attn_->RunBackward(dqkv, ctx.Child(0))};
  if (s.has_residual) grads.push_back(g);  // the residual's gradient is the output's
  return grads;
}

}  // namespace nn
