// Text in and out of minGPT's ids: bytes for a byte-level model, GPT-2's BPE
// with a tokenizer (round trip, the special token), ids a padded vocabulary
// has and the tokenizer lacks shown as <|id N|>, and named errors.
#include "models/mingpt/text.h"

#include <string>

#include "gtest/gtest.h"

namespace mingpt {
namespace {

TEST(TextTest, BytesOfAByteLevelModel) {
  const std::string text = "O God!\n\xc3\xa9";  // UTF-8 bytes go through as they are
  absl::StatusOr<std::vector<int64_t>> ids = EncodeText(text, "--prompt", 256, std::nullopt);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{'O', ' ', 'G', 'o', 'd', '!', '\n', 0xc3, 0xa9}));
  EXPECT_EQ(DecodeText(*ids, std::nullopt), text);
  EXPECT_TRUE(CanDecodeText(256, std::nullopt));
  EXPECT_FALSE(CanDecodeText(50257, std::nullopt));
}

TEST(TextTest, Gpt2TokensRoundTripWithTheSpecialToken) {
  absl::StatusOr<data::Gpt2Tokenizer> gpt2 = data::Gpt2Tokenizer::Shipped();
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  const std::optional<data::Gpt2Tokenizer> tokenizer = *std::move(gpt2);
  absl::StatusOr<std::vector<int64_t>> ids =
      EncodeText("<|endoftext|>Hello world", "--sample_prompt", 50304, tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{50256, 15496, 995}));
  EXPECT_EQ(DecodeText(*ids, tokenizer), "<|endoftext|>Hello world");
  EXPECT_EQ(DecodeText({15496, 50300}, tokenizer), "Hello<|id 50300|>");
  EXPECT_TRUE(CanDecodeText(50304, tokenizer));
}

TEST(TextTest, ErrorsNameTheText) {
  absl::StatusOr<std::vector<int64_t>> ids =
      EncodeText("hi", "--sample_prompt", 50304, std::nullopt);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().message(),
            "--sample_prompt is byte-level text, and this model's vocabulary is 50304 token ids, "
            "not 256 bytes: name its tokenizer (--tokenizer=gpt2 for GPT-2's)");
  ids = EncodeText("", "--prompt", 256, std::nullopt);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().message(), "--prompt is empty: give one byte at least (default \"\\n\")");
}

}  // namespace
}  // namespace mingpt
