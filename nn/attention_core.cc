// Attention scores, masks, softmax and value mixing, forward and backward.
#include "nn/attention_core.h"

#include <cmath>

#include <algorithm>
#include <limits>
#include <vector>

#include "tensor/cuda/attention.h"
#include "tensor/ops/check.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/softmax.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::MatmulOptions;

// Checks that q, k, v, bias and key_mask fit together.
// (f16 is accepted on CUDA only, where the fused kernels take it.)
void CheckShapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                 const Tensor& key_mask, const AttentionOptions& o, bool cuda) {
  OP_CHECK(q.defined() && k.defined() && v.defined(), o.op, "q, k and v must be defined");
  OP_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, o.op,
           "q, k, v must be (B, nh, T, hs); got ", q.shape().ToString(), ", ", k.shape().ToString(),
           ", ", v.shape().ToString());
  const int64_t b = q.dim(0), nh = q.dim(1), t_q = q.dim(2), t_k = k.dim(2);
  OP_CHECK(k.dim(0) == b && v.dim(0) == b && k.dim(1) == nh && v.dim(1) == nh &&
               k.dim(3) == q.dim(3) && v.dim(2) == t_k,
           o.op, "q ", q.shape().ToString(), ", k ", k.shape().ToString(), " and v ",
           v.shape().ToString(), " do not fit together");
  OP_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() &&
               (q.dtype() == Dtype::kF32 || q.dtype() == Dtype::kBF16 ||
                (cuda && q.dtype() == Dtype::kF16)),
           o.op, "q, k, v must share dtype f32 or bf16", cuda ? " (or f16 on CUDA)" : "", "; got ",
           DtypeName(q.dtype()), ", ", DtypeName(k.dtype()), ", ", DtypeName(v.dtype()));
  if (bias.defined()) {
    OP_CHECK(bias.rank() == 4 && (bias.dim(0) == 1 || bias.dim(0) == b) && bias.dim(1) == nh &&
                 bias.dim(2) == t_q && bias.dim(3) == t_k,
             o.op, "position bias ", bias.shape().ToString(), " must be (", b, " or 1, ", nh, ", ",
             t_q, ", ", t_k, ") for scores (", b, ",", nh, ",", t_q, ",", t_k, ")");
    tensor::CheckFloating(o.op, bias);
  }
  if (key_mask.defined()) {
    OP_CHECK(key_mask.rank() == 2 && key_mask.dim(0) == b && key_mask.dim(1) == t_k, o.op,
             "key padding mask ", key_mask.shape().ToString(), " must be (B, T_k) = (", b, ",", t_k,
             ")");
  }
  OP_CHECK(o.dropout >= 0.0f && o.dropout <= 1.0f, o.op, "dropout must be in [0, 1]; got ",
           o.dropout);
  // (Masked scores are -inf before a softmax that scales: 0 or a negative
  // scale would turn them into NaN or +inf.)
  OP_CHECK(std::isfinite(o.scale) && o.scale > 0.0f, o.op,
           "scale must be a positive finite number; got ", o.scale);
}

// Masks the scores (B, nh, T_q, T_k) (f32, contiguous, on any device): keys
// with key_mask 0 (if given) and, when causal, keys after the query's
// position get -inf. The (B, T_q, T_k) mask (0 or -inf) is built on the host
// and added to every head's scores. Rows left without any key are left as
// they are and listed in dead_rows (flat row indices) for the caller to zero
// after the softmax.
void MaskScores(const Tensor& scores, const Tensor& key_mask, bool causal,
                std::vector<int64_t>* dead_rows) {
  const int64_t b = scores.dim(0), nh = scores.dim(1), t_q = scores.dim(2), t_k = scores.dim(3);
  std::vector<float> keep(b * t_k, 1.0f);  // (B, T_k)
  if (key_mask.defined()) keep = key_mask.ToVector<float>();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> add(b * t_q * t_k, 0.0f);  // (B, T_q, T_k)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < t_q; ++i) {
      float* r = add.data() + (bi * t_q + i) * t_k;
      const int64_t limit = causal ? std::min(t_k, i + (t_k - t_q) + 1) : t_k;  // keys < limit
      bool any = false;
      for (int64_t j = 0; j < t_k; ++j) {
        if (j < limit && keep[bi * t_k + j] != 0.0f) {
          any = true;
        } else {
          r[j] = kNegInf;
        }
      }
      if (!any) {
        std::fill(r, r + t_k, 0.0f);
        for (int64_t h = 0; h < nh; ++h) dead_rows->push_back((bi * nh + h) * t_q + i);
      }
    }
  }
  const Tensor mask = Tensor::FromVector(add, {b, t_q, t_k}).To(scores.device());
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < nh; ++h) {
      tensor::AddInPlace(scores.Select(0, bi).Select(0, h), mask.Select(0, bi));
    }
  }
}

// On CUDA: the fused kernels (tensor/cuda/attention.h) take head sizes 32,
// 64 and 128 with any mix of causal masking, a bias, a key padding mask and
// attention dropout, and never hold the (T_q, T_k) probabilities. Other head
// sizes run the unfused path below on the GPU's matmul, softmax and dropout
// kernels (which keeps the probabilities, as on the CPU), and so does a
// dropout of 1 (all zeros).
bool UsesFlash(const Tensor& q, const Tensor& v, const AttentionOptions& o) {
  const int64_t d = q.dim(3);
  return !(o.training && o.dropout >= 1.0f) && (d == 32 || d == 64 || d == 128) && v.dim(3) == d;
}

void CheckCudaInputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const tensor::Device dev = q.device();
  OP_CHECK(k.device() == dev && v.device() == dev, o.op, "q, k and v must be on one device; got ",
           dev.ToString(), ", ", k.device().ToString(), ", ", v.device().ToString());
}

tensor::cuda::FlashDropout ToFlash(const tensor::DropoutState& d) {
  tensor::cuda::FlashDropout f;
  if (!d.active) return f;
  f.p = d.p;
  f.seed = d.seed;
  f.offset = d.offset;
  return f;
}

// The score terms as the fused kernels take them: on q's device, contiguous.
// The bias keeps its dtype (the kernels read f32, bf16 and f16, the only
// floating dtypes), so no f32 copy of it is made; the key mask becomes bytes
// here, once for the forward and the backward.
tensor::cuda::FlashScoreTerms FlashTerms(const Tensor& q, const Tensor& bias,
                                         const Tensor& key_mask) {
  tensor::cuda::FlashScoreTerms terms;
  if (bias.defined()) terms.bias = bias.To(q.device()).Contiguous();  // (B or 1, nh, T_q, T_k)
  if (key_mask.defined()) {
    terms.key_mask =
        tensor::cuda::FlashKeyMaskBytes(key_mask.To(q.device()).Contiguous());  // (B, T_k) u8
  }
  return terms;
}

// An uninitialized (B, nh, T, hs) tensor laid out (B, T, nh, hs): the layout
// the projections around attention use, so MergeHeads of it is a view, and
// the GEMMs or kernels write each head's rows in place.
Tensor HeadsLaidOutByTime(int64_t b, int64_t nh, int64_t t, int64_t hs, Dtype dtype,
                          tensor::Device device) {
  return Tensor::Empty({b, t, nh, hs}, dtype, device).Transpose(1, 2);
}
Tensor HeadsLaidOutByTime(const Tensor& like) {  // like (B, nh, T, hs)
  return HeadsLaidOutByTime(like.dim(0), like.dim(1), like.dim(2), like.dim(3), like.dtype(),
                            like.device());
}

// The fused CUDA path (UsesFlash).
Tensor FlashForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                    const Tensor& key_mask, const AttentionOptions& o, tensor::Generator& gen,
                    AttentionState* state) {
  const tensor::Device dev = q.device();
  const int64_t b = q.dim(0), nh = q.dim(1), t_q = q.dim(2), t_k = k.dim(2);
  Tensor y = HeadsLaidOutByTime(b, nh, t_q, v.dim(3), q.dtype(), dev);  // (B, nh, T_q, hs_v)
  Tensor lse = Tensor::Empty({b, nh, t_q}, Dtype::kF32, dev);  // (B, nh, T_q)
  // The state tensor::Dropout of the (B, nh, T_q, T_k) probabilities would
  // draw: the same mask.
  const tensor::DropoutState drop =
      tensor::DrawDropoutState(b * nh * t_q * t_k, o.dropout, gen, o.training);
  const tensor::cuda::FlashScoreTerms terms = FlashTerms(q, bias, key_mask);
  tensor::cuda::FlashAttentionForward(q, k, v, o.scale, o.causal, y, lse,
                                      tensor::cuda::FlashAttentionKernel::kAuto, ToFlash(drop),
                                      terms);
  state->q = q;
  state->k = k;
  state->v = v;
  state->probs = Tensor();
  state->dropout = drop;
  state->scale = o.scale;
  state->softmax_causal = false;
  state->has_bias = bias.defined();
  if (bias.defined()) {
    state->bias_shape = bias.shape();
    state->bias_dtype = bias.dtype();
  }
  state->flash = true;
  state->causal = o.causal;
  state->out = y;
  state->lse = lse;
  state->flash_bias = terms.bias;
  state->flash_key_mask = terms.key_mask;
  return y;
}

AttentionGrads FlashBackward(const Tensor& grad_y, const AttentionState& s,
                             const AttentionGrads* into) {
  OP_CHECK(grad_y.defined() && grad_y.shape() == s.out.shape(), "attention", "grad_y ",
           grad_y.defined() ? grad_y.shape().ToString() : "undefined",
           " does not match the output ", s.out.shape().ToString());
  OP_CHECK(grad_y.device() == s.q.device(), "attention", "grad_y is on ",
           grad_y.device().ToString(), ", the forward ran on ", s.q.device().ToString());
  // Any strides with a unit stride in hs go to the kernel as they are.
  Tensor gy = grad_y.To(s.q.dtype());
  if (gy.strides()[3] != 1) gy = gy.Contiguous();
  AttentionGrads grads;
  grads.dq = into != nullptr ? into->dq : HeadsLaidOutByTime(s.q);
  grads.dk = into != nullptr ? into->dk : HeadsLaidOutByTime(s.k);
  grads.dv = into != nullptr ? into->dv : HeadsLaidOutByTime(s.v);
  tensor::cuda::FlashScoreTerms terms;
  terms.bias = s.flash_bias;
  terms.key_mask = s.flash_key_mask;
  // With a bias: its gradient in the bias's shape (B or 1, nh, T_q, T_k), f32
  // (the kernels sum dS over a shared batch themselves).
  Tensor dbias;
  if (s.has_bias) dbias = Tensor::Empty(s.bias_shape, Dtype::kF32, s.q.device());
  tensor::cuda::FlashAttentionBackward(
      s.q, s.k, s.v, s.out, s.lse, gy, s.scale, s.causal, grads.dq, grads.dk, grads.dv,
      tensor::cuda::FlashAttentionKernel::kAuto, ToFlash(s.dropout), terms, dbias);
  if (s.has_bias) grads.dbias = dbias.To(s.bias_dtype);
  return grads;
}

}  // namespace

Tensor AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                        const Tensor& key_mask, const AttentionOptions& options,
                        tensor::Generator& gen, AttentionState* state) {
  const bool cuda = q.defined() && q.device().is_cuda();
  CheckShapes(q, k, v, bias, key_mask, options, cuda);
  if (cuda) {
    CheckCudaInputs(q, k, v, options);
    if (UsesFlash(q, v, options)) return FlashForward(q, k, v, bias, key_mask, options, gen, state);
  }
  const Dtype dt = q.dtype();
  const int64_t t_q = q.dim(2), t_k = k.dim(2);
  // Masks the softmax op cannot express (key padding, or causal with T_q > T_k)
  // are written into the scores.
  const bool manual_mask = key_mask.defined() || (options.causal && t_q > t_k);
  // A bias is added after the scale, so the scale is applied to the scores
  // first; without one it is folded into the softmax.
  const bool prescale = bias.defined() && options.scale != 1.0f;

  // scores (B, nh, T_q, T_k) = q @ k^T, f32.
  MatmulOptions qk;
  qk.trans_b = true;
  qk.out_dtype = Dtype::kF32;
  Tensor scores = tensor::Matmul(q, k, qk);
  if (prescale) tensor::ScaleInPlace(scores, options.scale);
  if (bias.defined()) {
    const Tensor bias32 = bias.To(Dtype::kF32);  // (B or 1, nh, T_q, T_k)
    for (int64_t b = 0; b < scores.dim(0); ++b) {
      tensor::AddInPlace(scores.Select(0, b), bias32.Select(0, bias32.dim(0) == 1 ? 0 : b));
    }
  }
  std::vector<int64_t> dead_rows;
  if (manual_mask) MaskScores(scores, key_mask, options.causal, &dead_rows);
  tensor::SoftmaxOptions sm;
  sm.scale = bias.defined() ? 1.0f : options.scale;
  sm.causal = options.causal && !manual_mask;
  tensor::SoftmaxInto(scores, scores, sm);  // now the probabilities, in place
  if (!dead_rows.empty()) {
    const Tensor rows = scores.View({scores.dim(0) * scores.dim(1) * t_q, t_k});  // (B nh T_q, T_k)
    for (int64_t row : dead_rows) tensor::Zero(rows.Select(0, row));
  }
  Tensor probs = scores.To(dt);  // (B, nh, T_q, T_k), compute dtype

  tensor::DropoutResult drop = tensor::Dropout(probs, options.dropout, gen, options.training);
  // y (B, nh, T_q, hs_v), laid out by time as the fused path's.
  Tensor y = HeadsLaidOutByTime(q.dim(0), q.dim(1), t_q, v.dim(3), dt, q.device());
  tensor::MatmulInto(drop.y, v, y);

  state->q = q;
  state->k = k;
  state->v = v;
  state->probs = probs;
  state->dropout = drop.state;
  state->scale = options.scale;
  state->softmax_causal = sm.causal;
  state->has_bias = bias.defined();
  state->flash = false;
  state->out = Tensor();
  state->lse = Tensor();
  if (bias.defined()) {
    state->bias_shape = bias.shape();
    state->bias_dtype = bias.dtype();
  }
  return y;
}

AttentionGrads AttentionBackward(const Tensor& grad_y, const AttentionState& s,
                                 const AttentionGrads* into) {
  if (s.flash) return FlashBackward(grad_y, s, into);
  const Dtype dt = s.q.dtype();
  const Tensor gy = grad_y.To(dt);  // (B, nh, T_q, hs_v)
  AttentionGrads grads;
  // d probs_d (B, nh, T_q, T_k) = gy @ v^T, f32, for the probabilities after
  // dropout (probs_d).
  MatmulOptions tb;
  tb.trans_b = true;
  tb.out_dtype = Dtype::kF32;
  const Tensor dprobs_d = tensor::Matmul(gy, s.v, tb);
  // One regeneration of the forward's mask for both: probs_d = the forward's
  // dropout output (probs times the mask and 1 / (1 - p)), and the gradient
  // back through the dropout, dprobs (B, nh, T_q, T_k).
  const auto [probs_d, dprobs] = tensor::DropoutBackwardOfBoth(s.probs, dprobs_d, s.dropout);
  // The gradients are written where `into` says, else laid out by time as y.
  grads.dq = into != nullptr ? into->dq : HeadsLaidOutByTime(s.q);
  grads.dk = into != nullptr ? into->dk : HeadsLaidOutByTime(s.k);
  grads.dv = into != nullptr ? into->dv : HeadsLaidOutByTime(s.v);
  // dv (B, nh, T_k, hs_v) = probs_d^T @ gy.
  MatmulOptions ta;
  ta.trans_a = true;
  tensor::MatmulInto(probs_d, gy, grads.dv, ta);
  // Back through the softmax.
  tensor::SoftmaxOptions sm;
  sm.scale = s.has_bias ? 1.0f : s.scale;
  sm.causal = s.softmax_causal;
  Tensor dscores = tensor::SoftmaxBackward(dprobs, s.probs.To(Dtype::kF32), sm);  // f32
  if (s.has_bias) {
    grads.dbias = tensor::ReduceToShape(dscores, s.bias_shape).To(s.bias_dtype);
    if (s.scale != 1.0f) {
      if (grads.dbias.SharesStorageWith(dscores)) grads.dbias = grads.dbias.Clone();
      tensor::ScaleInPlace(dscores, s.scale);
    }
  }
  const Tensor ds = dscores.To(dt);
  // dq (B, nh, T_q, hs) = ds @ k; dk (B, nh, T_k, hs) = ds^T @ q.
  tensor::MatmulInto(ds, s.k, grads.dq);
  tensor::MatmulInto(ds, s.q, grads.dk, ta);
  return grads;
}

void CheckKvCache(const KvCache& cache, const Tensor& k, const char* op) {
  OP_CHECK(
      cache.k.dim(0) == k.dim(0) && cache.k.dtype() == k.dtype() && cache.k.device() == k.device(),
      op, "the cache holds ", cache.k.shape().ToString(), " ", tensor::DtypeName(cache.k.dtype()),
      " for a batch of ", k.dim(0), " in ", tensor::DtypeName(k.dtype()));
}

void AppendToKvCache(KvCache& cache, const Tensor& k, const Tensor& v, int64_t capacity,
                     const char* op) {
  const int64_t T = k.dim(2);
  if (!cache.k.defined()) {
    const tensor::Shape shape({k.dim(0), k.dim(1), capacity, k.dim(3)});
    cache.k = Tensor::Empty(shape, k.dtype(), k.device());  // (B, nh, capacity, hs)
    cache.v = Tensor::Empty(shape, v.dtype(), v.device());
    cache.length = 0;
  }
  CheckKvCache(cache, k, op);
  OP_CHECK(cache.length + T <= cache.k.dim(2), op, "the cache holds ", cache.k.dim(2),
           " positions; ", cache.length, " + ", T, " do not fit");
  cache.k.Narrow(2, cache.length, T).CopyFrom(k);
  cache.v.Narrow(2, cache.length, T).CopyFrom(v);
  cache.length += T;
}

void SelectKvCacheRows(KvCache& cache, const std::vector<int64_t>& rows, const char* op) {
  if (!cache.k.defined()) return;
  const int64_t B = cache.k.dim(0), n = cache.length;
  OP_CHECK(static_cast<int64_t>(rows.size()) == B, op, rows.size(), " rows for a cache of ", B);
  std::vector<int64_t> moved;  // the rows that continue another row
  for (int64_t i = 0; i < B; ++i) {
    OP_CHECK(rows[i] >= 0 && rows[i] < B, op, "row ", rows[i], " of a cache of ", B);
    if (rows[i] != i) moved.push_back(i);
  }
  if (moved.empty() || n == 0) return;
  // In place, through a copy of the positions the moved rows take (their
  // sources may be moved rows too): the cache keeps its storage, and the
  // staging copy holds n positions, not the capacity.
  for (Tensor* t : {&cache.k, &cache.v}) {
    const Tensor held = t->Narrow(2, 0, n);  // (B, nh, n, hs)
    tensor::Shape shape = held.shape();
    shape[0] = static_cast<int64_t>(moved.size());
    Tensor staged = Tensor::Empty(shape, t->dtype(), t->device());  // (M, nh, n, hs)
    for (size_t j = 0; j < moved.size(); ++j) {
      staged.Narrow(0, j, 1).CopyFrom(held.Narrow(0, rows[moved[j]], 1));
    }
    for (size_t j = 0; j < moved.size(); ++j) {
      held.Narrow(0, moved[j], 1).CopyFrom(staged.Narrow(0, j, 1));
    }
  }
}

Tensor SplitHeads(const Tensor& x, int64_t n_heads) {
  OP_CHECK(x.rank() == 3 && n_heads > 0 && x.dim(2) % n_heads == 0, "split_heads", "x ",
           x.shape().ToString(), " cannot be split into ", n_heads, " heads");
  return x.View({x.dim(0), x.dim(1), n_heads, x.dim(2) / n_heads}).Transpose(1, 2);
}

Tensor MergeHeads(const Tensor& x) {
  OP_CHECK(x.rank() == 4, "merge_heads", "x ", x.shape().ToString(), " is not (B, nh, T, hs)");
  return x.Transpose(1, 2).Reshape({x.dim(0), x.dim(2), x.dim(1) * x.dim(3)});
}

}  // namespace nn
