// Presets and parameter counts (checked against minGPT's and GPT-2's published sizes).
#include "models/mingpt/config.h"

#include "gtest/gtest.h"

namespace mingpt {
namespace {

TEST(ConfigTest, PresetsAndErrors) {
  auto g = Preset("gopher-44m");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->n_layer, 8);
  EXPECT_EQ(g->n_head, 16);
  EXPECT_EQ(g->n_embd, 512);
  EXPECT_TRUE(g->Validate().ok());
  auto big = Preset("gpt-175b");
  EXPECT_EQ(big->n_embd, 12288);
  EXPECT_EQ(Preset("gpt-1t")->n_head, 160);
  auto bad = Preset("gpt5");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown gpt preset 'gpt5'; known: gpt-nano"),
            std::string::npos);
  GptConfig c = *Preset("gpt-nano");
  c.n_head = 5;
  EXPECT_NE(c.Validate().message().find("n_embd 48 is not divisible by n_head 5"),
            std::string::npos);
}

TEST(ConfigTest, ParseConfigInvertsToString) {
  for (const std::string& name : PresetNames()) {
    GptConfig c = *Preset(name);
    c.vocab_size = 256;
    c.dropout = 0.25f;
    absl::StatusOr<GptConfig> back = ParseConfig(c.ToString());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToString(), c.ToString());
    EXPECT_EQ(back->name, name);
    EXPECT_EQ(back->n_head, c.n_head);
    EXPECT_EQ(back->block_size, c.block_size);
    EXPECT_EQ(back->dropout, 0.25f);
  }
  GptConfig custom;  // no name: "custom(...)"
  custom.n_layer = 2;
  custom.dropout = 0.1f;
  absl::StatusOr<GptConfig> back = ParseConfig(custom.ToString());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "");
  EXPECT_EQ(back->n_layer, 2);
  EXPECT_EQ(back->dropout, 0.1f);

  auto message = [](absl::string_view text) {
    return std::string(ParseConfig(text).status().message());
  };
  EXPECT_NE(message("gpt-nano").find("expected name("), std::string::npos);
  EXPECT_NE(
      message("x(n_layer=3, n_head=3, n_embd=48, vocab_size=256, block_size=8)").find("no dropout"),
      std::string::npos);
  EXPECT_NE(message("x(n_layer=3, n_head=3, n_embd=48, vocab_size=256, block_size=8, "
                    "dropout=0, bias=1)")
                .find("unknown field 'bias'"),
            std::string::npos);
  EXPECT_NE(message("x(n_layer=three, n_head=3, n_embd=48, vocab_size=256, block_size=8, "
                    "dropout=0)")
                .find("n_layer 'three' is not a number"),
            std::string::npos);
  EXPECT_NE(message("x(n_layer=3, n_head=5, n_embd=48, vocab_size=256, block_size=8, dropout=0)")
                .find("not divisible by n_head 5"),
            std::string::npos);
}

TEST(ConfigTest, CountsMatchKnownSizes) {
  // GPT-2 small: 124,439,808 parameters with tied embeddings (HF). minGPT unties
  // lm_head, adding vocab x C.
  GptConfig gpt2 = *Preset("gpt2");
  const ParamCount n = CountParameters(gpt2);
  EXPECT_EQ(n.total - n.lm_head, 124439808);
  // gopher-44m: per block 12*512^2 + 13*512; embeddings (50257 + 128) * 512; ln_f 2*512.
  const ParamCount gopher = CountParameters(*Preset("gopher-44m"));
  EXPECT_EQ(gopher.per_block, 3152384);
  EXPECT_EQ(gopher.total - gopher.lm_head, 8 * 3152384 + 25797120 + 1024);
  // GPT 175B: 12 * L * C^2 dominates: about 174.6B.
  const ParamCount g175 = CountParameters(*Preset("gpt-175b"));
  EXPECT_NEAR(g175.total / 1e9, 175.0, 1.5);
  const ParamCount g1t = CountParameters(*Preset("gpt-1t"));
  EXPECT_NEAR(g1t.total / 1e12, 1.0, 0.02);
  // Shapes and counts agree.
  int64_t sum = 0;
  for (const ParamShape& p : ParameterShapes(gpt2)) sum += p.numel();
  EXPECT_EQ(sum, n.total);
  EXPECT_EQ(ParameterShapes(gpt2)[2].name, "transformer.h.0.ln_1.weight");
}

// nanoGPT's / llm.c's count for gpt2 at T = 1024: N = 123,653,376 weights that
// multiply (blocks, ln_f, the untied lm_head), 6 N + 12 L C T.
TEST(ConfigTest, FlopsPerTokenOfGpt2) {
  const GptConfig gpt2 = *Preset("gpt2");
  EXPECT_EQ(CountParameters(gpt2).non_embedding, 123653376);
  EXPECT_EQ(FlopsPerToken(gpt2, 1024), 6.0 * 123653376 + 12.0 * 12 * 768 * 1024);
}

}  // namespace
}  // namespace mingpt
