// minGPT weights from disk (pretrained.h): a train checkpoint or a Hugging Face
// GPT-2 folder.
#include "models/mingpt/pretrained.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/common/checkpoint_convert.h"
#include "models/common/hf_folder.h"
#include "models/common/train_support.h"
#include "models/data/gpt2_tokenizer.h"
#include "nn/parameter.h"
#include "tensor/durable_file.h"
#include "tensor/json.h"

namespace mingpt {
namespace {

using tensor::Json;
using tensor::Tensor;

constexpr char kPrefix[] = "transformer.";

// HF's Conv1D weights, stored (in, out): ours are Linear (out, in).
bool IsConv1DWeight(const std::string& name) {
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (absl::EndsWith(name, suffix)) return true;
  }
  return false;
}

// config.json's GPT-2 sizes; refuses what our minGPT does not compute.
absl::StatusOr<GptConfig> ConfigFromHf(const Json& json, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (json.kind != Json::Kind::kObject) return bad("not a JSON object");
  if (const Json* type = json.Get("model_type");
      type != nullptr && !(type->kind == Json::Kind::kString && type->text == "gpt2")) {
    return bad(absl::StrCat("model_type is '", type->text, "', not 'gpt2'"));
  }
  GptConfig c;
  c.name = "hf-gpt2";
  c.dropout = 0.0f;
  // Required integers; older files name n_positions n_ctx.
  const char* positions =
      json.Get("n_positions") == nullptr && json.Get("n_ctx") != nullptr ? "n_ctx" : "n_positions";
  for (auto [key, field] : {std::pair{"n_layer", &c.n_layer},
                            {"n_head", &c.n_head},
                            {"n_embd", &c.n_embd},
                            {"vocab_size", &c.vocab_size},
                            {positions, &c.block_size}}) {
    absl::StatusOr<int64_t> v = train::HfConfigInt(json, path, key);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  if (const Json* act = json.Get("activation_function"); act != nullptr) {
    static const std::set<std::string> kTanhGelu = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"};
    if (kTanhGelu.count(act->text) == 0) {
      return bad(absl::StrCat("activation_function '", act->text,
                              "' is not GPT-2's tanh GELU (gelu_new), the one minGPT computes"));
    }
  }
  if (const Json* eps = json.Get("layer_norm_epsilon"); eps != nullptr) {
    double e = 0;
    if (!absl::SimpleAtod(eps->text, &e) || std::abs(e - 1e-5) > 1e-12) {
      return bad(absl::StrCat("layer_norm_epsilon ", eps->text, " is not 1e-5, minGPT's"));
    }
  }
  if (const Json* inner = json.Get("n_inner"); inner != nullptr &&
                                               inner->kind != Json::Kind::kNull &&
                                               inner->text != absl::StrCat(4 * c.n_embd)) {
    return bad(absl::StrCat("n_inner ", inner->text, " is not 4 n_embd (", 4 * c.n_embd, ")"));
  }
  for (auto [key, want] : {std::pair<const char*, const char*>{"scale_attn_weights", "true"},
                           {"scale_attn_by_inverse_layer_idx", "false"},
                           {"add_cross_attention", "false"}}) {
    const Json* v = json.Get(key);
    if (v != nullptr && v->text != want) {
      return bad(absl::StrCat(key, " is ", v->text, "; minGPT computes ", key, " = ", want));
    }
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return bad(std::string(valid.message()));
  // Written by WriteHfGpt2: the preset's name and the dropout come back too.
  if (const Json* ours = json.Get("minGPT_config"); ours != nullptr) {
    absl::StatusOr<GptConfig> recorded = ParseConfig(ours->text);
    if (!recorded.ok()) return bad(absl::StrCat("minGPT_config: ", recorded.status().message()));
    if (recorded->n_layer != c.n_layer || recorded->n_head != c.n_head ||
        recorded->n_embd != c.n_embd || recorded->vocab_size != c.vocab_size ||
        recorded->block_size != c.block_size) {
      return bad(absl::StrCat("minGPT_config ", ours->text, " disagrees with the GPT-2 sizes"));
    }
    return *recorded;
  }
  return c;
}

}  // namespace

absl::StatusOr<PretrainedSources> OpenHfGpt2(const std::string& dir) {
  absl::StatusOr<Json> json = train::ReadHfConfig(dir);
  if (!json.ok()) return json.status();
  absl::StatusOr<GptConfig> config = ConfigFromHf(*json, dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::map<std::string, train::HfTensor>> tensors = train::OpenHfTensors(dir);
  if (!tensors.ok()) return tensors.status();
  // The files' names by ours: GPT2Model files lack the "transformer." prefix;
  // the causal mask (attn.bias, attn.masked_bias: a buffer) is not a weight.
  std::map<std::string, std::string> by_ours;
  std::set<std::string> used;
  for (const auto& [name, t] : *tensors) {
    if (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias")) {
      used.insert(name);
      continue;
    }
    const std::string ours = name == "lm_head.weight" || absl::StartsWith(name, kPrefix)
                                 ? name
                                 : absl::StrCat(kPrefix, name);
    if (!by_ours.emplace(ours, name).second) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensors '", by_ours[ours], "' and '",
                                                     name, "' are both '", ours, "'"));
    }
  }
  PretrainedSources out;
  out.config = *config;
  out.source = absl::StrCat("Hugging Face GPT-2 ", dir);
  out.hugging_face = true;
  if (data::Gpt2Tokenizer::IsTokenizerDir(dir)) {
    out.tokenizer = data::Gpt2Tokenizer::RecordName(dir);
  }
  for (const ParamShape& p : ParameterShapes(*config)) {
    auto it = by_ours.find(p.name);
    if (it == by_ours.end() && p.name == "lm_head.weight")
      it = by_ours.find("transformer.wte.weight");
    if (it == by_ours.end()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": no tensor '",
                                                     p.name.substr(sizeof(kPrefix) - 1), "' (nor '",
                                                     p.name, "') in the weights"));
    }
    used.insert(it->second);
    const bool conv1d = IsConv1DWeight(p.name);
    absl::StatusOr<std::shared_ptr<const nn::InitSource>> source = train::HfTensorSource(
        dir, it->second, tensors->at(it->second),
        conv1d ? tensor::Shape({p.shape[1], p.shape[0]}) : tensor::Shape(p.shape));
    if (!source.ok()) return source.status();
    out.sources.emplace_back(p.name,
                             conv1d ? nn::TransposedInitSource(*std::move(source)) : *source);
  }
  absl::Status others = train::CheckNoOtherHfTensors(dir, *tensors, used, "GPT-2");
  if (!others.ok()) return others;
  return out;
}

absl::StatusOr<PretrainedWeights> ReadHfGpt2(const std::string& dir) {
  absl::StatusOr<PretrainedSources> opened = OpenHfGpt2(dir);
  if (!opened.ok()) return opened.status();
  PretrainedWeights out{opened->config, {}, opened->source, opened->tokenizer};
  try {
    for (const auto& [name, source] : opened->sources) {
      Tensor t = Tensor::Empty(source->shape(), tensor::Dtype::kF32);
      source->Read(0, t);
      out.weights.emplace_back(name, std::move(t));
    }
  } catch (const std::exception& e) {  // the file changed or went away since it was opened
    return absl::DataLossError(absl::StrCat(dir, ": ", e.what()));
  }
  return out;
}

namespace {

// A train binary's checkpoint: its step folder, recorded config and name.
struct CheckpointOrigin {
  std::string step_dir;
  GptConfig config;
  std::string source;
  std::string tokenizer;  // its record, or ""
};

// `path` must be a folder; an HF folder gives nullopt (read it as one).
absl::StatusOr<std::optional<CheckpointOrigin>> CheckpointOf(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    const bool file = std::filesystem::exists(path, ec);
    return absl::InvalidArgumentError(absl::StrCat(
        path, file ? " is a file, not a folder" : ": no such folder",
        " (a checkpoint or a Hugging Face GPT-2 model folder)"));
  }
  if (train::IsHfModelDir(path)) return std::nullopt;
  absl::StatusOr<train::RecordedCheckpoint> recorded = train::ReadRecordedCheckpoint(
      path, absl::StrCat(
                path, " is neither a checkpoint nor a Hugging Face model folder (no config.json)"));
  if (!recorded.ok()) return recorded.status();
  absl::StatusOr<GptConfig> config = ParseConfig(recorded->config);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        recorded->step_dir, " is not a minGPT checkpoint: ", config.status().message()));
  }
  return CheckpointOrigin{recorded->step_dir, *config, recorded->description, recorded->tokenizer};
}

}  // namespace

absl::StatusOr<PretrainedWeights> ReadPretrained(const std::string& path) {
  absl::StatusOr<std::optional<CheckpointOrigin>> origin = CheckpointOf(path);
  if (!origin.ok()) return origin.status();
  if (!origin->has_value()) return ReadHfGpt2(path);
  absl::StatusOr<tensor::NamedTensors> weights = train::ReadCheckpointModel((*origin)->step_dir);
  if (!weights.ok()) return weights.status();
  return PretrainedWeights{(*origin)->config, *std::move(weights), (*origin)->source,
                           (*origin)->tokenizer};
}

absl::StatusOr<PretrainedSources> OpenPretrained(const std::string& path) {
  absl::StatusOr<std::optional<CheckpointOrigin>> origin = CheckpointOf(path);
  if (!origin.ok()) return origin.status();
  if (!origin->has_value()) {
    return OpenHfGpt2(path);
  }
  absl::StatusOr<nn::NamedInitSources> sources = train::OpenCheckpointModel((*origin)->step_dir);
  if (!sources.ok()) return sources.status();
  return PretrainedSources{(*origin)->config, *std::move(sources), (*origin)->source,
                           (*origin)->tokenizer};
}

absl::Status WriteHfGpt2(const std::string& dir, const GptConfig& config,
                         const tensor::NamedTensors& weights, std::optional<int64_t> end_of_text) {
  return WriteHfGpt2(dir, config, nn::TensorInitSources(weights), end_of_text);
}

absl::Status WriteHfGpt2(const std::string& dir, const GptConfig& config,
                         const nn::NamedInitSources& weights, std::optional<int64_t> end_of_text) {
  // ParameterShapes order: Conv1D weights transposed; wte kept until lm_head,
  // the last, is compared with it (tied when equal).
  std::vector<train::HfWeightOut> layout;
  for (const ParamShape& p : ParameterShapes(config)) {
    layout.push_back({p.name, tensor::Shape(p.shape), IsConv1DWeight(p.name)});
  }
  Tensor wte;
  bool tied = false;
  absl::Status s = train::WriteHfWeights(
      dir, weights, layout, config.ToString(), [&](const std::string& name, const Tensor& t) {
        if (name == layout.front().name) wte = t;
        if (name == layout.back().name) {
          tied = t.shape() == wte.shape() &&
                 std::equal(wte.data<float>(), wte.data<float>() + wte.numel(), t.data<float>());
        }
      });
  if (!s.ok()) return s;
  // GPT-2's "<|endoftext|>" is both (50256, not vocab_size - 1: 50303 in a
  // vocabulary padded to 50304); a byte-level model has none.
  const std::string eot = end_of_text.has_value() ? absl::StrCat(*end_of_text) : "null";
  const std::string json = absl::StrFormat(
      R"({
  "architectures": ["GPT2LMHeadModel"],
  "model_type": "gpt2",
  "vocab_size": %d,
  "n_positions": %d,
  "n_embd": %d,
  "n_layer": %d,
  "n_head": %d,
  "n_inner": null,
  "activation_function": "gelu_new",
  "layer_norm_epsilon": 1e-05,
  "resid_pdrop": %.9g,
  "embd_pdrop": %.9g,
  "attn_pdrop": %.9g,
  "initializer_range": 0.02,
  "scale_attn_weights": true,
  "tie_word_embeddings": %s,
  "bos_token_id": %s,
  "eos_token_id": %s,
  "torch_dtype": "float32",
  "minGPT_config": %s
}
)",
      config.vocab_size, config.block_size, config.n_embd, config.n_layer, config.n_head,
      config.dropout, config.dropout, config.dropout, tied ? "true" : "false", eot, eot,
      tensor::JsonQuote(config.ToString()));
  return tensor::WriteFileDurably(dir + "/config.json", json);
}

}  // namespace mingpt
