// T5 presets, validation and parameter counting from shapes.
#include "models/t5/config.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace t5 {
namespace {

struct PresetRow {
  const char* name;
  int64_t num_layers, d_model, d_ff, num_heads, d_kv;
};

// t5-tiny: //models/t5:train's default, small enough to train on the shipped
// text in about a minute on a few CPU cores. The others: Raffel et al. 2020,
// table 14 / the Hugging Face configs (decoder depth = encoder depth).
constexpr PresetRow kPresets[] = {
    {"t5-tiny", 2, 128, 512, 4, 32},       {"t5-small", 6, 512, 2048, 8, 64},
    {"t5-base", 12, 768, 3072, 12, 64},    {"t5-large", 24, 1024, 4096, 16, 64},
    {"t5-3b", 24, 1024, 16384, 32, 128},   {"t5-11b", 24, 1024, 65536, 128, 128},
};

absl::Status Invalid(const T5Config& c, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("t5 config ", c.ToString(), ": ", what));
}

// One block's parameters, relative bias excluded.
int64_t BlockParams(const T5Config& c, bool decoder) {
  const int64_t d = c.d_model, inner = c.inner_dim();
  const int64_t attention = 4 * d * inner;               // q, k, v, o
  const int64_t ffn = (c.gated() ? 3 : 2) * d * c.d_ff;  // wi (wi_0, wi_1), wo
  const int64_t norms = (decoder ? 3 : 2) * d;           // one per sub-layer
  return (decoder ? 2 : 1) * attention + ffn + norms;
}

void AppendBlock(const T5Config& c, const std::string& stack, int64_t l, bool decoder,
                 std::vector<ParamShape>* out) {
  const int64_t d = c.d_model, inner = c.inner_dim();
  const std::string b = absl::StrCat(stack, ".block.", l, ".layer.");
  auto attention = [&](const std::string& p, bool relative_bias) {
    out->push_back({p + "q.weight", {inner, d}});
    out->push_back({p + "k.weight", {inner, d}});
    out->push_back({p + "v.weight", {inner, d}});
    out->push_back({p + "o.weight", {d, inner}});
    if (relative_bias) {
      out->push_back(
          {p + "relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads}});
    }
  };
  attention(b + "0.SelfAttention.", /*relative_bias=*/l == 0);
  out->push_back({b + "0.layer_norm.weight", {d}});
  if (decoder) {
    attention(b + "1.EncDecAttention.", /*relative_bias=*/false);
    out->push_back({b + "1.layer_norm.weight", {d}});
  }
  const std::string ff = absl::StrCat(b, decoder ? 2 : 1, ".");
  if (c.gated()) {
    out->push_back({ff + "DenseReluDense.wi_0.weight", {c.d_ff, d}});
    out->push_back({ff + "DenseReluDense.wi_1.weight", {c.d_ff, d}});
  } else {
    out->push_back({ff + "DenseReluDense.wi.weight", {c.d_ff, d}});
  }
  out->push_back({ff + "DenseReluDense.wo.weight", {d, c.d_ff}});
  out->push_back({ff + "layer_norm.weight", {d}});
}

}  // namespace

absl::Status T5Config::Validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", vocab_size},
      {"d_model", d_model},
      {"d_kv", d_kv},
      {"d_ff", d_ff},
      {"num_layers", num_layers},
      {"num_decoder_layers", num_decoder_layers},
      {"num_heads", num_heads},
  };
  for (const auto& [field, value] : sizes) {
    if (value <= 0) return Invalid(*this, absl::StrCat(field, " must be positive, got ", value));
  }
  if (relative_attention_num_buckets < 4 || relative_attention_num_buckets % 2 != 0) {
    return Invalid(*this, absl::StrCat("relative_attention_num_buckets must be even and >= 4 "
                                       "(half per direction in the encoder, one exact bucket "
                                       "at least); got ",
                                       relative_attention_num_buckets));
  }
  if (relative_attention_max_distance <= relative_attention_num_buckets / 2) {
    return Invalid(*this,
                   absl::StrCat("relative_attention_max_distance ", relative_attention_max_distance,
                                " must exceed the exact range num_buckets / 2 = ",
                                relative_attention_num_buckets / 2));
  }
  if (!(dropout_rate >= 0.0f && dropout_rate < 1.0f)) {
    return Invalid(*this, absl::StrCat("dropout_rate must be in [0, 1), got ", dropout_rate));
  }
  if (!(layer_norm_epsilon > 0.0f && std::isfinite(layer_norm_epsilon))) {
    return Invalid(*this,
                   absl::StrCat("layer_norm_epsilon must be positive, got ", layer_norm_epsilon));
  }
  if (!(initializer_factor > 0.0f && std::isfinite(initializer_factor))) {
    return Invalid(*this,
                   absl::StrCat("initializer_factor must be positive, got ", initializer_factor));
  }
  return absl::OkStatus();
}

std::string T5Config::ToString() const {
  return absl::StrCat(name.empty() ? "custom" : name, "(vocab_size=", vocab_size,
                      ", d_model=", d_model, ", d_kv=", d_kv, ", d_ff=", d_ff,
                      ", num_layers=", num_layers, ", num_decoder_layers=", num_decoder_layers,
                      ", num_heads=", num_heads, ", buckets=", relative_attention_num_buckets,
                      ", max_distance=", relative_attention_max_distance,
                      ", dropout_rate=", dropout_rate,
                      ", feed_forward_proj=", gated() ? "gated-gelu" : "relu",
                      ", tie_word_embeddings=", tie_word_embeddings ? "true" : "false",
                      // Written only when not the default (every public T5's), so
                      // that earlier checkpoints' strings stay as they were.
                      layer_norm_epsilon != T5Config().layer_norm_epsilon
                          ? absl::StrCat(", layer_norm_epsilon=", layer_norm_epsilon)
                          : "",
                      ")");
}

absl::StatusOr<T5Config> ParseConfig(absl::string_view text) {
  auto error = [text](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("t5 config '", text, "': ", why));
  };
  const size_t open = text.find('(');
  if (open == absl::string_view::npos || open == 0 || text.back() != ')') {
    return error("expected name(vocab_size=..., d_model=..., ...), as T5Config::ToString writes");
  }
  T5Config c;
  c.name = std::string(text.substr(0, open));
  if (c.name == "custom") c.name.clear();
  struct IntField {
    absl::string_view key;
    int64_t* value;
  };
  const IntField ints[] = {{"vocab_size", &c.vocab_size},
                           {"d_model", &c.d_model},
                           {"d_kv", &c.d_kv},
                           {"d_ff", &c.d_ff},
                           {"num_layers", &c.num_layers},
                           {"num_decoder_layers", &c.num_decoder_layers},
                           {"num_heads", &c.num_heads},
                           {"buckets", &c.relative_attention_num_buckets},
                           {"max_distance", &c.relative_attention_max_distance}};
  std::set<std::string> seen;
  const absl::string_view fields = text.substr(open + 1, text.size() - open - 2);
  for (absl::string_view field : absl::StrSplit(fields, ", ")) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    if (!seen.insert(std::string(kv.first)).second) {
      return error(absl::StrCat("field '", kv.first, "' given twice"));
    }
    bool known = false, parsed = false;
    for (const IntField& f : ints) {
      if (kv.first == f.key) {
        known = true;
        parsed = absl::SimpleAtoi(kv.second, f.value);
      }
    }
    if (kv.first == "dropout_rate") {
      known = true;
      parsed = absl::SimpleAtof(kv.second, &c.dropout_rate);
    } else if (kv.first == "feed_forward_proj") {
      known = true;
      parsed = kv.second == "relu" || kv.second == "gated-gelu";
      c.feed_forward_proj =
          kv.second == "gated-gelu" ? FeedForwardProj::kGatedGelu : FeedForwardProj::kRelu;
    } else if (kv.first == "tie_word_embeddings") {
      known = true;
      parsed = kv.second == "true" || kv.second == "false";
      c.tie_word_embeddings = kv.second == "true";
    } else if (kv.first == "layer_norm_epsilon") {  // optional: 1e-6 when absent
      known = true;
      parsed = absl::SimpleAtof(kv.second, &c.layer_norm_epsilon);
    }
    if (!known) return error(absl::StrCat("unknown field '", kv.first, "'"));
    if (!parsed) return error(absl::StrCat(kv.first, " '", kv.second, "' is not valid"));
  }
  for (const IntField& f : ints) {
    if (seen.count(std::string(f.key)) == 0) return error(absl::StrCat("no ", f.key));
  }
  for (absl::string_view key : {"dropout_rate", "feed_forward_proj", "tie_word_embeddings"}) {
    if (seen.count(std::string(key)) == 0) return error(absl::StrCat("no ", key));
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) return valid;
  return c;
}

absl::StatusOr<T5Config> Preset(absl::string_view name) {
  for (const PresetRow& row : kPresets) {
    if (name == row.name) {
      T5Config c;
      c.name = row.name;
      c.num_layers = row.num_layers;
      c.num_decoder_layers = row.num_layers;
      c.d_model = row.d_model;
      c.d_ff = row.d_ff;
      c.num_heads = row.num_heads;
      c.d_kv = row.d_kv;
      return c;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown t5 preset '", name, "'; known: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const PresetRow& row : kPresets) names.push_back(row.name);
  return names;
}

T5Config AsV1_1(T5Config config) {
  config.feed_forward_proj = FeedForwardProj::kGatedGelu;
  config.tie_word_embeddings = false;
  return config;
}

int64_t ParamShape::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamShape> ParameterShapes(const T5Config& c) {
  std::vector<ParamShape> out = {{"shared.weight", {c.vocab_size, c.d_model}}};
  for (int64_t l = 0; l < c.num_layers; ++l) AppendBlock(c, "encoder", l, false, &out);
  out.push_back({"encoder.final_layer_norm.weight", {c.d_model}});
  for (int64_t l = 0; l < c.num_decoder_layers; ++l) AppendBlock(c, "decoder", l, true, &out);
  out.push_back({"decoder.final_layer_norm.weight", {c.d_model}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.d_model}});
  return out;
}

ParamCount CountParameters(const T5Config& c) {
  ParamCount n;
  n.shared = c.vocab_size * c.d_model;
  n.lm_head = c.tie_word_embeddings ? 0 : c.vocab_size * c.d_model;
  n.per_encoder_block = BlockParams(c, /*decoder=*/false);
  n.per_decoder_block = BlockParams(c, /*decoder=*/true);
  n.relative_bias = c.relative_attention_num_buckets * c.num_heads;
  n.encoder = c.num_layers * n.per_encoder_block + n.relative_bias + c.d_model;
  n.decoder = c.num_decoder_layers * n.per_decoder_block + n.relative_bias + c.d_model;
  n.total = n.shared + n.encoder + n.decoder + n.lm_head;
  n.non_embedding = n.total - n.shared - n.lm_head;
  return n;
}

double FlopsPerExample(const T5Config& c, int64_t encoder_length, int64_t decoder_length) {
  const double S = static_cast<double>(encoder_length);
  const double T = static_cast<double>(decoder_length);
  const double d = static_cast<double>(c.d_model);
  const double i = static_cast<double>(c.inner_dim());
  const double ff = (c.gated() ? 3.0 : 2.0) * d * static_cast<double>(c.d_ff);
  const double enc_layers = static_cast<double>(c.num_layers);
  const double dec_layers = static_cast<double>(c.num_decoder_layers);
  const double projections = 2 * S * enc_layers * (4 * d * i + ff) +
                             2 * T * dec_layers * (6 * d * i + ff) + 2 * S * dec_layers * 2 * d * i;
  const double attention = 4 * i * (enc_layers * S * S + dec_layers * T * (T + S));
  const double lm_head = 2 * T * d * static_cast<double>(c.vocab_size);
  return 3 * (projections + attention + lm_head);
}

}  // namespace t5
