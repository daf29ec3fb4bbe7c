// T5 weights from a Hugging Face folder (pretrained.h).
#include "models/t5/pretrained.h"

#include <sys/stat.h>

#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/common/checkpoint_convert.h"
#include "models/common/hf_folder.h"
#include "models/data/span_corruption.h"
#include "tensor/durable_file.h"

namespace t5 {
namespace {

using tensor::Json;

// shared.weight under the names Hugging Face also saves it as.
constexpr const char* kSharedAliases[] = {"encoder.embed_tokens.weight",
                                          "decoder.embed_tokens.weight"};

}  // namespace

absl::StatusOr<T5Config> ConfigFromHf(const Json& json, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (const Json* type = json.Get("model_type");
      type != nullptr && !(type->kind == Json::Kind::kString && type->text == "t5")) {
    return bad(absl::StrCat("model_type is '", type->text, "', not 't5'"));
  }
  T5Config c;
  c.name = "hf-t5";
  for (auto [key, field] : {std::pair{"vocab_size", &c.vocab_size},
                            {"d_model", &c.d_model},
                            {"d_kv", &c.d_kv},
                            {"d_ff", &c.d_ff},
                            {"num_layers", &c.num_layers},
                            {"num_heads", &c.num_heads}}) {
    absl::StatusOr<int64_t> v = train::HfConfigInt(json, path, key);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  // Optional integers and their defaults (num_decoder_layers: num_layers, also when null).
  const int64_t default_buckets = 32, default_distance = 128;
  struct Optional {
    const char* key;
    int64_t* field;
    const int64_t* fallback;
  };
  for (const Optional& o : {Optional{"num_decoder_layers", &c.num_decoder_layers, &c.num_layers},
                            Optional{"relative_attention_num_buckets",
                                     &c.relative_attention_num_buckets, &default_buckets},
                            Optional{"relative_attention_max_distance",
                                     &c.relative_attention_max_distance, &default_distance}}) {
    const Json* v = json.Get(o.key);
    absl::StatusOr<int64_t> n = v != nullptr && v->kind == Json::Kind::kNull
                                    ? *o.fallback
                                    : train::HfConfigInt(json, path, o.key, o.fallback);
    if (!n.ok()) return n.status();
    *o.field = *n;
  }
  for (auto [key, field] : {std::pair{"dropout_rate", &c.dropout_rate},
                            {"layer_norm_epsilon", &c.layer_norm_epsilon},
                            {"initializer_factor", &c.initializer_factor}}) {
    const Json* v = json.Get(key);
    if (v == nullptr) continue;  // the default
    double d = 0;
    if (v->kind != Json::Kind::kNumber || !absl::SimpleAtod(v->text, &d)) {
      return bad(absl::StrCat("'", key, "' is not a number (", v->text, ")"));
    }
    *field = static_cast<float>(d);
  }
  if (const Json* ff = json.Get("feed_forward_proj"); ff != nullptr) {
    if (ff->text == "relu") {
      c.feed_forward_proj = FeedForwardProj::kRelu;
    } else if (ff->text == "gated-gelu") {
      c.feed_forward_proj = FeedForwardProj::kGatedGelu;
    } else {
      return bad(absl::StrCat("feed_forward_proj '", ff->text,
                              "' is not one T5 computes here: relu (v1.0) or gated-gelu (v1.1)"));
    }
  }
  if (const Json* act = json.Get("dense_act_fn"); act != nullptr) {
    const char* want = c.gated() ? "gelu_new" : "relu";
    if (act->text != want) {
      return bad(absl::StrCat("dense_act_fn '", act->text, "' is not ", want,
                              ", the activation of feed_forward_proj ",
                              c.gated() ? "gated-gelu" : "relu"));
    }
  }
  if (const Json* tie = json.Get("tie_word_embeddings"); tie != nullptr) {
    if (tie->kind != Json::Kind::kBool) {
      return bad(absl::StrCat("'tie_word_embeddings' is not true or false (", tie->text, ")"));
    }
    c.tie_word_embeddings = tie->text == "true";
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return bad(std::string(valid.message()));
  return c;
}

absl::StatusOr<PretrainedSources> OpenHfT5(const std::string& dir) {
  absl::StatusOr<Json> json = train::ReadHfConfig(dir);
  if (!json.ok()) return json.status();
  absl::StatusOr<T5Config> config = ConfigFromHf(*json, dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::map<std::string, train::HfTensor>> tensors = train::OpenHfTensors(dir);
  if (!tensors.ok()) return tensors.status();
  std::set<std::string> used;
  for (const char* alias : kSharedAliases) used.insert(alias);
  if (config->tie_word_embeddings) used.insert("lm_head.weight");
  PretrainedSources out;
  out.config = *config;
  out.source = absl::StrCat("Hugging Face T5 ", dir);
  // Its SentencePiece model, when the folder holds one (t5-small's does).
  struct stat st {};
  if (::stat((dir + "/spiece.model").c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    out.tokenizer = "sentencepiece:" + dir + "/spiece.model";
  }
  for (auto [key, field] : {std::pair{"eos_token_id", &out.ids.eos_id},
                            {"pad_token_id", &out.ids.pad_id},
                            {"decoder_start_token_id", &out.ids.decoder_start_id}}) {
    // Training reads none of them: one that is not an integer (a list of
    // eos ids, say) leaves T5's, and the range is their user's to check.
    const Json* v = json->Get(key);
    if (v == nullptr) continue;  // T5's
    if (v->kind == Json::Kind::kNull) {
      if (field == &out.ids.eos_id) *field = -1;  // rows that end without one
      continue;
    }
    absl::StatusOr<int64_t> id = train::HfConfigInt(*json, dir + "/config.json", key);
    if (id.ok()) *field = *id;
  }
  for (const ParamShape& p : ParameterShapes(*config)) {
    std::string name = p.name;
    if (name == "shared.weight" && tensors->count(name) == 0) {
      for (const char* alias : kSharedAliases) {
        if (tensors->count(alias) != 0) {
          name = alias;
          break;
        }
      }
    }
    auto it = tensors->find(name);
    if (it == tensors->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": no tensor '", p.name, "'",
                       p.name == "shared.weight" ? " (nor encoder.embed_tokens.weight)" : "",
                       " in the weights"));
    }
    used.insert(name);
    absl::StatusOr<std::shared_ptr<const nn::InitSource>> source =
        train::HfTensorSource(dir, name, it->second, tensor::Shape(p.shape));
    if (!source.ok()) return source.status();
    out.sources.emplace_back(p.name, *std::move(source));
  }
  absl::Status others = train::CheckNoOtherHfTensors(dir, *tensors, used, "T5");
  if (!others.ok()) return others;
  return out;
}

HfT5Ids HfT5IdsOfLoaderState(const std::string& loader_state) {
  absl::StatusOr<data::SpanCorruptionIds> used = data::SpanCorruptionIdsOf(loader_state);
  if (!used.ok()) return HfT5Ids{};
  return HfT5Ids{used->eos_id, used->pad_id, used->decoder_start_id};
}

absl::StatusOr<PretrainedSources> OpenPretrained(const std::string& path) {
  if (train::IsHfModelDir(path)) return OpenHfT5(path);
  absl::StatusOr<train::RecordedCheckpoint> recorded = train::ReadRecordedCheckpoint(path);
  if (!recorded.ok()) return recorded.status();
  absl::StatusOr<T5Config> config = ParseConfig(recorded->config);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a T5 checkpoint: ", config.status().message()));
  }
  absl::StatusOr<nn::NamedInitSources> sources = train::OpenCheckpointModel(recorded->step_dir);
  if (!sources.ok()) return sources.status();
  PretrainedSources out{*config, *std::move(sources), recorded->description,
                        recorded->loader_state};
  out.ids = HfT5IdsOfLoaderState(out.loader_state);
  // A SentencePiece model's record (data of GPT-2's BPE, or bytes: none).
  if (absl::StartsWith(recorded->tokenizer, "sentencepiece:")) out.tokenizer = recorded->tokenizer;
  return out;
}

absl::Status CheckSameVocabulary(const PretrainedSources& init, int64_t source_vocab,
                                 int64_t sentinels) {
  if (init.loader_state.empty()) return absl::OkStatus();
  absl::StatusOr<data::SpanCorruptionVocab> theirs =
      data::SpanCorruptionVocabOf(init.loader_state);
  if (!theirs.ok()) return absl::OkStatus();
  if (theirs->source_vocab == source_vocab && theirs->sentinels == sentinels) {
    return absl::OkStatus();
  }
  auto ids = [](int64_t vocab, int64_t n) {
    return absl::StrCat(vocab, " ids and ", n, " sentinels (ids ", vocab, "..", vocab + n - 1,
                        ")");
  };
  return absl::InvalidArgumentError(absl::StrCat(
      "the weights were trained on data of ", ids(theirs->source_vocab, theirs->sentinels),
      ", but this run's data has ", ids(source_vocab, sentinels),
      ": each id would land on a row that meant another token. Give --data encoded as the "
      "weights' run's was (--vocab_size for a .bin file) and --num_sentinels=",
      theirs->sentinels));
}

absl::Status WriteHfT5(const std::string& dir, const T5Config& config,
                       const nn::NamedInitSources& weights, const HfT5Ids& ids) {
  std::vector<train::HfWeightOut> layout;
  for (const ParamShape& p : ParameterShapes(config)) {
    layout.push_back({p.name, tensor::Shape(p.shape)});
  }
  absl::Status s = train::WriteHfWeights(dir, weights, layout, config.ToString());
  if (!s.ok()) return s;
  // Hugging Face's T5Config fields; the special ids as `ids` says.
  const std::string json = absl::StrFormat(
      R"({
  "architectures": ["T5ForConditionalGeneration"],
  "model_type": "t5",
  "vocab_size": %d,
  "d_model": %d,
  "d_kv": %d,
  "d_ff": %d,
  "num_layers": %d,
  "num_decoder_layers": %d,
  "num_heads": %d,
  "relative_attention_num_buckets": %d,
  "relative_attention_max_distance": %d,
  "dropout_rate": %.9g,
  "layer_norm_epsilon": %.9g,
  "initializer_factor": %.9g,
  "feed_forward_proj": "%s",
  "dense_act_fn": "%s",
  "is_gated_act": %s,
  "tie_word_embeddings": %s,
  "is_encoder_decoder": true,
  "decoder_start_token_id": %d,
  "pad_token_id": %d,
  "eos_token_id": %s,
  "torch_dtype": "float32"
}
)",
      config.vocab_size, config.d_model, config.d_kv, config.d_ff, config.num_layers,
      config.num_decoder_layers, config.num_heads, config.relative_attention_num_buckets,
      config.relative_attention_max_distance, config.dropout_rate, config.layer_norm_epsilon,
      config.initializer_factor, config.gated() ? "gated-gelu" : "relu",
      config.gated() ? "gelu_new" : "relu", config.gated() ? "true" : "false",
      config.tie_word_embeddings ? "true" : "false", ids.decoder_start_id, ids.pad_id,
      ids.eos_id >= 0 ? absl::StrCat(ids.eos_id) : "null");
  return tensor::WriteFileDurably(dir + "/config.json", json);
}

}  // namespace t5
