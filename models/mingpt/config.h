// minGPT configurations: the presets of Karpathy's minGPT plus GPT-2 sizes and
// the two models of the PyTorch FSDP paper's benchmark (GPT 175B, GPT 1T), and
// the parameter counts and memory needs of any configuration, computed from
// the shapes alone (nothing is allocated).
#ifndef MODELS_MINGPT_CONFIG_H_
#define MODELS_MINGPT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mingpt {

struct GptConfig {
  std::string name;
  int64_t n_layer = 3;
  int64_t n_head = 3;
  int64_t n_embd = 48;
  int64_t vocab_size = 50257;
  int64_t block_size = 128;  // longest sequence (positions of wpe)
  float dropout = 0.1f;      // embd, attn and resid dropout, as minGPT

  // n_embd divisible by n_head, every size positive, dropout in [0, 1).
  absl::Status Validate() const;
  std::string ToString() const;
};

// The inverse of GptConfig::ToString ("gpt-mini(n_layer=6, n_head=6, ...)"),
// e.g. a checkpoint's recorded config; InvalidArgument naming the text when a
// field is missing, unknown or not a number, or the config is not valid.
absl::StatusOr<GptConfig> ParseConfig(absl::string_view text);

// Names: gpt-nano, gpt-micro, gpt-mini, gopher-44m, gpt2, gpt2-medium,
// gpt2-large, gpt2-xl, gpt-175b, gpt-1t. vocab_size 50257, block_size 1024 for
// the GPT-2 sizes and larger, 128 for the small ones; both can be overridden.
absl::StatusOr<GptConfig> Preset(absl::string_view name);
std::vector<std::string> PresetNames();

// One parameter tensor of the model: Hugging Face GPT-2 name and shape.
struct ParamShape {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// Every parameter, in the order the model registers them.
std::vector<ParamShape> ParameterShapes(const GptConfig& config);

struct ParamCount {
  int64_t total = 0;             // every parameter, lm_head included
  int64_t per_block = 0;         // one transformer Block
  int64_t embeddings = 0;        // wte + wpe
  int64_t lm_head = 0;
  int64_t non_embedding = 0;     // total - wte - wpe (minGPT prints total - lm_head)
};
ParamCount CountParameters(const GptConfig& config);

// Model FLOPs of one token's forward and backward at sequence length seq_len,
// as nanoGPT's estimate_mfu and llm.c count them: 6 N + 12 n_layer n_embd
// seq_len, N the weights that multiply (CountParameters' non_embedding: the
// blocks, ln_f and lm_head; the embedding tables are lookups). The MFU of the
// train binary's step lines (models/common/mfu.h) and of
// tools/bench_vs_pytorch.py.
double FlopsPerToken(const GptConfig& config, int64_t seq_len);

}  // namespace mingpt

#endif  // MODELS_MINGPT_CONFIG_H_
