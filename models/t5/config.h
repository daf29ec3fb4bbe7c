// T5 configurations: the presets of the original T5 checkpoints (t5-small to
// t5-11b, v1.0: ReLU feed-forward, embeddings tied to the output projection),
// the options of T5 v1.1 (gated-GELU feed-forward, untied lm_head), and the
// parameter names (Hugging Face T5ForConditionalGeneration's), shapes and
// counts of any configuration, computed from the shapes alone (nothing is
// allocated).
#ifndef MODELS_T5_CONFIG_H_
#define MODELS_T5_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace t5 {

// The position-wise feed-forward of every block (Hugging Face feed_forward_proj).
enum class FeedForwardProj {
  kRelu,       // T5 v1.0: wo(dropout(relu(wi x)))
  kGatedGelu,  // T5 v1.1: wo(dropout(gelu(wi_0 x) * wi_1 x))
};

// Field names follow Hugging Face's T5Config.
struct T5Config {
  std::string name;
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;  // size of one attention head (n_heads * d_kv need not be d_model)
  int64_t d_ff = 2048;
  int64_t num_layers = 6;          // encoder blocks
  int64_t num_decoder_layers = 6;  // decoder blocks
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  float dropout_rate = 0.1f;  // embeddings, attention probabilities, sub-layer outputs, FFN hidden
  float layer_norm_epsilon = 1e-6f;
  float initializer_factor = 1.0f;  // scales every initial standard deviation
  FeedForwardProj feed_forward_proj = FeedForwardProj::kRelu;
  // T5 v1.0: the output projection is shared.weight and the decoder output is
  // scaled by d_model^-0.5 before it. v1.1: a separate lm_head, no scaling.
  bool tie_word_embeddings = true;

  int64_t inner_dim() const { return num_heads * d_kv; }  // q, k, v, o width
  bool gated() const { return feed_forward_proj == FeedForwardProj::kGatedGelu; }

  // InvalidArgument naming the field: every size positive, relative buckets
  // even and >= 4 (half of them per direction in the encoder, at least one
  // exact bucket each), max distance above the exact range (num_buckets / 2),
  // dropout in [0, 1), epsilon and initializer factor positive and finite.
  absl::Status Validate() const;
  std::string ToString() const;
};

// The inverse of T5Config::ToString ("t5-small(vocab_size=32128, d_model=512,
// ...)", "custom(...)" for an unnamed one), as checkpoints record it; the
// field ToString leaves out (initializer_factor, which only initialization
// reads) keeps its default, and layer_norm_epsilon (written only when it is
// not 1e-6) is 1e-6 when absent. InvalidArgument naming the text and the field for anything
// else, or a configuration Validate refuses.
absl::StatusOr<T5Config> ParseConfig(absl::string_view text);

// Names: t5-small, t5-base, t5-large, t5-3b, t5-11b (the sizes of Raffel et
// al. 2020 / the Hugging Face checkpoints). T5 v1.0 settings: vocab 32128,
// 32 buckets, max distance 128, dropout 0.1, ReLU, tied embeddings; every
// field can be overridden afterwards (e.g. the vocabulary of byte text).
absl::StatusOr<T5Config> Preset(absl::string_view name);
std::vector<std::string> PresetNames();

// The T5 v1.1 form of a configuration: gated-GELU feed-forward, untied lm_head.
T5Config AsV1_1(T5Config config);

// One parameter tensor: Hugging Face T5 name and shape.
struct ParamShape {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Every parameter, in the order the model registers them (Hugging Face's
// named_parameters() order): shared.weight, encoder.block.*,
// encoder.final_layer_norm.weight, decoder.block.*,
// decoder.final_layer_norm.weight, and lm_head.weight when untied.
std::vector<ParamShape> ParameterShapes(const T5Config& config);

struct ParamCount {
  int64_t total = 0;              // every parameter (shared.weight counted once)
  int64_t shared = 0;             // shared.weight (V, d_model)
  int64_t lm_head = 0;            // 0 with tied embeddings
  int64_t per_encoder_block = 0;  // one encoder T5Block without relative bias
  int64_t per_decoder_block = 0;  // one decoder T5Block without relative bias
  int64_t relative_bias = 0;      // one stack's relative_attention_bias (first block)
  int64_t encoder = 0;            // encoder.* (blocks, bias, final norm)
  int64_t decoder = 0;            // decoder.*
  int64_t non_embedding = 0;      // total - shared - lm_head
};
ParamCount CountParameters(const T5Config& config);

// Model FLOPs of one example's forward and backward (3x the forward's), with
// encoder_length tokens in and decoder_length tokens out: 2 FLOPs a
// multiply-add, the way mingpt::FlopsPerToken and nanoGPT's estimate_mfu
// count, padding included (the kernels compute on it). Forward:
//   2 S L_enc (4 d i + f d d_ff)                          encoder projections, FF
//   + 2 T L_dec (6 d i + f d d_ff) + 2 S L_dec (2 d i)    decoder projections (cross k, v over
//                                                         the S encoder outputs), FF
//   + 4 i (L_enc S^2 + L_dec T (T + S))                   scores and weighted values
//   + 2 T d V                                             lm_head
// with i = n_heads d_kv, f = 2 (ReLU) or 3 (gated GELU); causal scores
// counted whole like minGPT's; norms, softmax and the position bias left out.
// The MFU of the T5 train binary's step lines (models/common/mfu.h).
double FlopsPerExample(const T5Config& config, int64_t encoder_length, int64_t decoder_length);

}  // namespace t5

#endif  // MODELS_T5_CONFIG_H_
