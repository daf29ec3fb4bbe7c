// The decoding loops over a bigram model (a fixed table of next-token
// log-probabilities given the last token): beam search with enough beams to
// keep every prefix returns the best of all sequences by Hugging Face's score
// (sum / new tokens^length_penalty; eos ending a hypothesis), found by
// enumerating them; rows stop at eos_id; the options are checked by name.
#include "models/common/decoding.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace train {
namespace {

constexpr int64_t kV = 4;
constexpr int64_t kEos = 3;

// log p(next | last), rows by last token; no two sequences score alike.
const double kLogP[kV][kV] = {
    {std::log(0.50), std::log(0.20), std::log(0.18), std::log(0.12)},
    {std::log(0.05), std::log(0.55), std::log(0.15), std::log(0.25)},
    {std::log(0.30), std::log(0.33), std::log(0.02), std::log(0.35)},
    {std::log(0.40), std::log(0.26), std::log(0.24), std::log(0.10)},
};

class Bigram : public NextTokens {
 public:
  std::vector<float> Logits(const TokenRows& rows) override {
    std::vector<float> out;
    for (const std::vector<int64_t>& row : rows) {
      for (int64_t v = 0; v < kV; ++v) out.push_back(static_cast<float>(kLogP[row.back()][v]));
    }
    ++calls;
    return out;
  }
  void SelectRows(const std::vector<int64_t>& rows) override { selected.push_back(rows); }

  int64_t calls = 0;
  std::vector<std::vector<int64_t>> selected;
};

// log p of `tokens` after `start`, in float as the model gives it.
double SumOf(int64_t start, const std::vector<int64_t>& tokens) {
  double sum = 0.0;
  int64_t last = start;
  for (int64_t t : tokens) {
    sum += static_cast<float>(kLogP[last][t]);
    last = t;
  }
  return sum;
}

// Every sequence after `start` of at most n tokens, best first by sum /
// length^lp: the ones ending in eos (after min_new tokens at least), and those
// of n tokens.
std::vector<std::vector<int64_t>> RankByEnumeration(int64_t start, int64_t n, double lp,
                                                    int64_t min_new = 0) {
  std::vector<std::pair<double, std::vector<int64_t>>> all;
  std::function<void(std::vector<int64_t>&)> visit = [&](std::vector<int64_t>& seq) {
    const bool ended = !seq.empty() && seq.back() == kEos;
    if (ended && static_cast<int64_t>(seq.size()) <= min_new) return;  // eos too early
    if (ended || static_cast<int64_t>(seq.size()) == n) {
      all.emplace_back(SumOf(start, seq) / std::pow(static_cast<double>(seq.size()), lp), seq);
      return;
    }
    for (int64_t v = 0; v < kV; ++v) {
      seq.push_back(v);
      visit(seq);
      seq.pop_back();
    }
  };
  std::vector<int64_t> seq;
  visit(seq);
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::vector<int64_t>> ranked;
  for (auto& [score, s] : all) ranked.push_back(s);
  return ranked;
}

TEST(BeamSearchTest, EnoughBeamsFindTheBestSequenceByScore) {
  // 3 tokens: at most 9 running prefixes of 2 tokens, 36 continuations; 64
  // beams keep them all, and every eos continuation ranks among the first 64.
  for (double lp : {0.0, 1.0, 2.0, -0.5}) {
    Decoding o;
    o.temperature = 0.0;
    o.max_new_tokens = 3;
    o.eos_id = kEos;
    o.num_beams = 64;
    o.length_penalty = lp;
    const TokenRows prefixes = {{0}, {1}, {2}};
    Bigram model;
    absl::StatusOr<TokenRows> got = BeamSearch(model, prefixes, kV, o);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t b = 0; b < 3; ++b) {
      EXPECT_EQ((*got)[b], RankByEnumeration(b, 3, lp)[0])
          << "length_penalty " << lp << ", start " << b;
    }
    EXPECT_EQ(model.calls, 3);
    ASSERT_EQ(model.selected.size(), 2u);  // after steps 1 and 2; none after the last
    for (const std::vector<int64_t>& rows : model.selected) {
      ASSERT_EQ(rows.size(), 3u * 64u);
      for (size_t r = 0; r < rows.size(); ++r) {
        EXPECT_EQ(rows[r] / 64, static_cast<int64_t>(r) / 64) << "a beam moved to another example";
      }
    }
  }
}

// The same search returning its 5 best, and with min_new_tokens 2 (eos
// excluded from the first two new tokens): the enumeration's first 5, and
// its best among the sequences that obey the minimum.
TEST(BeamSearchTest, ReturnedSequencesAndMinNewTokensFollowTheEnumeration) {
  Decoding o;
  o.temperature = 0.0;
  o.max_new_tokens = 3;
  o.eos_id = kEos;
  o.num_beams = 64;
  o.num_return_sequences = 5;
  const TokenRows prefixes = {{0}, {2}};
  Bigram model;
  absl::StatusOr<TokenRows> got = BeamSearch(model, prefixes, kV, o);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 10u);
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<std::vector<int64_t>> ranked = RankByEnumeration(prefixes[b][0], 3, 1.0);
    for (int64_t j = 0; j < 5; ++j) {
      EXPECT_EQ((*got)[b * 5 + j], ranked[j]) << "example " << b << ", rank " << j;
    }
  }
  // Scored by sum alone (length_penalty 0), eos at once is the best from 1
  // and from 2; the minimum rules it out.
  o.num_return_sequences = 1;
  o.min_new_tokens = 2;
  o.length_penalty = 0.0;
  const TokenRows starts = {{1}, {2}};
  Bigram again;
  got = BeamSearch(again, starts, kV, o);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<int64_t> best = RankByEnumeration(starts[b][0], 3, 0.0, 2)[0];
    EXPECT_EQ((*got)[b], best) << "example " << b;
    EXPECT_EQ(RankByEnumeration(starts[b][0], 3, 0.0)[0], (std::vector<int64_t>{kEos}));
  }
  // Rows drawn one at a time: 2 -> eos is the likeliest, so with the minimum
  // the row takes 1 (0.33), then 1 -> 1 (0.55).
  Bigram rows;
  absl::StatusOr<TokenRows> drawn = SampleRows(rows, {{2}}, kV, o);
  ASSERT_TRUE(drawn.ok()) << drawn.status();
  EXPECT_EQ((*drawn)[0], (std::vector<int64_t>{1, 1, 1}));
}

TEST(BeamSearchTest, OneBeamIsGreedyAndEarlyStoppingStopsAtKHypotheses) {
  Decoding o;
  o.temperature = 0.0;
  o.max_new_tokens = 6;
  o.eos_id = kEos;
  o.num_beams = 1;  // BeamSearch with one beam: the greedy path
  Bigram model;
  absl::StatusOr<TokenRows> one = BeamSearch(model, {{2}}, kV, o);
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<TokenRows> greedy = SampleRows(model, {{2}}, kV, o);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_EQ((*one)[0], (*greedy)[0]);
  EXPECT_EQ((*greedy)[0], (std::vector<int64_t>{3}));  // 2 -> eos is the likeliest

  // From 1: 1 1 1 ... (0.55 each), eos at 0.25. With 2 beams and
  // early_stopping the search ends at the second finished hypothesis.
  o.num_beams = 2;
  o.early_stopping = true;
  Bigram two;
  absl::StatusOr<TokenRows> early = BeamSearch(two, {{1}}, kV, o);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_LT(two.calls, o.max_new_tokens);
  EXPECT_EQ((*early)[0].back(), kEos);
}

TEST(SampleRowsTest, RowsStopAtEosAndOnTokenMarksThemEnded) {
  Decoding o;
  o.temperature = 0.0;
  o.max_new_tokens = 5;
  o.eos_id = kEos;
  Bigram model;
  std::vector<std::vector<int64_t>> seen;
  absl::StatusOr<TokenRows> got =
      SampleRows(model, {{2}, {0}}, kV, o, [&](int64_t n, absl::Span<const int64_t> tokens) {
        EXPECT_EQ(n, static_cast<int64_t>(seen.size()));
        seen.emplace_back(tokens.begin(), tokens.end());
      });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], (std::vector<int64_t>{3}));              // 2 -> eos
  EXPECT_EQ((*got)[1], (std::vector<int64_t>{0, 0, 0, 0, 0}));  // 0 -> 0 (0.5) all the way
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0], (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(seen[1], (std::vector<int64_t>{-1, 0}));

  Bigram both;
  absl::StatusOr<TokenRows> ended = SampleRows(both, {{2}, {2}}, kV, o);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(both.calls, 1);  // no step once every row ended
}

TEST(DecodingTest, OptionsAreCheckedByName) {
  const auto message = [](Decoding o) { return std::string(o.Validate(kV).message()); };
  Decoding o;
  EXPECT_TRUE(o.Validate(kV).ok());
  o.max_new_tokens = -1;
  EXPECT_EQ(message(o), "max_new_tokens=-1 must be >= 0");
  o = {};
  o.eos_id = kV;
  EXPECT_EQ(message(o), "eos_id=4 is not an id of the vocabulary of 4 (nor -1)");
  o = {};
  o.num_beams = 0;
  EXPECT_EQ(message(o), "num_beams=0 must be >= 1");
  o = {};
  o.min_new_tokens = 40;
  EXPECT_EQ(message(o), "min_new_tokens=40 must be in [0, max_new_tokens=32]");
  o = {};
  o.num_beams = 2;
  o.num_return_sequences = 3;
  EXPECT_EQ(
      message(o),
      "num_return_sequences=3 must be in [1, num_beams=2] (the hypotheses beam search keeps)");
  o = {};
  o.length_penalty = std::nan("");
  EXPECT_EQ(message(o), "length_penalty=nan must be finite");
  o = {};
  o.top_p = 0.0;  // Sampling's own
  EXPECT_NE(message(o).find("top_p"), std::string::npos);

  o = {};
  EXPECT_EQ(o.Describe(), "sampled");
  o.temperature = 0.0;
  o.num_beams = 3;
  o.no_repeat_ngram_size = 2;
  EXPECT_EQ(o.Describe(), "3 beams, greedy, no_repeat_ngram_size 2");
}

}  // namespace
}  // namespace train
