// CausalSelfAttention: minGPT's (GPT-2's) multi-head masked self-attention.
//
//   qkv = c_attn(x)                         // (B, T, 3C), one fused projection
//   q, k, v = heads of qkv                  // (B, nh, T, hs) views, no copies
//   att = softmax(q k^T / sqrt(hs), causal) // (B, nh, T, T)
//   y = attn_dropout(att) @ v               // (B, nh, T, hs)
//   out = resid_dropout(c_proj(y merged))   // (B, T, C)
//
// Children are `c_attn` = Linear(C, 3C) and `c_proj` = Linear(C, C), so inside
// a GPT-2 block the parameters are named `attn.c_attn.weight`, ... as in
// Hugging Face checkpoints (whose Conv1D weights are the transpose).
//
// Computes in the dtype of the projections' weights (f32 or bf16; inputs are
// cast to it); scores and softmax are f32 (see nn/attention_core.h); the input
// gradient comes back in the caller's dtype; parameter gradients accumulate in
// fp32. Dropout (attention probabilities and output) draws from the layer's
// seeded generator and is off in eval mode (Train(false)).
#ifndef NN_ATTENTION_H_
#define NN_ATTENTION_H_

#include <cstdint>

#include "nn/attention_core.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "tensor/random.h"

namespace nn {

struct CausalSelfAttentionOptions {
  // Init of c_proj.weight. minGPT scales it down with depth:
  // MinGptProjInit(n_layer) = Normal(0, 0.02 / sqrt(2 * n_layer)).
  InitSpec c_proj_init = InitSpec::Normal(0.0f, 0.02f);
  // Seed of the dropout generator.
  uint64_t seed = 0;
};

// minGPT's special init of residual projections: Normal(0, 0.02 / sqrt(2 * n_layer)).
InitSpec MinGptProjInit(int64_t n_layer);

class CausalSelfAttention : public Module, public RandomSource {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, float attn_pdrop, float resid_pdrop,
                      CausalSelfAttentionOptions options = {});

  int64_t n_embd() const { return n_embd_; }
  int64_t n_head() const { return n_head_; }
  Linear* c_attn() { return c_attn_; }
  Linear* c_proj() { return c_proj_; }
  // The dropout generator: each training forward advances it; set_offset()
  // replays a forward's masks.
  tensor::Generator& generator() override { return gen_; }

  // Incremental decoding (forward only, no dropout): x (B, T_new, C) holds
  // positions cache.length .. cache.length + T_new - 1 of the sequence. Their
  // keys and values are written into the cache (allocated on first use for
  // `capacity` positions), and each of their queries attends the cached
  // positions up to its own. Returns (B, T_new, C) in the compute dtype: the
  // last T_new positions of Forward over the whole sequence in eval mode.
  // key_mask: undefined, or (B, cache.length + T_new) on the layer's device,
  // any dtype, 0 at positions no query attends (the left padding of a batch
  // of prompts of unequal lengths); a query that sees no key gets 0.
  Tensor Decode(const Tensor& x, KvCache& cache, int64_t capacity,
                const Tensor& key_mask = Tensor());

 protected:
  // inputs[0]: x (B, T, C) -> {y (B, T, C)} in the compute dtype. With
  // inputs[1], a residual (B, T, C): residual + y in the residual's dtype (a
  // pre-norm block's x + attn(ln(x))); without residual dropout (p 0 or eval
  // mode) the sum comes out of c_proj's GEMM (Linear::RunResidual).
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // {grad_y (B, T, C)} -> {grad_x (B, T, C)} in x's dtype (and, with a
  // residual, its gradient: grad_y itself); accumulates the gradients of
  // c_attn and c_proj.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    AttentionState attn;         // q, k, v views of c_attn's output, probs (B, nh, T, T)
    tensor::DropoutState resid;  // residual dropout of the output
    tensor::Shape x_shape;       // (B, T, C)
    bool has_residual = false;   // inputs[1] was given
  };
  const int64_t n_embd_;
  const int64_t n_head_;
  const float attn_pdrop_;
  const float resid_pdrop_;
  tensor::Generator gen_;
  Linear* c_attn_;  // (3C, C) weight, (3C) bias
  Linear* c_proj_;  // (C, C) weight, (C) bias
};

}  // namespace nn

#endif  // NN_ATTENTION_H_
