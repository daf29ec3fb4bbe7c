// minGPT presets and parameter counting from shapes.
#include "models/mingpt/config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mingpt {
namespace {

struct PresetRow {
  const char* name;
  int64_t n_layer, n_head, n_embd, block_size;
};

// minGPT's model_type table, GPT-2 sizes, and the FSDP paper's two giants.
constexpr PresetRow kPresets[] = {
    {"gpt-nano", 3, 3, 48, 128},       {"gpt-micro", 4, 4, 128, 128},
    {"gpt-mini", 6, 6, 192, 128},      {"gopher-44m", 8, 16, 512, 128},
    {"gpt2", 12, 12, 768, 1024},       {"gpt2-medium", 24, 16, 1024, 1024},
    {"gpt2-large", 36, 20, 1280, 1024}, {"gpt2-xl", 48, 25, 1600, 1024},
    {"gpt-175b", 96, 96, 12288, 2048}, {"gpt-1t", 128, 160, 25600, 2048},
};

}  // namespace

absl::Status GptConfig::Validate() const {
  if (n_layer <= 0 || n_head <= 0 || n_embd <= 0 || vocab_size <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt config ", ToString(), ": every size must be positive"));
  }
  if (n_embd % n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpt config ", ToString(), ": n_embd ", n_embd,
                                                   " is not divisible by n_head ", n_head));
  }
  if (!(dropout >= 0.0f && dropout < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt config ", ToString(), ": dropout must be in [0, 1)"));
  }
  return absl::OkStatus();
}

std::string GptConfig::ToString() const {
  return absl::StrCat(name.empty() ? "custom" : name, "(n_layer=", n_layer, ", n_head=", n_head,
                      ", n_embd=", n_embd, ", vocab_size=", vocab_size,
                      ", block_size=", block_size, ", dropout=", dropout, ")");
}

absl::StatusOr<GptConfig> ParseConfig(absl::string_view text) {
  auto error = [text](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("gpt config '", text, "': ", why));
  };
  const size_t open = text.find('(');
  if (open == absl::string_view::npos || open == 0 || text.back() != ')') {
    return error(
        "expected name(n_layer=..., n_head=..., n_embd=..., vocab_size=..., "
        "block_size=..., dropout=...)");
  }
  GptConfig c;
  c.name = std::string(text.substr(0, open));
  if (c.name == "custom") c.name.clear();
  int64_t* const ints[] = {&c.n_layer, &c.n_head, &c.n_embd, &c.vocab_size, &c.block_size};
  const absl::string_view int_names[] = {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"};
  bool seen[6] = {};
  const absl::string_view fields = text.substr(open + 1, text.size() - open - 2);
  for (absl::string_view field : absl::StrSplit(fields, ", ")) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    int index = -1;
    for (int i = 0; i < 5; ++i) {
      if (kv.first == int_names[i]) index = i;
    }
    if (kv.first == "dropout") index = 5;
    if (index < 0) return error(absl::StrCat("unknown field '", kv.first, "'"));
    if (seen[index]) return error(absl::StrCat("field '", kv.first, "' given twice"));
    seen[index] = true;
    const bool parsed = index < 5 ? absl::SimpleAtoi(kv.second, ints[index])
                                  : absl::SimpleAtof(kv.second, &c.dropout);
    if (!parsed) return error(absl::StrCat(kv.first, " '", kv.second, "' is not a number"));
  }
  for (int i = 0; i < 6; ++i) {
    if (!seen[i]) return error(absl::StrCat("no ", i < 5 ? int_names[i] : "dropout"));
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return valid;
  return c;
}

absl::StatusOr<GptConfig> Preset(absl::string_view name) {
  for (const PresetRow& row : kPresets) {
    if (name == row.name) {
      GptConfig c;
      c.name = row.name;
      c.n_layer = row.n_layer;
      c.n_head = row.n_head;
      c.n_embd = row.n_embd;
      c.block_size = row.block_size;
      return c;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown gpt preset '", name,
                                                 "'; known: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const PresetRow& row : kPresets) names.push_back(row.name);
  return names;
}

int64_t ParamShape::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamShape> ParameterShapes(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<ParamShape> out = {
      {"transformer.wte.weight", {c.vocab_size, C}},
      {"transformer.wpe.weight", {c.block_size, C}},
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = absl::StrCat("transformer.h.", l, ".");
    out.push_back({h + "ln_1.weight", {C}});
    out.push_back({h + "ln_1.bias", {C}});
    out.push_back({h + "attn.c_attn.weight", {3 * C, C}});
    out.push_back({h + "attn.c_attn.bias", {3 * C}});
    out.push_back({h + "attn.c_proj.weight", {C, C}});
    out.push_back({h + "attn.c_proj.bias", {C}});
    out.push_back({h + "ln_2.weight", {C}});
    out.push_back({h + "ln_2.bias", {C}});
    out.push_back({h + "mlp.c_fc.weight", {4 * C, C}});
    out.push_back({h + "mlp.c_fc.bias", {4 * C}});
    out.push_back({h + "mlp.c_proj.weight", {C, 4 * C}});
    out.push_back({h + "mlp.c_proj.bias", {C}});
  }
  out.push_back({"transformer.ln_f.weight", {C}});
  out.push_back({"transformer.ln_f.bias", {C}});
  out.push_back({"lm_head.weight", {c.vocab_size, C}});
  return out;
}

ParamCount CountParameters(const GptConfig& c) {
  const int64_t C = c.n_embd;
  ParamCount n;
  n.per_block = 12 * C * C + 13 * C;
  n.embeddings = (c.vocab_size + c.block_size) * C;
  n.lm_head = c.vocab_size * C;
  n.total = n.embeddings + c.n_layer * n.per_block + 2 * C + n.lm_head;
  n.non_embedding = n.total - n.embeddings;
  return n;
}

double FlopsPerToken(const GptConfig& c, int64_t seq_len) {
  return 6.0 * static_cast<double>(CountParameters(c).non_embedding) +
         12.0 * static_cast<double>(c.n_layer * c.n_embd * seq_len);
}

}  // namespace mingpt
