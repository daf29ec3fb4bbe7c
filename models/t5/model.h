// T5 (Raffel et al. 2020) in C++, as Hugging Face's T5ForConditionalGeneration:
// a shared token embedding, an encoder stack and a decoder stack of T5Blocks,
// and the output projection onto the vocabulary.
//
//   enc = encoder(shared(encoder_inputs), encoder_mask)          // (B, S, d_model)
//   dec = decoder(shared(decoder_inputs), enc, encoder_mask)     // (B, T, d_model)
//   logits = (dec * d_model^-0.5) @ shared.weight^T              // (B, T, V), tied (v1.0)
//          = lm_head(dec)                                        // untied (v1.1)
//   loss = mean cross-entropy over targets != -100
//
// Parameter names are Hugging Face's ("shared.weight",
// "encoder.block.0.layer.0.SelfAttention.q.weight", "decoder.final_layer_norm.weight").
// shared.weight is used three times (encoder lookup, decoder lookup, tied
// projection) and its gradient is the sum of the three. The encoder padding
// mask hides padded keys in the encoder self-attention and in every
// cross-attention; decoder self-attention is causal.
//
// Initialization is Hugging Face's (Mesh TensorFlow's), scaled by
// initializer_factor f: shared and lm_head N(0, f), q N(0, f (d_model d_kv)^-1/2),
// k, v and the relative biases N(0, f d_model^-1/2), o N(0, f (nh d_kv)^-1/2),
// wi N(0, f d_model^-1/2), wo N(0, f d_ff^-1/2), RMSNorm weights 1.
//
// FSDP: wrap "T5Block" units; shared.weight must stay in the root unit (or be
// gathered whenever the root runs), since the tied projection reads it outside
// the embedding module's own forward, as PyTorch FSDP requires for tied weights.
#ifndef MODELS_T5_MODEL_H_
#define MODELS_T5_MODEL_H_

#include <cstdint>
#include <vector>

#include "models/t5/block.h"
#include "models/t5/config.h"
#include "nn/containers.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/rms_norm.h"

namespace t5 {

// The decoder's keys and values during generation (T5Model::DecodeStep): per
// decoder block, the self-attention's for the positions decoded so far and
// the cross-attention's of the encoder output. Set `capacity` (the decoder
// positions the run will reach) before the first step; the tensors are
// allocated then. One cache per batch of encoder inputs.
struct DecoderCache {
  int64_t capacity = 0;
  std::vector<T5BlockCache> blocks;  // one per decoder block, sized on the first step
  // Decoder positions held.
  int64_t length() const { return blocks.empty() ? 0 : blocks[0].self.length; }
  // Beam search's reordering: row i of every self-attention cache becomes
  // what row rows[i] held (positions so far). The cross-attention's keys and
  // values stay: rows[i] must decode the same encoder example as row i (a
  // beam of the same input). Throws OpError for a row out of range.
  void SelectRows(const std::vector<int64_t>& rows);
};

// The encoder or the decoder: embedding lookup through the shared table,
// dropout, the blocks, the final RMSNorm, dropout. Children "block" (a
// ModuleList of T5Blocks; block 0 owns the relative position bias, the others
// reuse its output), "final_layer_norm", "dropout". The embedding is not a
// child (it belongs to T5Model as "shared"), as in Hugging Face, where
// embed_tokens is the shared module and its parameter is named once.
class T5Stack : public nn::Module {
 public:
  // Input slots of Forward.
  enum Input : size_t {
    kInputIds = 0,       // (B, T) i32/i64
    kAttentionMask = 1,  // (B, T) 0/1 key mask of self-attention, or undefined
    kEncoderHidden = 2,  // (B, S, d_model): decoder only
    kEncoderMask = 3,    // (B, S) 0/1 key mask of cross-attention, or undefined
  };

  // embed_tokens (not owned) must outlive the stack. encoder (decoder only;
  // not owned): the stack the decoder's encoder-output gradient feeds, so the
  // decoder's backward knows whether that gradient is wanted (frozen
  // parameters; see Backward).
  T5Stack(const T5Config& config, bool is_decoder, nn::Embedding* embed_tokens,
          nn::Module* encoder = nullptr);

  bool is_decoder() const { return is_decoder_; }
  nn::ModuleList* blocks() { return block_; }
  T5Block* block(size_t i) { return static_cast<T5Block*>(block_->at(i)); }

  // Incremental decoding, the decoder only (eval mode, forward only; see
  // T5Model::DecodeStep): ids (B, T_new) continue the positions `cache`
  // holds -> hidden (B, T_new, d_model) after the final norm, as Forward over
  // the whole sequence gives them for those positions.
  Tensor Decode(const Tensor& ids, const Tensor& encoder_hidden, const Tensor& encoder_mask,
                DecoderCache& cache);

 protected:
  // inputs: the slots above (trailing ones may be left out) -> {hidden (B, T, d_model)}.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // {grad_hidden} -> {undefined, undefined, grad_encoder_hidden (decoder), undefined},
  // one per input given. Accumulates into shared.weight's gradient. With
  // frozen parameters it goes down only as far as something trains: when the
  // shared embedding is frozen (and, for the decoder, the whole encoder, so
  // grad_encoder_hidden is left undefined), the frozen blocks below the
  // lowest trainable one run no backward, nor the final norm when nothing
  // of the stack trains.
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct Saved {
    size_t num_inputs;
    tensor::Dtype encoder_hidden_dtype;  // decoder: for its gradient
  };
  // Context children: the embedding, the first dropout, the blocks, the norm,
  // the last dropout.
  size_t BlockSlot(size_t l) const { return 2 + l; }
  // Frozen parameters (fine-tuning): whether anything below the blocks wants
  // a gradient (the shared embedding, or for the decoder the encoder), and
  // the lowest block a backward must reach (0 when something below trains,
  // given BelowBlocksTrain(); L when no block does). Forward keeps no
  // activations of the blocks below it (as under torch.no_grad), and
  // Backward stops above them.
  bool BelowBlocksTrain();
  size_t FirstBlockWithBackward(bool below_trains);
  size_t NormSlot() const { return 2 + block_->size(); }
  size_t FinalDropoutSlot() const { return 3 + block_->size(); }

  const bool is_decoder_;
  nn::Embedding* embed_tokens_;  // (V, d_model), not owned
  nn::Module* encoder_;          // decoder: the encoder stack, not owned; else null
  nn::ModuleList* block_;
  nn::RMSNorm* final_layer_norm_;
  nn::Dropout* dropout_;
};

class T5Model : public nn::Module {
 public:
  // Throws tensor::OpError("[t5] ...") for an invalid configuration
  // (T5Config::Validate). Parameters are created unmaterialized: call
  // Materialize(seed) (or let FSDP shard them). Every dropout gets its own
  // random stream (nn::SeedRandomSources(*this, 0)); reseed as needed.
  explicit T5Model(const T5Config& config);

  const T5Config& config() const { return config_; }
  nn::Embedding* shared() { return shared_; }
  T5Stack* encoder() { return encoder_; }
  T5Stack* decoder() { return decoder_; }
  nn::Linear* lm_head() { return lm_head_; }  // nullptr with tied embeddings

  // Forward, loss and backward of one batch; parameter gradients accumulate
  // into their fp32 buffers. encoder_inputs and encoder_mask (B, S) (the mask
  // may be undefined: no padding), decoder_inputs and decoder_targets (B, T)
  // (targets -100 are ignored), as data::Seq2SeqBatch holds them. Returns the
  // mean cross-entropy over the targets that are not ignored (0 if none). The
  // logits' memory is reused for their gradient. `loss_scale`: the backward
  // starts from loss * loss_scale (loss scaling; the returned loss is not
  // scaled).
  double ForwardBackward(const Tensor& encoder_inputs, const Tensor& encoder_mask,
                         const Tensor& decoder_inputs, const Tensor& decoder_targets,
                         double loss_scale = 1.0);
  // The same mean cross-entropy without backward (evaluation; dropout follows
  // Train(): call Train(false) for deterministic results).
  double Loss(const Tensor& encoder_inputs, const Tensor& encoder_mask,
              const Tensor& decoder_inputs, const Tensor& decoder_targets);

  // Forward only, in pieces, for decoding (models/t5/generate.h): the
  // encoder's output (B, S, d_model) once, then the logits (B, T, V) of any
  // decoder inputs (B, T) against it. Dropout follows Train().
  Tensor Encode(const Tensor& encoder_inputs, const Tensor& encoder_mask);
  Tensor DecodeLogits(const Tensor& encoded, const Tensor& encoder_mask,
                      const Tensor& decoder_inputs);
  // DecodeLogits with keys and values kept (generation): decoder_inputs
  // (B, T_new) continue the positions `cache` holds (none: a new sequence)
  // and the logits (B, T_new, V) of those positions come back, as
  // DecodeLogits of the whole sequence gives them, at the cost of T_new
  // positions. `encoded` and `encoder_mask` are the same every step (the
  // cross-attention's keys and values are taken from the first). Eval mode
  // (Train(false)); parameters whole (not sharded by FSDP): the layers are
  // called directly. Throws tensor::OpError("[t5] ...") past
  // cache.capacity, or for a batch the cache was not made for.
  Tensor DecodeStep(const Tensor& encoded, const Tensor& encoder_mask, const Tensor& decoder_inputs,
                    DecoderCache& cache);

 protected:
  // {encoder_inputs (B, S), encoder_mask (B, S) or undefined, decoder_inputs (B, T)}
  //   -> {logits (B, T, V)} in the compute dtype.
  Tensors Forward(const Tensors& inputs, Context& ctx) override;
  // {grad_logits (B, T, V)} -> three undefined gradients (token ids and mask).
  Tensors Backward(const Tensors& grad_outputs, Context& ctx) override;

 private:
  struct TiedHeadSaved {
    Tensor x;  // (N, d_model) decoder output times d_model^-0.5, compute dtype
    tensor::Dtype x_dtype;
    tensor::Shape x_shape;  // (B, T, d_model)
  };
  // Throws OpError unless the targets are ids shaped like the decoder inputs.
  void CheckTargets(const Tensor& decoder_inputs, const Tensor& decoder_targets) const;
  // logits (B, T, V) = (x * d_model^-0.5) @ shared.weight^T, and its backward
  // (accumulates into shared.weight's gradient, returns grad x).
  Tensor TiedHeadForward(const Tensor& x, Context& ctx);
  Tensor TiedHeadBackward(const Tensor& grad_logits, Context& ctx);
  // lm_head(x), or the tied projection: x (B, T, d_model) -> logits (B, T, V).
  Tensor HeadForward(const Tensor& x, Context& ctx);
  // Throws OpError unless encoded is (B, S, d_model) and decoder_inputs (B, T) ids.
  void CheckDecoderInputs(const Tensor& encoded, const Tensor& decoder_inputs) const;

  const T5Config config_;
  nn::Embedding* shared_;  // (V, d_model)
  T5Stack* encoder_;
  T5Stack* decoder_;
  nn::Linear* lm_head_ = nullptr;  // (V, d_model), untied only
};

}  // namespace t5

#endif  // MODELS_T5_MODEL_H_
