// The sampling rule draws each token with its filtered probability (checked
// exactly over a grid of uniforms: temperature, top-k, top-p and their mix),
// top-k keeps the tokens tied with the k-th, greedy takes the lowest id
// among equal maxima, bad logits and options are named, WarpScores keeps
// what a draw can return, and the uniforms behind the draws are
// reproducible and spread.
#include "models/common/sampling.h"

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace train {
namespace {

// How often each id is drawn when u runs over N evenly spaced points of [0, 1).
std::vector<double> Frequencies(const std::vector<float>& logits, const Sampling& options) {
  constexpr int kN = 100000;
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < kN; ++i) {
    absl::StatusOr<int64_t> id = SampleFromLogits(logits, options, (i + 0.5) / kN);
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) freq[*id] += 1.0 / kN;
  }
  return freq;
}

void ExpectFrequencies(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-5) << "id " << i;
}

// Probabilities 0.2, 0.4, 0.1, 0.3 at temperature 1 (ids in no sorted order).
const std::vector<float> kLogits = {std::log(0.2f), std::log(0.4f), std::log(0.1f), std::log(0.3f)};

TEST(SampleFromLogitsTest, DrawsEachTokenWithItsFilteredProbability) {
  Sampling o;
  ExpectFrequencies(Frequencies(kLogits, o), {0.2, 0.4, 0.1, 0.3});
  o.temperature = 0.5;  // p^2, renormalized: 0.04, 0.16, 0.01, 0.09 over 0.30
  ExpectFrequencies(Frequencies(kLogits, o), {0.04 / 0.3, 0.16 / 0.3, 0.01 / 0.3, 0.09 / 0.3});
  o.temperature = 1.0;
  o.top_k = 2;  // 0.4 and 0.3 kept
  ExpectFrequencies(Frequencies(kLogits, o), {0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7});
  o.top_k = 9;  // more than V: all
  ExpectFrequencies(Frequencies(kLogits, o), {0.2, 0.4, 0.1, 0.3});
  o.top_k = 0;
  o.top_p = 0.65;  // 0.4 + 0.3 reach it
  ExpectFrequencies(Frequencies(kLogits, o), {0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7});
  o.top_p = 0.75;  // 0.4 + 0.3 + 0.2
  ExpectFrequencies(Frequencies(kLogits, o), {0.2 / 0.9, 0.4 / 0.9, 0.0, 0.3 / 0.9});
  o.top_p = 0.35;  // the most likely alone
  ExpectFrequencies(Frequencies(kLogits, o), {0.0, 1.0, 0.0, 0.0});
  o.top_p = 0.65;
  o.top_k = 3;
  o.temperature = 0.5;  // top 3 at T=0.5: 0.16, 0.09, 0.04 (of 0.29); 0.16 + 0.09 >= 0.65 * 0.29
  ExpectFrequencies(Frequencies(kLogits, o), {0.0, 0.16 / 0.25, 0.0, 0.09 / 0.25});
}

TEST(SampleFromLogitsTest, GreedyTakesTheMostLikelyLowestIdAmongEquals) {
  Sampling o;
  o.temperature = 0.0;
  o.top_k = 3;  // ignored
  EXPECT_EQ(*SampleFromLogits(kLogits, o, 0.99), 1);
  const std::vector<float> tied = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(*SampleFromLogits(tied, o, 0.0), 1);
  o.temperature = 1.0;
  o.top_k = 1;  // one left: greedy whatever u is
  EXPECT_EQ(*SampleFromLogits(kLogits, o, 0.999), 1);
  // Unless others tie with it: top_k keeps them all (TopKKeepsTies).
  EXPECT_EQ(*SampleFromLogits(tied, o, 0.0), 1);
  EXPECT_EQ(*SampleFromLogits(tied, o, 0.999), 3);
}

// top_k keeps every token tied with the k-th, as nanoGPT (logits below the
// k-th set to -inf) and Hugging Face's TopKLogitsWarper do: k = 2 of
// {3, 2, 2, 2, 0} keeps ids 0 to 3, never 4.
TEST(SampleFromLogitsTest, TopKKeepsTies) {
  const std::vector<float> logits = {3.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  Sampling o;
  o.top_k = 2;
  std::set<int64_t> drawn;
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    absl::StatusOr<int64_t> id = SampleFromLogits(logits, o, DrawUniform(seed, 0, 0));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_NE(*id, 4) << "seed " << seed;
    drawn.insert(*id);
  }
  EXPECT_EQ(drawn, (std::set<int64_t>{0, 1, 2, 3}));
  // Each with its share of e^3 + 3 e^2.
  const double z = std::exp(3.0) + 3 * std::exp(2.0);
  const double tie = std::exp(2.0) / z;
  ExpectFrequencies(Frequencies(logits, o), {std::exp(3.0) / z, tie, tie, tie, 0.0});
  // And WarpScores keeps the same ones.
  std::vector<double> scores(logits.begin(), logits.end());
  ASSERT_TRUE(WarpScores(absl::MakeSpan(scores), o).ok());
  EXPECT_EQ(scores,
            (std::vector<double>{3.0, 2.0, 2.0, 2.0, -std::numeric_limits<double>::infinity()}));
  // Below the k-th nothing is tied: k = 1 keeps id 0 alone, k = 4 all but id 4.
  o.top_k = 1;
  ExpectFrequencies(Frequencies(logits, o), {1.0, 0.0, 0.0, 0.0, 0.0});
  o.top_k = 4;
  ExpectFrequencies(Frequencies(logits, o), {std::exp(3.0) / z, tie, tie, tie, 0.0});
}

TEST(SampleFromLogitsTest, ErrorsNameWhatIsWrong) {
  Sampling o;
  const std::vector<float> bad = {0.0f, NAN, 1.0f};
  absl::StatusOr<int64_t> id = SampleFromLogits(bad, o, 0.5);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("logit of token 1 is nan"), std::string::npos)
      << id.status();
  auto invalid = [](Sampling o) { return std::string(o.Validate().message()); };
  o.temperature = -0.5;
  EXPECT_NE(invalid(o).find("temperature must be finite and >= 0"), std::string::npos);
  o = {};
  o.top_k = -1;
  EXPECT_NE(invalid(o).find("top_k must be >= 0"), std::string::npos);
  o = {};
  o.top_p = 0.0;
  EXPECT_NE(invalid(o).find("top_p must be in (0, 1], got 0"), std::string::npos);
  o = {};
  o.repetition_penalty = 0.0;
  EXPECT_NE(invalid(o).find("repetition_penalty must be finite and > 0 (1: off), got 0"),
            std::string::npos);
  o = {};
  o.no_repeat_ngram_size = -2;
  EXPECT_NE(invalid(o).find("no_repeat_ngram_size must be >= 0 (0: off), got -2"),
            std::string::npos);
  o = {};
  const float inf = std::numeric_limits<float>::infinity();
  id = SampleFromLogits(std::vector<float>{0.0f, inf}, o, 0.5);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("logit of token 1 is inf"), std::string::npos);
  id = SampleFromLogits(std::vector<float>{-inf, -inf}, o, 0.5);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("every token is excluded"), std::string::npos);
}

// -inf logits (tokens ApplyRepetitionControls excluded) are never drawn and
// take no probability: the others keep their renormalized shares, with top_k
// counting allowed tokens only, and greedy skips them too.
TEST(SampleFromLogitsTest, MinusInfinityIsATokenNeverDrawn) {
  const float inf = std::numeric_limits<float>::infinity();
  // Probabilities 0.2, 0.4, 0.1, 0.3 with id 1 excluded: 2/6, 0, 1/6, 3/6.
  std::vector<float> logits = kLogits;
  logits[1] = -inf;
  Sampling o;
  ExpectFrequencies(Frequencies(logits, o), {2.0 / 6, 0.0, 1.0 / 6, 3.0 / 6});
  o.top_k = 4;  // more than the 3 allowed
  ExpectFrequencies(Frequencies(logits, o), {2.0 / 6, 0.0, 1.0 / 6, 3.0 / 6});
  for (double u : {0.0, 0.5, 0.999999999}) {
    o.top_k = 0;
    o.top_p = 1.0;
    EXPECT_NE(*SampleFromLogits({-inf, 1.0f, -inf}, o, u), 0);
    EXPECT_EQ(*SampleFromLogits({-inf, 1.0f, -inf}, o, u), 1);
  }
  o.temperature = 0.0;
  EXPECT_EQ(*SampleFromLogits(logits, o, 0.5), 3);
  EXPECT_EQ(*SampleFromLogits({-inf, -inf, -5.0f}, o, 0.5), 2);
}

// WarpScores keeps exactly the tokens SampleFromLogits can draw, each at
// score / temperature, and gives the others -inf: so the softmax of the
// warped row is the draw's distribution.
TEST(WarpScoresTest, KeepsWhatADrawCanReturnAtScoreOverTemperature) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Sampling> cases(5);
  cases[1].temperature = 0.5;
  cases[2].top_k = 2;
  cases[3].top_p = 0.75;
  cases[4].temperature = 0.5;
  cases[4].top_k = 3;
  cases[4].top_p = 0.65;
  for (const Sampling& o : cases) {
    SCOPED_TRACE(::testing::Message() << "temperature " << o.temperature << " top_k " << o.top_k
                                      << " top_p " << o.top_p);
    std::vector<double> scores(kLogits.begin(), kLogits.end());
    ASSERT_TRUE(WarpScores(absl::MakeSpan(scores), o).ok());
    const std::vector<double> freq = Frequencies(kLogits, o);
    double z = 0.0;
    for (double x : scores) z += std::exp(x);
    for (size_t i = 0; i < scores.size(); ++i) {
      if (freq[i] == 0.0) {
        EXPECT_EQ(scores[i], -inf) << "id " << i;
        continue;
      }
      EXPECT_DOUBLE_EQ(scores[i], static_cast<double>(kLogits[i]) / o.temperature) << "id " << i;
      EXPECT_NEAR(std::exp(scores[i]) / z, freq[i], 2e-5) << "id " << i;
    }
  }
  // Greedy leaves the row as it is; -inf stays excluded; a row of -inf is no error.
  Sampling greedy;
  greedy.temperature = 0.0;
  std::vector<double> scores = {1.0, -inf, 3.0};
  ASSERT_TRUE(WarpScores(absl::MakeSpan(scores), greedy).ok());
  EXPECT_EQ(scores, (std::vector<double>{1.0, -inf, 3.0}));
  Sampling o;
  o.temperature = 2.0;
  ASSERT_TRUE(WarpScores(absl::MakeSpan(scores), o).ok());
  EXPECT_EQ(scores, (std::vector<double>{0.5, -inf, 1.5}));
  scores = {-inf, -inf};
  ASSERT_TRUE(WarpScores(absl::MakeSpan(scores), o).ok());
  EXPECT_EQ(scores, (std::vector<double>{-inf, -inf}));
  scores = {0.0, NAN};
  const absl::Status bad = WarpScores(absl::MakeSpan(scores), o);
  EXPECT_NE(bad.message().find("logit of token 1 is nan"), std::string::npos) << bad;
}

// Hugging Face's RepetitionPenaltyLogitsProcessor: a seen token's logit is
// divided by the penalty when positive, multiplied when negative, once
// however often it was seen; others are untouched.
TEST(ApplyRepetitionControlsTest, PenaltyDividesPositiveAndMultipliesNegativeSeenLogits) {
  Sampling o;
  o.repetition_penalty = 2.0;
  std::vector<float> logits = {4.0f, -3.0f, 1.0f, -1.0f, 0.0f};
  const std::vector<int64_t> sequence = {0, 1, 1, 4, 0, 17};  // 17: outside V, ignored
  ApplyRepetitionControls(absl::MakeSpan(logits), sequence, o);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -6.0f, 1.0f, -1.0f, 0.0f}));
  o.repetition_penalty = 1.0;  // off
  ApplyRepetitionControls(absl::MakeSpan(logits), sequence, o);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -6.0f, 1.0f, -1.0f, 0.0f}));
}

// Hugging Face's NoRepeatNGramLogitsProcessor: with n = 3 the last two
// tokens (5, 6) were followed by 7 and by 2 before: both excluded. n = 1
// excludes every token seen; a sequence shorter than n - 1 excludes none.
TEST(ApplyRepetitionControlsTest, NoRepeatNgramExcludesWhatWouldRepeatAnNgram) {
  const double inf = std::numeric_limits<double>::infinity();
  Sampling o;
  o.no_repeat_ngram_size = 3;
  std::vector<double> scores(8, 0.5);  // log-probabilities, as beam search passes
  const std::vector<int64_t> sequence = {5, 6, 7, 1, 5, 6, 2, 0, 5, 6};
  ApplyRepetitionControls(absl::MakeSpan(scores), sequence, o);
  EXPECT_EQ(scores, (std::vector<double>{0.5, 0.5, -inf, 0.5, 0.5, 0.5, 0.5, -inf}));
  o.no_repeat_ngram_size = 1;
  std::vector<double> all(8, 0.5);
  ApplyRepetitionControls(absl::MakeSpan(all), std::vector<int64_t>{3, 1, 3}, o);
  EXPECT_EQ(all, (std::vector<double>{0.5, -inf, 0.5, -inf, 0.5, 0.5, 0.5, 0.5}));
  o.no_repeat_ngram_size = 4;
  std::vector<double> short_seq(8, 0.5);
  ApplyRepetitionControls(absl::MakeSpan(short_seq), std::vector<int64_t>{5, 6}, o);
  EXPECT_EQ(short_seq, std::vector<double>(8, 0.5));
}

TEST(DrawUniformTest, ReproducibleInRangeAndDistinctPerRowAndToken) {
  std::set<double> seen;
  double mean = 0.0;
  for (uint64_t row = 0; row < 32; ++row) {
    for (uint64_t n = 0; n < 32; ++n) {
      const double u = DrawUniform(7, row, n);
      EXPECT_GE(u, 0.0);
      EXPECT_LT(u, 1.0);
      EXPECT_EQ(u, DrawUniform(7, row, n));
      seen.insert(u);
      mean += u / 1024;
    }
  }
  EXPECT_EQ(seen.size(), 1024u);
  EXPECT_NEAR(mean, 0.5, 0.05);  // 1024 uniforms: standard error 0.009
  EXPECT_NE(DrawUniform(7, 0, 0), DrawUniform(8, 0, 0));
}

}  // namespace
}  // namespace train
