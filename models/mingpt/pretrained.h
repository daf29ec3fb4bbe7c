// minGPT weights from disk, with the configuration that fits them: a
// checkpoint of a train binary, or a Hugging Face GPT-2 model folder (nanoGPT's
// init_from='gpt2'); and the export of minGPT weights as a Hugging Face GPT-2
// folder that transformers' GPT2LMHeadModel.from_pretrained loads.
//
// Hugging Face GPT-2 against ours (the same model: minGPT is GPT-2):
//   - names: ours are GPT2LMHeadModel's ("transformer.h.0.attn.c_attn.weight",
//     "lm_head.weight"); GPT2Model files (the hub's gpt2 .. gpt2-xl) lack the
//     "transformer." prefix. Both are read.
//   - layout: HF's Conv1D stores attn.c_attn, attn.c_proj, mlp.c_fc and
//     mlp.c_proj weights as (in, out); our Linear as (out, in): transposed.
//   - lm_head: tied to wte in HF (often absent from the file); minGPT's is its
//     own parameter, so reading copies wte, and writing keeps lm_head
//     ("tie_word_embeddings": false unless it equals wte).
//   - attn.bias / attn.masked_bias (the causal mask as a buffer, in older
//     files) are skipped.
//   - config.json: n_layer, n_head, n_embd, vocab_size, n_positions (our
//     block_size); activation gelu_new (our tanh GELU), layer_norm_epsilon 1e-5,
//     no n_inner other than 4 n_embd: anything else is refused, naming the key.
// Weights may be f32, f16 or bf16 in the file, in one model.safetensors or
// sharded (model.safetensors.index.json); they are read as f32.
#ifndef MODELS_MINGPT_PRETRAINED_H_
#define MODELS_MINGPT_PRETRAINED_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/mingpt/config.h"
#include "nn/state_dict.h"
#include "tensor/safetensors.h"

namespace mingpt {

struct PretrainedWeights {
  GptConfig config;              // dropout: the recorded one, or 0 for HF
  tensor::NamedTensors weights;  // ParameterShapes(config) order, f32, on the host
  std::string source;            // "checkpoint DIR (step N)", "Hugging Face GPT-2 DIR"
  // The tokenizer that goes with them ("" if none is known): a checkpoint's
  // record (train's --tokenizer: "gpt2" or a folder), or a Hugging Face
  // folder itself when it holds vocab.json + merges.txt (its absolute path).
  std::string tokenizer;
};

// A Hugging Face GPT-2 folder: config.json and model.safetensors (or
// model.safetensors.index.json and its shards). InvalidArgument naming the
// file and key for anything that is not GPT-2 as above, a missing or
// misshapen tensor, or an unknown one.
absl::StatusOr<PretrainedWeights> ReadHfGpt2(const std::string& dir);

// What --init_from initializes a model from: the configuration and a source
// per parameter (nn::InitFromSources), in ParameterShapes(config) order.
struct PretrainedSources {
  GptConfig config;
  nn::NamedInitSources sources;  // ParameterShapes(config) names
  std::string source;            // as PretrainedWeights::source
  std::string tokenizer;         // as PretrainedWeights::tokenizer
  bool hugging_face = false;     // from a Hugging Face folder (OpenHfGpt2), not a checkpoint
};

// A Hugging Face GPT-2 folder as sources read slice by slice: the headers are
// read and checked here (and the checksum, in files that carry ours), no
// weights. Conv1D weights are read transposed (nn::TransposedInitSource); a
// file without lm_head gives wte's source for it. So an FSDP rank reads only
// its shard.
// The same errors as ReadHfGpt2.
absl::StatusOr<PretrainedSources> OpenHfGpt2(const std::string& dir);

// `path`: a Hugging Face GPT-2 folder, or a checkpoint of a train binary of
// either kind (a step folder, or a --checkpoint_dir: its latest step), read
// whole (train::ReadCheckpointModel) with its recorded config.
absl::StatusOr<PretrainedWeights> ReadPretrained(const std::string& path);

// `path` as OpenHfGpt2 or train::OpenCheckpointModel open it (every kind slice
// by slice), with its configuration.
// The same errors as ReadPretrained.
absl::StatusOr<PretrainedSources> OpenPretrained(const std::string& path);

// Writes `weights` (ours: names and shapes of ParameterShapes(config)) to
// `dir` (created if missing) as config.json + model.safetensors in
// GPT2LMHeadModel's names and layout. config.json's bos_token_id and
// eos_token_id are `end_of_text`: the id of the model's tokenizer's
// "<|endoftext|>" (data::Gpt2Tokenizer::end_of_text(): 50256 for GPT-2's,
// whatever the vocabulary's padding), null when there is none (a byte-level
// model, no tokenizer known).
absl::Status WriteHfGpt2(const std::string& dir, const GptConfig& config,
                         const tensor::NamedTensors& weights,
                         std::optional<int64_t> end_of_text = std::nullopt);
// The same from sources (OpenPretrained's), read and written one weight at a
// time: the host holds one weight (and wte, kept to find whether lm_head is
// tied to it), not the model. DataLoss naming the weight when a read fails.
absl::Status WriteHfGpt2(const std::string& dir, const GptConfig& config,
                         const nn::NamedInitSources& weights,
                         std::optional<int64_t> end_of_text = std::nullopt);

}  // namespace mingpt

#endif  // MODELS_MINGPT_PRETRAINED_H_
