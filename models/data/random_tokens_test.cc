// Random tokens: ids in range and close to uniform, deterministic per
// (seed, step, row), and position i independent of the sequence length.
#include "models/data/random_tokens.h"

#include <vector>

#include "gtest/gtest.h"

namespace data {
namespace {

std::vector<int64_t> Sample(const TokenSource& s, int64_t step, int64_t row, int64_t n) {
  std::vector<int64_t> out(n);
  s.SampleSequence(step, row, absl::MakeSpan(out));
  return out;
}

TEST(RandomTokensTest, DefaultVocabularyIsGpt2) {
  auto s = RandomTokenSource::Create(1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->vocab_size(), 50257);
  EXPECT_EQ((*s)->max_sequence_length(), kUnlimitedLength);
}

TEST(RandomTokensTest, HasNothingToHoldOut) {
  auto source = RandomTokenSource::Create(1, 100);
  ASSERT_TRUE(source.ok());
  auto part = (*source)->Slice(0, 10, 2);
  ASSERT_FALSE(part.ok());
  EXPECT_EQ(part.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(part.status().message().find("has no fixed tokens to split"), std::string::npos);
}

TEST(RandomTokensTest, IdsInRangeAndCloseToUniform) {
  auto s = RandomTokenSource::Create(7, 16);
  ASSERT_TRUE(s.ok());
  std::vector<int> counts(16, 0);
  const int64_t n = 4096;
  for (int64_t row = 0; row < 16; ++row) {
    for (int64_t t : Sample(**s, 3, row, n)) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 16);
      ++counts[t];
    }
  }
  const double expected = 16.0 * n / 16;
  double chi2 = 0;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 37.7);  // chi-square, 15 degrees of freedom, p = 0.001
}

TEST(RandomTokensTest, DeterministicAndDifferentPerStepRowSeed) {
  auto a = RandomTokenSource::Create(1);
  auto b = RandomTokenSource::Create(2);
  ASSERT_TRUE(a.ok() && b.ok());
  const auto x = Sample(**a, 5, 3, 64);
  EXPECT_EQ(x, Sample(**a, 5, 3, 64));
  EXPECT_NE(x, Sample(**a, 6, 3, 64));
  EXPECT_NE(x, Sample(**a, 5, 4, 64));
  EXPECT_NE(x, Sample(**b, 5, 3, 64));
  // A shorter request is a prefix of a longer one.
  const auto prefix = Sample(**a, 5, 3, 17);
  EXPECT_EQ(prefix, std::vector<int64_t>(x.begin(), x.begin() + 17));
}

TEST(RandomTokensTest, BadVocabularyIsAnError) {
  auto s = RandomTokenSource::Create(1, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("vocab_size must be in [1, 2^31], got 0"),
            absl::string_view::npos)
      << s.status();
}

}  // namespace
}  // namespace data
