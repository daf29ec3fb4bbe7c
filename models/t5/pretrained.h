// T5 weights from a Hugging Face T5ForConditionalGeneration folder (t5-small
// .. t5-11b, google/t5-v1_1-*, or what save_pretrained writes after a
// fine-tuning), and the export of ours as one. The model is the same: our
// parameter names are Hugging Face's, and //models/t5:parity_test holds ours
// to its computation.
//   - config.json: vocab_size, d_model, d_kv, d_ff, num_layers, num_heads;
//     num_decoder_layers (default num_layers), relative_attention_num_buckets
//     (32), relative_attention_max_distance (128), dropout_rate (0.1),
//     layer_norm_epsilon (1e-6), initializer_factor (1), feed_forward_proj
//     ("relu", or "gated-gelu": v1.1), tie_word_embeddings (true); any other
//     feed_forward_proj (gated-silu, gelu, ...) or model_type is refused,
//     naming the key.
//   - weights: ours by name. encoder.embed_tokens.weight and
//     decoder.embed_tokens.weight (shared.weight under other names) are
//     skipped, or stand for shared.weight when the file leaves it out; a tied
//     model's lm_head.weight is skipped (Hugging Face ties it to shared.weight
//     on load). f32, f16 or bf16, read as f32, slice by slice.
// T5's vocabulary is padded (t5-small: 32128 rows for 32000 SentencePiece ids
// and 100 sentinels, <extra_id_0> = 32099, as data::SpanCorruptor numbers them
// above 32000): //models/t5:train --init_from=DIR accepts a model vocabulary
// larger than the data's ids + sentinels.
#ifndef MODELS_T5_PRETRAINED_H_
#define MODELS_T5_PRETRAINED_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/t5/config.h"
#include "nn/state_dict.h"
#include "tensor/json.h"

namespace t5 {

// config.json's fields as above (`path` names the file in errors); the
// configuration is named "hf-t5".
absl::StatusOr<T5Config> ConfigFromHf(const tensor::Json& json, const std::string& path);

// The special token ids config.json records: T5's SentencePiece ids by
// default (pad and decoder start 0, eos 1); a checkpoint's are those its span
// corruption batches used (data::SpanCorruptionIdsOf), eos -1 written as
// null (its rows end without one).
struct HfT5Ids {
  int64_t eos_id = 1;
  int64_t pad_id = 0;
  int64_t decoder_start_id = 0;
};

// The ids a checkpoint's span corruption batches used, from its loader
// state (data::SpanCorruptionIdsOf); T5's (the defaults) when the state does
// not say.
HfT5Ids HfT5IdsOfLoaderState(const std::string& loader_state);

// Weights to start from (nn::InitFromSources), with their configuration.
struct PretrainedSources {
  T5Config config;
  nn::NamedInitSources sources;  // ParameterShapes(config) names
  std::string source;            // "Hugging Face T5 DIR", "checkpoint DIR (step N)"
  std::string loader_state;      // a checkpoint's data loader state; "" for Hugging Face's
  // The SentencePiece model the weights' ids are pieces of, as
  // ReadSentencePieceModel takes it ("sentencepiece:<file>"): the one a
  // checkpoint records (//models/t5:train records its .bin data's), a Hugging
  // Face folder's spiece.model; "" for none (data of bytes or another
  // tokenizer, a folder without one).
  std::string tokenizer;
  // The special ids the weights were trained with: config.json's
  // eos_token_id (null: -1), pad_token_id and decoder_start_token_id, T5's
  // (HfT5Ids' defaults) where it has none, null or not an integer; a
  // checkpoint's span corruption ids, the defaults when its loader state does
  // not say. Not checked against the vocabulary (their user does).
  HfT5Ids ids;
};

// The folder's configuration and a source per parameter: headers read and
// checked, no weights. InvalidArgument naming the file and key or tensor for
// a configuration as above, a missing or misshapen tensor, or another one.
absl::StatusOr<PretrainedSources> OpenHfT5(const std::string& dir);

// `path`: a Hugging Face T5 folder (config.json), or a checkpoint of
// //models/t5:train of either kind (a step folder, or a --checkpoint_dir: its
// latest step) with the configuration it records; every kind read slice by
// slice. OpenHfT5's errors, the checkpoint readers', and InvalidArgument for
// a checkpoint that is not T5's.
absl::StatusOr<PretrainedSources> OpenPretrained(const std::string& path);

// A checkpoint's rows are the ids of the data it was trained on and the
// sentinels right above them (its loader state says which): InvalidArgument
// when this run's data has another vocabulary (`source_vocab` ids) or
// another number of sentinels, whose ids would each land on a row that meant
// another token (a model of larger rows, as Hugging Face's padded ones, is
// still fine for the same data). OK for a Hugging Face folder, whose rows
// follow its tokenizer, and for a state that does not say.
absl::Status CheckSameVocabulary(const PretrainedSources& init, int64_t source_vocab,
                                 int64_t sentinels);

// Writes `weights` (ours: the names and shapes of ParameterShapes(config)) to
// `dir` (created if missing) as config.json + model.safetensors that
// T5ForConditionalGeneration.from_pretrained loads, one weight read and
// written at a time.
absl::Status WriteHfT5(const std::string& dir, const T5Config& config,
                       const nn::NamedInitSources& weights, const HfT5Ids& ids = {});

}  // namespace t5

#endif  // MODELS_T5_PRETRAINED_H_
