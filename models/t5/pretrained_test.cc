// Hugging Face T5 folders in and out. The folders read here are written by
// the tests with Hugging Face's config.json keys spelled out literally (the
// hub's t5-small file has only some of them: the others take T5Config's
// defaults) and its weight names (shared.weight also saved as
// encoder/decoder.embed_tokens.weight, a tied model's lm_head.weight too), not
// with WriteHfT5. The parity fixtures (tools/t5_reference.py, Hugging Face's
// computation) written as such folders read back to the reference loss.
#include "models/t5/pretrained.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "models/common/test_files.h"
#include "models/data/runfiles.h"
#include "models/t5/model.h"
#include "nn/state_dict.h"
#include "tensor/json.h"
#include "tensor/safetensors.h"

namespace t5 {
namespace {

using tensor::NamedTensors;
using tensor::Tensor;

using train::testing::FreshTempDir;
using train::testing::WriteFile;

// The hub's t5-small config.json (its model keys; the task parameters left out).
constexpr char kT5SmallConfig[] = R"({
  "architectures": ["T5WithLMHeadModel"],
  "d_ff": 2048,
  "d_kv": 64,
  "d_model": 512,
  "decoder_start_token_id": 0,
  "dropout_rate": 0.1,
  "eos_token_id": 1,
  "initializer_factor": 1.0,
  "is_encoder_decoder": true,
  "layer_norm_epsilon": 1e-06,
  "model_type": "t5",
  "n_positions": 512,
  "num_heads": 8,
  "num_layers": 6,
  "output_past": true,
  "pad_token_id": 0,
  "relative_attention_num_buckets": 32,
  "vocab_size": 32128
})";

// google/t5-v1_1-small's.
constexpr char kT5V11SmallConfig[] = R"({
  "architectures": ["T5ForConditionalGeneration"],
  "d_ff": 1024,
  "d_kv": 64,
  "d_model": 512,
  "decoder_start_token_id": 0,
  "dropout_rate": 0.1,
  "eos_token_id": 1,
  "feed_forward_proj": "gated-gelu",
  "initializer_factor": 1.0,
  "is_encoder_decoder": true,
  "layer_norm_epsilon": 1e-06,
  "model_type": "t5",
  "num_decoder_layers": 8,
  "num_heads": 6,
  "num_layers": 8,
  "output_past": true,
  "pad_token_id": 0,
  "relative_attention_num_buckets": 32,
  "tie_word_embeddings": false,
  "vocab_size": 32128
})";

// Hugging Face's config.json keys for `c`, every field written out.
std::string HfConfigJson(const T5Config& c) {
  return absl::StrCat(
      "{\"model_type\": \"t5\", \"vocab_size\": ", c.vocab_size, ", \"d_model\": ", c.d_model,
      ", \"d_kv\": ", c.d_kv, ", \"d_ff\": ", c.d_ff, ", \"num_layers\": ", c.num_layers,
      ", \"num_decoder_layers\": ", c.num_decoder_layers, ", \"num_heads\": ", c.num_heads,
      ", \"relative_attention_num_buckets\": ", c.relative_attention_num_buckets,
      ", \"relative_attention_max_distance\": ", c.relative_attention_max_distance,
      ", \"dropout_rate\": 0.0, \"layer_norm_epsilon\": 1e-06, \"feed_forward_proj\": \"",
      c.gated() ? "gated-gelu" : "relu",
      "\", \"tie_word_embeddings\": ", c.tie_word_embeddings ? "true" : "false", "}");
}

absl::StatusOr<T5Config> Parse(const std::string& text) {
  absl::StatusOr<tensor::Json> json = tensor::ParseJson(text);
  if (!json.ok()) return json.status();
  return ConfigFromHf(*json, "config.json");
}

TEST(HfT5ConfigTest, TheHubsT5SmallIsOurPreset) {
  absl::StatusOr<T5Config> c = Parse(kT5SmallConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  T5Config want = *Preset("t5-small");
  want.name = "hf-t5";
  EXPECT_EQ(c->ToString(), want.ToString());  // max distance 128, relu, tied: the defaults
  EXPECT_EQ(c->num_decoder_layers, 6);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-6f);
}

TEST(HfT5ConfigTest, TheHubsV1_1SmallIsGatedAndUntied) {
  absl::StatusOr<T5Config> c = Parse(kT5V11SmallConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gated());
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->num_layers, 8);
  EXPECT_EQ(c->num_heads, 6);
  EXPECT_EQ(c->d_ff, 1024);
  EXPECT_EQ(CountParameters(*c).total, 76961152);  // google/t5-v1_1-small's
}

TEST(HfT5ConfigTest, RefusesWhatIsNotT5OrNotComputedHere) {
  const std::string small = kT5SmallConfig;
  auto with = [&](const std::string& from, const std::string& to) {
    return absl::StrReplaceAll(small, {{from, to}});
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {with("\"model_type\": \"t5\"", "\"model_type\": \"bart\""),
       "config.json: model_type is 'bart', not 't5'"},
      {with("\"d_model\": 512,", ""), "config.json: no 'd_model'"},
      {with("\"num_heads\": 8", "\"num_heads\": 8.5"), "'num_heads' is not an integer (8.5)"},
      {with("\"d_kv\": 64,", "\"d_kv\": 64, \"feed_forward_proj\": \"gated-silu\","),
       "feed_forward_proj 'gated-silu' is not one T5 computes here"},
      {with("\"d_kv\": 64,", "\"d_kv\": 64, \"dense_act_fn\": \"gelu_new\","),
       "dense_act_fn 'gelu_new' is not relu"},
      {with("\"relative_attention_num_buckets\": 32", "\"relative_attention_num_buckets\": 7"),
       "relative_attention_num_buckets must be even"},
      {with("\"dropout_rate\": 0.1", "\"dropout_rate\": \"high\""),
       "'dropout_rate' is not a number"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<T5Config> c = Parse(text);
    ASSERT_FALSE(c.ok()) << want;
    EXPECT_TRUE(absl::StrContains(c.status().message(), want)) << c.status();
  }
}

struct Fixture {
  T5Config config;
  NamedTensors weights;  // ParameterShapes order
  std::map<std::string, Tensor> batch;
  double loss = 0;
};

Fixture LoadFixture(const std::string& file) {
  Fixture f;
  absl::StatusOr<std::string> path = data::ResolveRunfile("models/t5/testdata/" + file);
  EXPECT_TRUE(path.ok()) << path.status();
  absl::StatusOr<tensor::SafetensorsFile> st = tensor::ReadSafetensors(*path);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return f;
  f.config = *ParseConfig(st->header.metadata.at("config"));
  std::map<std::string, Tensor> all(st->tensors.begin(), st->tensors.end());
  for (const ParamShape& p : ParameterShapes(f.config)) f.weights.emplace_back(p.name, all[p.name]);
  for (const char* k : {"encoder_inputs", "encoder_mask", "decoder_inputs", "decoder_targets"}) {
    f.batch[k] = all[k];
  }
  EXPECT_TRUE(absl::SimpleAtod(st->header.metadata.at("ref.loss"), &f.loss));
  return f;
}

double LossOf(const PretrainedSources& read, const Fixture& f) {
  T5Model model(read.config);
  EXPECT_TRUE(nn::InitFromSources(model, read.sources).ok());
  model.Materialize(/*seed=*/7);  // reads the sources
  return model.Loss(f.batch.at("encoder_inputs"), f.batch.at("encoder_mask"),
                    f.batch.at("decoder_inputs"), f.batch.at("decoder_targets"));
}

// v1.0: the file holds shared.weight under all three names and the tied
// lm_head.weight; then only under encoder.embed_tokens.weight. v1.1: bf16
// weights (read as f32: the loss moves by their rounding only).
TEST(HfT5Test, TheParityFixturesInHfLayoutGiveHuggingFacesLoss) {
  const Fixture v10 = LoadFixture("t5_v1_0_reference.safetensors");
  ASSERT_TRUE(v10.config.tie_word_embeddings);
  NamedTensors hub = v10.weights;
  const Tensor shared = v10.weights.front().second;
  ASSERT_EQ(v10.weights.front().first, "shared.weight");
  hub.emplace_back("encoder.embed_tokens.weight", shared);
  hub.emplace_back("decoder.embed_tokens.weight", shared);
  hub.emplace_back("lm_head.weight", shared);
  for (bool shared_named : {true, false}) {
    SCOPED_TRACE(shared_named ? "shared.weight in the file" : "only encoder.embed_tokens.weight");
    const std::string dir = FreshTempDir(shared_named ? "v10_all" : "v10_alias");
    WriteFile(dir + "/config.json", HfConfigJson(v10.config));
    NamedTensors written = hub;
    if (!shared_named) written.erase(written.begin());
    ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model.safetensors", written).ok());
    absl::StatusOr<PretrainedSources> read = OpenHfT5(dir);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->source, "Hugging Face T5 " + dir);
    const double loss = LossOf(*read, v10);
    std::printf("v1.0: loss %.9f, Hugging Face's %.9f\n", loss, v10.loss);
    EXPECT_NEAR(loss, v10.loss, 1e-4 * v10.loss);
  }

  const Fixture v11 = LoadFixture("t5_v1_1_reference.safetensors");
  ASSERT_FALSE(v11.config.tie_word_embeddings);
  const std::string dir = FreshTempDir("v11_bf16");
  WriteFile(dir + "/config.json", HfConfigJson(v11.config));
  NamedTensors bf16;
  for (const auto& [name, t] : v11.weights) bf16.emplace_back(name, t.To(tensor::Dtype::kBF16));
  ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model.safetensors", bf16).ok());
  absl::StatusOr<PretrainedSources> read = OpenHfT5(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  const double loss = LossOf(*read, v11);
  std::printf("v1.1 (bf16 weights): loss %.9f, Hugging Face's from the f32 weights %.9f\n", loss,
              v11.loss);
  EXPECT_NEAR(loss, v11.loss, 2e-2 * v11.loss);
}

TEST(HfT5Test, RefusesMissingMisshapenAndOtherTensors) {
  const Fixture f = LoadFixture("t5_v1_1_reference.safetensors");
  struct Case {
    std::string name;
    NamedTensors tensors;
    std::string want;
  };
  NamedTensors missing = f.weights, misshapen = f.weights, extra = f.weights, ints = f.weights;
  missing.pop_back();  // lm_head.weight: v1.1 is untied
  misshapen[1].second = misshapen[1].second.Narrow(0, 0, 2).Contiguous();
  extra.emplace_back("encoder.block.0.layer.0.SelfAttention.k.bias", Tensor::Zeros({12}));
  ints[2].second = ints[2].second.To(tensor::Dtype::kI64);
  const std::string q = f.weights[1].first, k = f.weights[2].first;
  const std::vector<Case> cases = {
      {"missing", missing, "no tensor 'lm_head.weight' in the weights"},
      {"misshapen", misshapen,
       absl::StrCat("tensor '", q, "' has shape (2,16); config.json's sizes need (12,16)")},
      {"extra", extra,
       "tensors T5 of config.json's sizes does not have: "
       "encoder.block.0.layer.0.SelfAttention.k.bias"},
      {"ints", ints, absl::StrCat("tensor '", k, "' is i64")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = FreshTempDir("bad_" + c.name);
    WriteFile(dir + "/config.json", HfConfigJson(f.config));
    ASSERT_TRUE(tensor::WriteSafetensors(dir + "/model.safetensors", c.tensors).ok());
    absl::StatusOr<PretrainedSources> read = OpenHfT5(dir);
    ASSERT_FALSE(read.ok());
    EXPECT_TRUE(absl::StrContains(read.status().message(), c.want)) << read.status();
  }
  const std::string bin_only = FreshTempDir("bin_only");
  WriteFile(bin_only + "/config.json", HfConfigJson(f.config));
  absl::StatusOr<PretrainedSources> read = OpenHfT5(bin_only);
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::StrContains(read.status().message(), "not pytorch_model.bin")) << read.status();
}

// WriteHfT5, then OpenHfT5: the configuration (but its name) and every weight.
TEST(HfT5Test, WritesWhatItReadsBack) {
  for (const char* file : {"t5_v1_0_reference.safetensors", "t5_v1_1_reference.safetensors"}) {
    SCOPED_TRACE(file);
    const Fixture f = LoadFixture(file);
    const std::string dir = FreshTempDir("written");
    ASSERT_TRUE(WriteHfT5(dir, f.config, nn::TensorInitSources(f.weights)).ok());
    absl::StatusOr<PretrainedSources> read = OpenHfT5(dir);
    ASSERT_TRUE(read.ok()) << read.status();
    T5Config renamed = f.config;
    renamed.name = "hf-t5";
    EXPECT_EQ(read->config.ToString(), renamed.ToString());
    ASSERT_EQ(read->sources.size(), f.weights.size());
    for (size_t i = 0; i < f.weights.size(); ++i) {
      EXPECT_EQ(read->sources[i].first, f.weights[i].first);
      Tensor t = Tensor::Empty(read->sources[i].second->shape());
      read->sources[i].second->Read(0, t);
      EXPECT_EQ(t.ToVector<float>(), f.weights[i].second.ToVector<float>()) << f.weights[i].first;
    }
    // T5's special ids by default; the ones written (eos null: none) read back.
    EXPECT_EQ(read->ids.eos_id, 1);
    EXPECT_EQ(read->ids.pad_id, 0);
    EXPECT_EQ(read->ids.decoder_start_id, 0);
    const std::string with_ids = FreshTempDir("with_ids");
    ASSERT_TRUE(WriteHfT5(with_ids, f.config, nn::TensorInitSources(f.weights), {-1, 3, 2}).ok());
    read = OpenHfT5(with_ids);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->ids.eos_id, -1);
    EXPECT_EQ(read->ids.pad_id, 3);
    EXPECT_EQ(read->ids.decoder_start_id, 2);
    // A weight that does not fit is refused before anything is written.
    NamedTensors wrong = f.weights;
    wrong[0].second = wrong[0].second.Narrow(0, 0, 3).Contiguous();
    absl::Status s = WriteHfT5(FreshTempDir("wrong"), f.config, nn::TensorInitSources(wrong));
    EXPECT_TRUE(absl::StrContains(s.message(), "weight 'shared.weight' has shape (3,16)")) << s;
  }
}

}  // namespace
}  // namespace t5
