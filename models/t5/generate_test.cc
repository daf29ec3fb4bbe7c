// T5 generation with the decoder's key/value cache: DecodeStep over a
// sequence fed in pieces gives DecodeLogits' logits for the whole sequence
// (v1.0 tied and v1.1 gated, a padded encoder batch, relative positions past
// the exact buckets); Generate gives the same tokens with and without the
// cache, greedy and sampled; sampling follows the seed and top_k 1 is greedy;
// beam search finds the best sequence; sampled beams draw without
// replacement; misuse is a named error.
#include "models/t5/generate.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/testing.h"

namespace t5 {
namespace {

using tensor::Tensor;

T5Config Tiny(bool v1_1) {
  T5Config c;
  c.name = "tiny";
  c.vocab_size = 29;
  c.d_model = 16;
  c.num_heads = 2;
  c.d_kv = 8;
  c.d_ff = 32;
  c.num_layers = 2;
  c.num_decoder_layers = 3;
  // Four exact buckets of the decoder's eight: positions more than 4 apart
  // fall in the log-spaced ones.
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  c.dropout_rate = 0.1f;  // off in eval mode
  if (v1_1) {
    c.feed_forward_proj = FeedForwardProj::kGatedGelu;
    c.tie_word_embeddings = false;
  }
  return c;
}

Tensor Ids(std::vector<int64_t> v, int64_t B, int64_t T) {
  return Tensor::FromData<int64_t>(v, {B, T});
}

// Two examples, the second with two padded positions.
const Tensor& EncoderInputs() {
  static const Tensor* x = new Tensor(Ids({3, 7, 1, 12, 5, 9, 4, 4, 8, 2, 0, 0}, 2, 6));
  return *x;
}
const Tensor& EncoderMask() {
  static const Tensor* m = new Tensor(Ids({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 2, 6));
  return *m;
}

// Generate's rows with the key/value cache, checked equal to those of the
// decoder run over the whole sequence at every step (empty after a failure).
std::vector<std::vector<int64_t>> GenerateBothWays(T5Model& model, const Tensor& x,
                                                   const Tensor& mask, GenerateOptions options) {
  options.kv_cache = true;
  absl::StatusOr<std::vector<std::vector<int64_t>>> cached = Generate(model, x, mask, options);
  options.kv_cache = false;
  absl::StatusOr<std::vector<std::vector<int64_t>>> whole = Generate(model, x, mask, options);
  EXPECT_TRUE(cached.ok()) << cached.status();
  EXPECT_TRUE(whole.ok()) << whole.status();
  if (!cached.ok() || !whole.ok()) return {};
  EXPECT_EQ(*cached, *whole) << "with the cache and without";
  return *cached;
}

class T5GenerateTest : public ::testing::TestWithParam<bool> {
 protected:
  T5GenerateTest() : model_(Tiny(GetParam())) {
    model_.Materialize(/*seed=*/11);
    model_.Train(false);
  }
  T5Model model_;
};

TEST_P(T5GenerateTest, StepsInPiecesGiveTheWholeSequencesLogits) {
  const int64_t B = 2, T = 10;
  std::vector<int64_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (7 * i + 3) % 29;
  const Tensor decoder_inputs = Ids(ids, B, T);                                      // (B, T)
  const Tensor encoded = model_.Encode(EncoderInputs(), EncoderMask());              // (B, S, d)
  const Tensor whole = model_.DecodeLogits(encoded, EncoderMask(), decoder_inputs);  // (B, T, V)
  DecoderCache cache;
  cache.capacity = T;
  int64_t start = 0;
  for (int64_t piece : {3, 1, 1, 4, 1}) {  // the prompt, then single positions and a chunk
    SCOPED_TRACE(::testing::Message() << "positions " << start << " + " << piece);
    const Tensor got = model_.DecodeStep(encoded, EncoderMask(),
                                         decoder_inputs.Narrow(1, start, piece).Contiguous(),
                                         cache);  // (B, piece, V)
    ASSERT_EQ(got.shape(), tensor::Shape({B, piece, 29}));
    EXPECT_TRUE(
        tensor::testing::AllClose(got, whole.Narrow(1, start, piece).Contiguous(), 1e-5, 1e-5));
    start += piece;
    EXPECT_EQ(cache.length(), start);
  }
  ASSERT_EQ(cache.blocks.size(), 3u);
  EXPECT_EQ(cache.blocks[0].cross.length, 6);  // the encoder's positions, computed once
}

TEST_P(T5GenerateTest, TheCacheGivesTheSameTokensGreedyAndSampled) {
  GenerateOptions options;
  options.max_new_tokens = 12;
  for (double temperature : {0.0, 1.0}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << temperature);
    options.temperature = temperature;
    const std::vector<std::vector<int64_t>> rows =
        GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].size(), 12u);
  }
}

TEST_P(T5GenerateTest, SamplingFollowsTheSeedAndTopKOneIsGreedy) {
  GenerateOptions options;
  options.max_new_tokens = 16;
  absl::StatusOr<std::vector<std::vector<int64_t>>> greedy =
      Generate(model_, EncoderInputs(), EncoderMask(), options);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  options.temperature = 1.0;
  options.top_k = 1;
  EXPECT_EQ(*Generate(model_, EncoderInputs(), EncoderMask(), options), *greedy);
  // A random tiny model's distributions are wide: at temperature 2 the draws
  // of different seeds differ, and a seed repeats its draws.
  options.top_k = 0;
  options.temperature = 2.0;
  std::set<std::vector<std::vector<int64_t>>> seen;
  for (uint64_t seed : {1, 2, 3}) {
    options.seed = seed;
    absl::StatusOr<std::vector<std::vector<int64_t>>> a =
        Generate(model_, EncoderInputs(), EncoderMask(), options);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(*Generate(model_, EncoderInputs(), EncoderMask(), options), *a) << "seed " << seed;
    EXPECT_NE(*a, *greedy) << "seed " << seed;
    seen.insert(*a);
  }
  EXPECT_EQ(seen.size(), 3u);
}

// Whether `sequence` holds some n-gram twice.
bool RepeatsAnNgram(const std::vector<int64_t>& sequence, size_t n) {
  std::set<std::vector<int64_t>> seen;
  for (size_t i = 0; i + n <= sequence.size(); ++i) {
    if (!seen.insert(std::vector<int64_t>(sequence.begin() + i, sequence.begin() + i + n)).second) {
      return true;
    }
  }
  return false;
}

// A random tiny model's greedy rows repeat themselves; with
// no_repeat_ngram_size 2 no row's decoder inputs (decoder_start_id, then
// its tokens) hold a pair twice, greedy, sampled or in beam search, with the
// cache and without. repetition_penalty changes the greedy rows.
TEST_P(T5GenerateTest, NoRepeatNgramAndRepetitionPenaltyAsHuggingFace) {
  GenerateOptions options;
  options.max_new_tokens = 20;
  const std::vector<std::vector<int64_t>> plain =
      GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options);
  ASSERT_EQ(plain.size(), 2u);
  const auto with_start = [&](const std::vector<int64_t>& row) {
    std::vector<int64_t> s = {options.decoder_start_id};
    s.insert(s.end(), row.begin(), row.end());
    return s;
  };
  EXPECT_TRUE(RepeatsAnNgram(with_start(plain[0]), 2) || RepeatsAnNgram(with_start(plain[1]), 2));
  options.no_repeat_ngram_size = 2;
  for (int64_t beams : {1, 3}) {
    for (double temperature : {0.0, 1.0}) {
      if (beams > 1 && temperature > 0) continue;  // beams are greedy
      SCOPED_TRACE(::testing::Message() << beams << " beams, temperature " << temperature);
      options.num_beams = beams;
      options.temperature = temperature;
      const std::vector<std::vector<int64_t>> rows =
          GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options);
      ASSERT_EQ(rows.size(), 2u);
      for (const std::vector<int64_t>& row : rows) {
        EXPECT_EQ(row.size(), 20u);
        EXPECT_FALSE(RepeatsAnNgram(with_start(row), 2));
      }
    }
  }
  options = GenerateOptions();
  options.max_new_tokens = 20;
  options.repetition_penalty = 3.0;
  EXPECT_NE(GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options), plain);
}

INSTANTIATE_TEST_SUITE_P(Forms, T5GenerateTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "v1_1" : "v1_0";
                         });

// log softmax of `logits` (V) at `v`, in double.
double LogProb(const std::vector<float>& logits, int64_t v) {
  double top = logits[0];
  for (float x : logits) top = std::max<double>(top, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - top);
  return logits[v] - top - std::log(sum);
}

// Beam search finds the best-scoring hypothesis outright when its beams can
// hold every prefix: a vocabulary of 6, 3 new tokens, 36 beams. The
// search's pick for each example is the best of every complete sequence
// (ended by eos, or 3 tokens long) scored sum log p / length^length_penalty,
// as one-by-one forwards of each sequence give them. With the cache and
// without: the same pick.
TEST(T5BeamSearchTest, EnoughBeamsFindTheBestSequenceOutright) {
  T5Config config = Tiny(true);
  config.vocab_size = 6;
  config.initializer_factor = 0.3;  // flatter distributions: lengths compete
  T5Model model(config);
  model.Materialize(/*seed=*/3);
  model.Train(false);
  const Tensor x = Ids({3, 5, 1, 2, 4, 0, 4, 4, 2, 5, 0, 0}, 2, 6);
  const Tensor encoded = model.Encode(x, EncoderMask());  // (2, 6, d)
  // eos 3, the likeliest token: lengths compete (picks [3] and [1, 4, 3]);
  // eos 1: three tokens win, the running beams' finish ([3, 3, 3]).
  for (const auto& [eos, length_penalty] :
       std::vector<std::pair<int64_t, double>>{{3, 1.0}, {3, 0.5}, {3, 2.0}, {1, 1.0}, {1, 2.0}}) {
    SCOPED_TRACE(::testing::Message() << "eos " << eos << " length_penalty " << length_penalty);
    GenerateOptions options;
    options.max_new_tokens = 3;
    options.eos_id = eos;
    options.num_beams = 36;
    options.length_penalty = length_penalty;
    const std::vector<std::vector<int64_t>> found =
        GenerateBothWays(model, x, EncoderMask(), options);
    ASSERT_EQ(found.size(), 2u);
    for (int64_t b = 0; b < 2; ++b) {
      const Tensor enc = encoded.Narrow(0, b, 1).Contiguous();  // (1, 6, d)
      const Tensor mask = EncoderMask().Narrow(0, b, 1).Contiguous();
      // Every sequence of 1 to 3 new tokens with eos, if any, last.
      std::vector<int64_t> best;
      double best_score = -1e300;
      std::vector<std::vector<int64_t>> frontier = {{}};
      for (int64_t length = 1; length <= 3; ++length) {
        std::vector<std::vector<int64_t>> longer;
        for (const std::vector<int64_t>& prefix : frontier) {
          std::vector<int64_t> inputs = {0};  // decoder_start_id, then the prefix
          inputs.insert(inputs.end(), prefix.begin(), prefix.end());
          const std::vector<float> all =
              model.DecodeLogits(enc, mask, Ids(inputs, 1, length)).ToVector<float>();  // (1, L, 6)
          double sum = 0.0;  // the prefix's log-probability
          for (int64_t i = 0; i + 1 < length; ++i) {
            sum += LogProb(std::vector<float>(all.begin() + i * 6, all.begin() + (i + 1) * 6),
                           prefix[i]);
          }
          const std::vector<float> last(all.end() - 6, all.end());
          for (int64_t v = 0; v < 6; ++v) {
            std::vector<int64_t> s = prefix;
            s.push_back(v);
            const double total = sum + LogProb(last, v);
            if (v == eos || length == 3) {
              const double score = total / std::pow(static_cast<double>(length), length_penalty);
              if (score > best_score) {
                best_score = score;
                best = s;
              }
            } else {
              longer.push_back(s);
            }
          }
        }
        frontier = std::move(longer);
      }
      EXPECT_EQ(found[b], best) << "example " << b;
    }
  }
}

// Up to 10 new tokens from Tiny(false), eos 2, with its greedy rows.
class T5TenTokensTest : public ::testing::Test {
 protected:
  T5TenTokensTest() : model_(Tiny(false)) {
    model_.Materialize(/*seed=*/11);
    options_.max_new_tokens = 10;
    options_.eos_id = 2;
    greedy_ = *Generate(model_, EncoderInputs(), EncoderMask(), options_);
  }
  T5Model model_;
  GenerateOptions options_;
  std::vector<std::vector<int64_t>> greedy_;
};

// Both examples' picks end at their one eos (2) or run 10 new tokens.
void ExpectEndsAtEos2OrRuns10(const std::vector<std::vector<int64_t>>& picks) {
  ASSERT_EQ(picks.size(), 2u);
  for (const std::vector<int64_t>& row : picks) {
    ASSERT_FALSE(row.empty());
    EXPECT_TRUE(row.back() == 2 || row.size() == 10u);
    EXPECT_EQ(std::count(row.begin(), row.end(), 2), row.back() == 2 ? 1 : 0);
  }
}

// Beams with the cache and without agree on a longer search, each pick ends
// at eos or runs max_new_tokens, and the search differs from greedy
// somewhere (it is a search).
TEST_F(T5TenTokensTest, CachedAndUncachedBeamsAgree) {
  bool differs = false;
  for (int64_t beams : {2, 4}) {
    options_.num_beams = beams;
    SCOPED_TRACE(::testing::Message() << beams << " beams");
    const std::vector<std::vector<int64_t>> cached =
        GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options_);
    ExpectEndsAtEos2OrRuns10(cached);
    differs = differs || cached != greedy_;
  }
  EXPECT_TRUE(differs);
}

// Sampled beams (Hugging Face's beam sampling) with top_k 1: each beam has
// one continuation, its greedy token, so beam 0 follows greedy decoding and
// the others (copies of it at -1e9, drawn only to fill the 2K) lose to it:
// the greedy rows, with the cache and without.
TEST_F(T5TenTokensTest, SampledBeamsWithTopKOneGiveTheGreedyRows) {
  options_.temperature = 1.3;
  options_.top_k = 1;
  for (int64_t beams : {2, 3}) {
    options_.num_beams = beams;
    SCOPED_TRACE(::testing::Message() << beams << " beams");
    EXPECT_EQ(GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options_), greedy_);
  }
}

// One new token from 2 sampled beams: 2K = 4 continuations are drawn
// without replacement from softmax(log p / T) (beam 0's; its copy starts at
// -1e9) and the likeliest of the four is the pick. So token v is picked with
// the probability of the ordered draws of 4 distinct tokens whose likeliest
// is v (p_a p_b / (1 - p_a) p_c / (1 - p_a - p_b) ...); checked against the
// picks of 3000 seeds for both examples.
TEST(T5BeamSampleTest, PicksFollowDrawsWithoutReplacement) {
  T5Config config = Tiny(true);
  config.vocab_size = 6;
  config.initializer_factor = 0.3;  // flatter distributions
  T5Model model(config);
  model.Materialize(/*seed=*/3);
  model.Train(false);
  const Tensor x = Ids({3, 5, 1, 2, 4, 0, 4, 4, 2, 5, 0, 0}, 2, 6);
  const Tensor encoded = model.Encode(x, EncoderMask());  // (2, 6, d)
  constexpr double kTemperature = 1.5;
  std::vector<std::vector<double>> want(2, std::vector<double>(6, 0.0));
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<float> logits =
        model
            .DecodeLogits(encoded.Narrow(0, b, 1).Contiguous(),
                          EncoderMask().Narrow(0, b, 1).Contiguous(), Ids({0}, 1, 1))
            .ToVector<float>();  // (1, 1, 6)
    std::vector<double> p(6);
    double z = 0.0;
    for (int64_t v = 0; v < 6; ++v) z += p[v] = std::exp(LogProb(logits, v) / kTemperature);
    for (double& q : p) q /= z;
    // Every ordered draw (t0, t1, t2, t3) of distinct tokens.
    for (int64_t t0 = 0; t0 < 6; ++t0) {
      for (int64_t t1 = 0; t1 < 6; ++t1) {
        for (int64_t t2 = 0; t2 < 6; ++t2) {
          for (int64_t t3 = 0; t3 < 6; ++t3) {
            const std::set<int64_t> drawn = {t0, t1, t2, t3};
            if (drawn.size() != 4) continue;
            const double probability = p[t0] * p[t1] / (1 - p[t0]) * p[t2] / (1 - p[t0] - p[t1]) *
                                       p[t3] / (1 - p[t0] - p[t1] - p[t2]);
            const int64_t pick = *std::max_element(
                drawn.begin(), drawn.end(), [&p](int64_t a, int64_t c) { return p[a] < p[c]; });
            want[b][pick] += probability;
          }
        }
      }
    }
  }
  GenerateOptions options;
  options.max_new_tokens = 1;
  options.num_beams = 2;
  options.temperature = kTemperature;
  constexpr int kSeeds = 3000;
  std::vector<std::vector<double>> got(2, std::vector<double>(6, 0.0));
  for (int seed = 1; seed <= kSeeds; ++seed) {
    options.seed = seed;
    const std::vector<std::vector<int64_t>> picks = *Generate(model, x, EncoderMask(), options);
    for (int64_t b = 0; b < 2; ++b) {
      ASSERT_EQ(picks[b].size(), 1u);
      got[b][picks[b][0]] += 1.0 / kSeeds;
    }
  }
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t v = 0; v < 6; ++v) {
      EXPECT_NEAR(got[b][v], want[b][v], 0.03) << "example " << b << ", token " << v;
    }
  }
}

// Sampled beams with top_k and top_p: the same with the cache and without,
// the same again for the same seed, another search for another seed; each
// pick ends at eos or runs max_new_tokens.
TEST_F(T5TenTokensTest, SampledBeamsFollowTheSeedWithAndWithoutTheCache) {
  options_.num_beams = 3;
  options_.temperature = 1.5;
  options_.top_k = 8;
  options_.top_p = 0.95;
  std::set<std::vector<std::vector<int64_t>>> searches;
  std::vector<std::vector<int64_t>> first;  // seed 1's
  for (uint64_t seed : {1, 2, 3, 1}) {
    options_.seed = seed;
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const std::vector<std::vector<int64_t>> picks =
        GenerateBothWays(model_, EncoderInputs(), EncoderMask(), options_);
    ExpectEndsAtEos2OrRuns10(picks);
    if (seed == 1 && !first.empty()) {
      EXPECT_EQ(picks, first) << "seed 1 again";
    }
    if (first.empty()) first = picks;
    searches.insert(picks);
  }
  EXPECT_GE(searches.size(), 2u) << "every seed gave the same picks";
}

// What went wrong, said where it went wrong.
TEST(T5DecodeStepTest, MisuseIsANamedError) {
  T5Model model(Tiny(false));
  model.Materialize(/*seed=*/11);
  const Tensor encoded = [&] {
    model.Train(false);
    return model.Encode(EncoderInputs(), EncoderMask());
  }();
  auto message = [&](DecoderCache& cache, const Tensor& ids) {
    try {
      model.DecodeStep(encoded, EncoderMask(), ids, cache);
    } catch (const tensor::OpError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DecoderCache none;
  EXPECT_NE(message(none, Ids({0, 0}, 2, 1)).find("the decoder cache has no capacity"),
            std::string::npos);
  DecoderCache small;
  small.capacity = 2;
  EXPECT_NE(message(small, Ids({0, 0, 4, 4, 5, 5}, 2, 3))
                .find("the cache holds 2 positions; 0 + 3 do not fit"),
            std::string::npos);
  DecoderCache cache;
  cache.capacity = 4;
  EXPECT_EQ(message(cache, Ids({0, 0}, 2, 1)), "no error");
  EXPECT_NE(message(cache, Ids({0}, 1, 1)).find("with the encoder's batch 2"), std::string::npos);
  model.Train(true);
  EXPECT_NE(message(cache, Ids({0, 0}, 2, 1)).find("decoding runs in eval mode"),
            std::string::npos);
  model.Train(false);
  GenerateOptions bad;
  bad.top_p = 0.0;
  EXPECT_EQ(Generate(model, EncoderInputs(), EncoderMask(), bad).status().message(),
            "top_p must be in (0, 1], got 0");
  bad = GenerateOptions();
  bad.num_beams = 0;
  EXPECT_EQ(Generate(model, EncoderInputs(), EncoderMask(), bad).status().message(),
            "num_beams=0 must be >= 1");
  // Sampled beams that run out of tokens no_repeat_ngram_size 1 allows: each
  // row has 28 new ids (29 less decoder_start_id) to give.
  bad.num_beams = 2;
  bad.temperature = 1.0;
  bad.no_repeat_ngram_size = 1;
  bad.max_new_tokens = 40;
  EXPECT_EQ(Generate(model, EncoderInputs(), EncoderMask(), bad).status().message(),
            "example 0, new token 28: every continuation is excluded (no_repeat_ngram_size "
            "leaves none)");
  bad.temperature = 0.0;  // greedy beams: those left at -inf do not count as hypotheses
  EXPECT_EQ(Generate(model, EncoderInputs(), EncoderMask(), bad).status().message(),
            "example 0: every continuation is excluded (no_repeat_ngram_size leaves none)");
  DecoderCache two;
  two.capacity = 4;
  model.DecodeStep(encoded, EncoderMask(), Ids({0, 0}, 2, 1), two);
  try {
    two.SelectRows({0, 2});
    ADD_FAILURE() << "row 2 of 2 taken";
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2 of a cache of 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace t5
