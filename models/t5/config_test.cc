// T5 configurations: preset values, parameter counts against the Hugging Face
// checkpoints' sizes, names and shapes, and validation messages.
#include "models/t5/config.h"

#include <map>
#include <set>

#include "gtest/gtest.h"

namespace t5 {
namespace {

int64_t SumOfShapes(const T5Config& c) {
  int64_t n = 0;
  for (const ParamShape& p : ParameterShapes(c)) n += p.numel();
  return n;
}

TEST(T5ConfigTest, PresetsHaveThePaperSizes) {
  struct Row {
    const char* name;
    int64_t layers, d_model, d_ff, heads, d_kv;
  };
  const Row rows[] = {{"t5-small", 6, 512, 2048, 8, 64},
                      {"t5-base", 12, 768, 3072, 12, 64},
                      {"t5-large", 24, 1024, 4096, 16, 64},
                      {"t5-3b", 24, 1024, 16384, 32, 128},
                      {"t5-11b", 24, 1024, 65536, 128, 128}};
  for (const Row& row : rows) {
    absl::StatusOr<T5Config> c = Preset(row.name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->name, row.name);
    EXPECT_EQ(c->num_layers, row.layers);
    EXPECT_EQ(c->num_decoder_layers, row.layers);
    EXPECT_EQ(c->d_model, row.d_model);
    EXPECT_EQ(c->d_ff, row.d_ff);
    EXPECT_EQ(c->num_heads, row.heads);
    EXPECT_EQ(c->d_kv, row.d_kv);
    EXPECT_EQ(c->vocab_size, 32128);
    EXPECT_EQ(c->relative_attention_num_buckets, 32);
    EXPECT_EQ(c->relative_attention_max_distance, 128);
    EXPECT_FLOAT_EQ(c->dropout_rate, 0.1f);
    EXPECT_EQ(c->feed_forward_proj, FeedForwardProj::kRelu);
    EXPECT_TRUE(c->tie_word_embeddings);
    EXPECT_TRUE(c->Validate().ok()) << c->Validate();
  }
  EXPECT_EQ(PresetNames().size(), 6u);
}

TEST(T5ConfigTest, UnknownPresetIsAClearError) {
  absl::StatusOr<T5Config> c = Preset("t5-huge");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "unknown t5 preset 't5-huge'; known: t5-tiny, t5-small, t5-base, t5-large, t5-3b, "
            "t5-11b");
}

// model.num_parameters() of the Hugging Face checkpoints (T5ForConditionalGeneration,
// tied embeddings: shared.weight counted once, no lm_head).
TEST(T5ConfigTest, CountsMatchTheHuggingFaceCheckpoints) {
  const std::map<std::string, int64_t> hf = {
      {"t5-small", 60506624}, {"t5-base", 222903552},  {"t5-large", 737668096},
      {"t5-3b", 2851598336},  {"t5-11b", 11307321344},
  };
  for (const auto& [name, expected] : hf) {
    T5Config c = *Preset(name);
    const ParamCount n = CountParameters(c);
    EXPECT_EQ(n.total, expected) << name;
    EXPECT_EQ(SumOfShapes(c), n.total) << name;
    EXPECT_EQ(n.lm_head, 0) << name;
    EXPECT_EQ(n.shared, 32128 * c.d_model) << name;
    EXPECT_EQ(n.total, n.shared + n.encoder + n.decoder) << name;
    EXPECT_EQ(n.non_embedding, n.encoder + n.decoder) << name;
  }
}

// Tables that count the output projection as its own (V, d_model) matrix
// (e.g. Wikipedia's T5 table: small 76,956,160, base 247,577,856, and the
// ~2.88B quoted for t5-3b) describe the untied layout: the same shapes plus
// lm_head.
TEST(T5ConfigTest, UntiedCountsAddOneVocabularyProjection) {
  const std::map<std::string, int64_t> untied = {
      {"t5-small", 76956160}, {"t5-base", 247577856}, {"t5-3b", 2884497408}};
  for (const auto& [name, expected] : untied) {
    T5Config c = *Preset(name);
    c.tie_word_embeddings = false;
    EXPECT_EQ(CountParameters(c).total, expected) << name;
    EXPECT_EQ(SumOfShapes(c), expected) << name;
  }
}

TEST(T5ConfigTest, SmallCountsByHand) {
  const ParamCount n = CountParameters(*Preset("t5-small"));
  // q, k, v, o 4 * 512^2; wi, wo 2 * 512 * 2048; two RMSNorm weights.
  EXPECT_EQ(n.per_encoder_block, 4 * 512 * 512 + 2 * 512 * 2048 + 2 * 512);
  EXPECT_EQ(n.per_decoder_block, 8 * 512 * 512 + 2 * 512 * 2048 + 3 * 512);
  EXPECT_EQ(n.relative_bias, 32 * 8);
  EXPECT_EQ(n.encoder, 6 * n.per_encoder_block + 32 * 8 + 512);
}

// google/t5-v1_1-small: gated-GELU, untied lm_head, d_ff 1024, 6 heads, 8+8 layers.
TEST(T5ConfigTest, V1_1CountsMatchTheHuggingFaceCheckpoint) {
  T5Config c = AsV1_1(*Preset("t5-small"));
  c.d_ff = 1024;
  c.num_heads = 6;
  c.num_layers = 8;
  c.num_decoder_layers = 8;
  const ParamCount n = CountParameters(c);
  EXPECT_EQ(n.total, 76961152);
  EXPECT_EQ(n.lm_head, 32128 * 512);
  EXPECT_EQ(SumOfShapes(c), n.total);
  const std::vector<ParamShape> shapes = ParameterShapes(c);
  EXPECT_EQ(shapes.back().name, "lm_head.weight");
  EXPECT_EQ(shapes.back().shape, (std::vector<int64_t>{32128, 512}));
}

// The same count through the parameter counts: each weight of a block
// multiplies each of its stack's tokens once (6 FLOPs forward and backward),
// but the cross-attention's k and v multiply the S encoder outputs, and the
// norms' weights (2 an encoder block, 3 a decoder block) multiply nothing.
// t5-3b's heads are wider than d_model (32 x 128 = 4096 against 1024).
TEST(T5ConfigTest, FlopsPerExampleFromTheParameterCounts) {
  std::vector<T5Config> configs = {*Preset("t5-small"), *Preset("t5-3b"),
                                   AsV1_1(*Preset("t5-base"))};
  configs[0].num_decoder_layers = 4;  // unequal stacks
  for (const T5Config& c : configs) {
    SCOPED_TRACE(c.ToString());
    const ParamCount n = CountParameters(c);
    const double S = 512, T = 114, d = c.d_model, i = c.inner_dim();
    const double cross_kv = 2 * d * i;
    const double weights = S * c.num_layers * (n.per_encoder_block - 2 * d) +
                           T * c.num_decoder_layers * (n.per_decoder_block - 3 * d - cross_kv) +
                           S * c.num_decoder_layers * cross_kv + T * d * c.vocab_size;
    const double attention =
        i * (c.num_layers * S * S + c.num_decoder_layers * T * (T + S));  // q.k and p.v
    EXPECT_DOUBLE_EQ(FlopsPerExample(c, 512, 114), 6 * weights + 12 * attention);
  }
  // t5-small by hand at S = T = 1: (4 + 4) d^2 + 2 d^2 for the stacks' projections
  // per layer and 2 d d_ff each FF, plus scores and the lm_head.
  const T5Config small = *Preset("t5-small");
  const double d = 512, ff = 2 * 512 * 2048;
  EXPECT_DOUBLE_EQ(FlopsPerExample(small, 1, 1),
                   3 * (2 * 6 * (4 * d * d + ff) + 2 * 6 * (8 * d * d + ff) + 4 * d * (6 + 6 * 2) +
                        2 * d * 32128));
}

TEST(T5ConfigTest, NamesAndShapesAreHuggingFaces) {
  const T5Config c = *Preset("t5-3b");  // inner dim 32 * 128 = 4096 != d_model
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> order;
  for (const ParamShape& p : ParameterShapes(c)) {
    EXPECT_TRUE(shapes.emplace(p.name, p.shape).second) << "duplicate " << p.name;
    order.push_back(p.name);
  }
  using V = std::vector<int64_t>;
  const std::map<std::string, V> expected = {
      {"shared.weight", V{32128, 1024}},
      {"encoder.block.0.layer.0.SelfAttention.q.weight", V{4096, 1024}},
      {"encoder.block.0.layer.0.SelfAttention.o.weight", V{1024, 4096}},
      {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", V{32, 32}},
      {"encoder.block.0.layer.0.layer_norm.weight", V{1024}},
      {"encoder.block.0.layer.1.DenseReluDense.wi.weight", V{16384, 1024}},
      {"encoder.block.23.layer.1.DenseReluDense.wo.weight", V{1024, 16384}},
      {"encoder.final_layer_norm.weight", V{1024}},
      {"decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", V{32, 32}},
      {"decoder.block.0.layer.1.EncDecAttention.q.weight", V{4096, 1024}},
      {"decoder.block.5.layer.1.EncDecAttention.v.weight", V{4096, 1024}},
      {"decoder.block.0.layer.1.layer_norm.weight", V{1024}},
      {"decoder.block.0.layer.2.DenseReluDense.wo.weight", V{1024, 16384}},
      {"decoder.block.0.layer.2.layer_norm.weight", V{1024}},
      {"decoder.final_layer_norm.weight", V{1024}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(shapes[name], shape) << name;
  }
  // The relative bias lives in the first block of each stack only; no
  // cross-attention bias, no lm_head (tied).
  int biases = 0;
  for (const std::string& name : order) {
    if (name.find("relative_attention_bias") != std::string::npos) ++biases;
    EXPECT_EQ(name.find("EncDecAttention.relative_attention_bias"), std::string::npos) << name;
    EXPECT_NE(name, "lm_head.weight");
  }
  EXPECT_EQ(biases, 2);
  EXPECT_FALSE(
      shapes.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  // Order: Hugging Face's named_parameters().
  EXPECT_EQ(order.front(), "shared.weight");
  EXPECT_EQ(order[1], "encoder.block.0.layer.0.SelfAttention.q.weight");
  EXPECT_EQ(order[5], "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
  EXPECT_EQ(order[6], "encoder.block.0.layer.0.layer_norm.weight");
  EXPECT_EQ(order.back(), "decoder.final_layer_norm.weight");
  EXPECT_EQ(order.size(), 1 + 24 * 8 + 1 + 1 + 24 * 13 + 1 + 1u);
}

// ParseConfig reads back what ToString writes (presets, v1.1, an unnamed
// configuration with other sizes) and names what it cannot read.
TEST(T5ConfigTest, ParseConfigInvertsToString) {
  std::vector<T5Config> configs;
  for (const std::string& name : PresetNames()) configs.push_back(*Preset(name));
  configs.push_back(AsV1_1(*Preset("t5-small")));
  T5Config odd = *Preset("t5-small");
  odd.name.clear();
  odd.vocab_size = 300;
  odd.d_kv = 16;
  odd.num_decoder_layers = 2;
  odd.relative_attention_num_buckets = 8;
  odd.relative_attention_max_distance = 20;
  odd.dropout_rate = 0.25f;
  odd.layer_norm_epsilon = 1e-5f;  // (a fine-tuned Hugging Face config's)
  configs.push_back(odd);
  for (const T5Config& c : configs) {
    absl::StatusOr<T5Config> back = ParseConfig(c.ToString());
    ASSERT_TRUE(back.ok()) << c.ToString() << ": " << back.status();
    EXPECT_EQ(back->ToString(), c.ToString());
    EXPECT_EQ(back->name, c.name);
    EXPECT_EQ(back->gated(), c.gated());
    EXPECT_EQ(back->tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(back->layer_norm_epsilon, c.layer_norm_epsilon);
  }
  // The default epsilon is not written: earlier checkpoints' strings stand.
  EXPECT_EQ(Preset("t5-small")->ToString().find("layer_norm_epsilon"), std::string::npos);
  const std::string small = Preset("t5-small")->ToString();
  auto message = [](const std::string& text) {
    return std::string(ParseConfig(text).status().message());
  };
  EXPECT_NE(message("t5-small").find("expected name("), std::string::npos);
  std::string bad = small;
  bad.replace(bad.find("d_model=512"), 11, "d_model=x");
  EXPECT_NE(message(bad).find("d_model 'x' is not valid"), std::string::npos) << message(bad);
  bad = small;
  bad.replace(bad.find("feed_forward_proj=relu"), 22, "feed_forward_proj=swish");
  EXPECT_NE(message(bad).find("feed_forward_proj 'swish'"), std::string::npos) << message(bad);
  bad = small;
  bad.replace(bad.find(", d_kv=64"), 9, "");
  EXPECT_NE(message(bad).find("no d_kv"), std::string::npos) << message(bad);
  bad = small;
  bad.replace(bad.find("d_kv=64"), 7, "d_kv=64, d_kv=64");
  EXPECT_NE(message(bad).find("'d_kv' given twice"), std::string::npos) << message(bad);
  bad = small;
  bad.replace(bad.find("num_heads=8"), 11, "num_heads=0");
  EXPECT_FALSE(ParseConfig(bad).ok());  // Validate's refusal
}

TEST(T5ConfigTest, ValidateNamesTheProblem) {
  auto message = [](T5Config c) { return std::string(c.Validate().message()); };
  T5Config ok = *Preset("t5-small");
  T5Config c = ok;
  c.d_model = 0;
  EXPECT_NE(message(c).find("d_model must be positive, got 0"), std::string::npos) << message(c);
  c = ok;
  c.num_decoder_layers = -1;
  EXPECT_NE(message(c).find("num_decoder_layers must be positive"), std::string::npos);
  c = ok;
  c.relative_attention_num_buckets = 7;
  EXPECT_NE(message(c).find("relative_attention_num_buckets must be even and >= 4"),
            std::string::npos)
      << message(c);
  c = ok;
  c.relative_attention_max_distance = 16;
  EXPECT_NE(message(c).find("relative_attention_max_distance 16 must exceed the exact range "
                            "num_buckets / 2 = 16"),
            std::string::npos)
      << message(c);
  c = ok;
  c.dropout_rate = 1.0f;
  EXPECT_NE(message(c).find("dropout_rate must be in [0, 1)"), std::string::npos);
  c = ok;
  c.layer_norm_epsilon = 0.0f;
  EXPECT_NE(message(c).find("layer_norm_epsilon must be positive"), std::string::npos);
  EXPECT_EQ(message(c).rfind("t5 config t5-small(vocab_size=32128", 0), 0u) << message(c);
}

}  // namespace
}  // namespace t5
