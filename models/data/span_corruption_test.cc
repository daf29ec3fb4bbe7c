// T5 span corruption: the paper's example by hand, T5's lengths, exact
// reconstruction of the original sequence from (inputs, targets), noise density
// and span lengths over many samples, padding and shifted decoder inputs,
// byte-text vocabulary, determinism, rank split, resume, and errors.
#include "models/data/span_corruption.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/data/byte_text.h"
#include "models/data/random_tokens.h"
#include "models/data/token_file.h"

namespace data {
namespace {

std::vector<int64_t> Row(const tensor::Tensor& t, int64_t b) {
  const int64_t n = t.dim(1);
  const int64_t* p = t.data<int64_t>() + b * n;
  return std::vector<int64_t>(p, p + n);
}

SpanCorruptionLoader MakeLoader(std::shared_ptr<const TokenSource> source, DataParallel layout,
                                const SpanCorruptionOptions& options) {
  auto loader = SpanCorruptionLoader::Create(std::move(source), layout, options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return *std::move(loader);
}

// Rebuilds the original tokens: each sentinel of the encoder input is replaced
// by the tokens that follow the same sentinel in the targets. Sentinels are the
// ids >= source_vocab; the lengths leave out EOS, the final sentinel and
// padding. Written independently of the library.
std::vector<int64_t> Reconstruct(const std::vector<int64_t>& encoder, int64_t encoder_len,
                                 const std::vector<int64_t>& targets, int64_t target_len,
                                 int64_t source_vocab) {
  std::map<int64_t, std::vector<int64_t>> spans;
  int64_t current = -1;
  for (int64_t i = 0; i < target_len; ++i) {
    const int64_t id = targets[i];
    if (id >= source_vocab) {
      current = id;
      EXPECT_EQ(spans.count(id), 0u) << "sentinel " << id << " twice in the targets";
      spans[id];
    } else {
      EXPECT_NE(current, -1) << "target token before any sentinel";
      spans[current].push_back(id);
    }
  }
  std::vector<int64_t> out;
  for (int64_t i = 0; i < encoder_len; ++i) {
    const int64_t id = encoder[i];
    if (id >= source_vocab) {
      EXPECT_EQ(spans.count(id), 1u) << "sentinel " << id << " has no span in the targets";
      EXPECT_FALSE(spans[id].empty()) << "empty span for sentinel " << id;
      out.insert(out.end(), spans[id].begin(), spans[id].end());
    } else {
      out.push_back(id);
    }
  }
  return out;
}

TEST(SpanCorruptionTest, ThePapersExampleByHand) {
  // "Thank you for inviting me to your party last week" as ids 0..9; drop
  // "for inviting" and "last".
  SpanCorruptionOptions o;
  o.encoder_length = 9;
  o.noise_density = 0.3;
  o.mean_noise_span_length = 1.5;
  o.num_sentinels = 3;
  auto c = SpanCorruptor::Create(/*source_vocab_size=*/10, o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->raw_length(), 10);
  EXPECT_EQ(c->counts().num_noise, 3);
  EXPECT_EQ(c->counts().num_spans, 2);
  EXPECT_EQ(c->vocab_size(), 13);
  EXPECT_EQ(c->SentinelId(0), 12);  // <extra_id_0> is the top id
  EXPECT_EQ(c->SentinelId(2), 10);
  ASSERT_EQ(c->decoder_length(), 6);

  const std::vector<int64_t> tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<bool> noise(10, false);
  noise[2] = noise[3] = noise[8] = true;
  std::vector<int64_t> enc(9), mask(9), dec_in(6), dec_tgt(6);
  c->Corrupt(tokens, noise, absl::MakeSpan(enc), absl::MakeSpan(mask), absl::MakeSpan(dec_in),
             absl::MakeSpan(dec_tgt));
  EXPECT_EQ(enc, (std::vector<int64_t>{0, 1, 12, 4, 5, 6, 7, 11, 9}));
  EXPECT_EQ(mask, std::vector<int64_t>(9, 1));
  EXPECT_EQ(dec_tgt, (std::vector<int64_t>{12, 2, 3, 11, 8, 10}));
  EXPECT_EQ(dec_in, (std::vector<int64_t>{0, 12, 2, 3, 11, 8}));
  const std::vector<std::string> words = {"Thank", "you",  "for",   "inviting", "me",
                                          "to",    "your", "party", "last",     "week"};
  auto decode = [&](absl::Span<const int64_t> ids) {
    std::string s;
    for (int64_t id : ids) s += " " + words[id];
    return s + " ";
  };
  EXPECT_EQ(c->Render(enc, decode), " Thank you <extra_id_0> me to your party <extra_id_1> week ");
  EXPECT_EQ(c->Render(dec_tgt, decode), "<extra_id_0> for inviting <extra_id_1> last <extra_id_2>");
}

TEST(SpanCorruptionTest, LengthsMatchT5) {
  // T5 (compute_input_and_target_lengths): inputs_length 512 with EOS takes
  // 568 raw tokens, 85 of them noise in 28 spans; T5's targets are 114 tokens
  // (noise + spans + EOS); ours add the final sentinel: 115.
  SpanCorruptionOptions o;
  o.encoder_length = 512;
  o.eos_id = 1;
  auto c = SpanCorruptor::Create(32000, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->raw_length(), 568);
  EXPECT_EQ(c->counts().num_noise, 85);
  EXPECT_EQ(c->counts().num_spans, 28);
  EXPECT_EQ(c->encoder_tokens(), 512);
  EXPECT_EQ(c->target_tokens(), 115);
  EXPECT_EQ(c->decoder_length(), 115);
}

TEST(SpanCorruptionTest, ComputeSpanCountsClamps) {
  const SpanCounts two = ComputeSpanCounts(2, 0.15, 3.0);
  EXPECT_EQ(two.num_noise, 1);
  EXPECT_EQ(two.num_spans, 1);
  const SpanCounts dense = ComputeSpanCounts(10, 0.99, 1.0);
  EXPECT_EQ(dense.num_noise, 9);
  EXPECT_EQ(dense.num_spans, 1);  // only one non-noise token to separate spans
}

// T5's compute_input_and_target_lengths, one token at a time (what Create's
// binary search must agree with).
int64_t LinearRawLength(const SpanCorruptionOptions& o) {
  const int64_t eos = o.eos_id >= 0 ? 1 : 0;
  auto encoder_tokens = [&](int64_t length) {
    const SpanCounts c = ComputeSpanCounts(length, o.noise_density, o.mean_noise_span_length);
    return length - c.num_noise + c.num_spans + eos;
  };
  int64_t length = 2;
  while (encoder_tokens(length + 1) <= o.encoder_length) ++length;
  return length;
}

TEST(SpanCorruptionTest, AutomaticRawLengthIsT5sLoops) {
  for (double density : {0.01, 0.15, 0.3, 0.5, 0.8, 0.95, 0.99}) {
    for (double mean : {1.0, 3.0, 7.5}) {
      for (int64_t encoder_length : {3, 8, 57, 512, 2048}) {
        for (int64_t eos_id : {-1, 1}) {
          SpanCorruptionOptions o;
          o.encoder_length = encoder_length;
          o.noise_density = density;
          o.mean_noise_span_length = mean;
          o.eos_id = eos_id;
          o.num_sentinels = 100000;
          auto c = SpanCorruptor::Create(32000, o);
          if (!c.ok()) continue;  // encoder_length too short for one span
          EXPECT_EQ(c->raw_length(), LinearRawLength(o))
              << "density " << density << " mean " << mean << " S " << encoder_length
              << " eos " << eos_id;
        }
      }
    }
  }
}

TEST(SpanCorruptionTest, NoiseDensityNearOneIsRefusedQuickly) {
  // Only ~1 token is kept whatever the length: T5's loop would run ~1e12
  // times. Refused at once, naming the density and the encoder length.
  SpanCorruptionOptions o;
  o.encoder_length = 512;
  o.noise_density = 1 - 1e-10;
  auto c = SpanCorruptor::Create(32000, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("noise_density 0.9999999999 (mean_noise_span_length 3) "
                                      "keeps too few tokens: filling encoder_length 512 would "
                                      "take more than 512000 raw tokens"),
            absl::string_view::npos)
      << c.status();
  // The loader says the same.
  std::shared_ptr<const TokenSource> source = *RandomTokenSource::Create(2, 500);
  auto loader = SpanCorruptionLoader::Create(source, {1, 0, 1}, o);
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find("noise_density 0.9999999999"),
            absl::string_view::npos)
      << loader.status();
  // An explicit raw_length still works at that density.
  o.raw_length = 1000;
  EXPECT_TRUE(SpanCorruptor::Create(32000, o).ok());
}

struct Case {
  std::string name;
  int source;  // 0 random tokens, 1 byte text
  int64_t encoder_length;
  int64_t extra_decoder;  // decoder_length beyond what the targets need
  int64_t eos_id;
  int64_t raw_length = 0;  // 0: automatic (the encoder input is full)
};

class ReconstructionTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReconstructionTest, InputsPlusTargetsGiveBackTheOriginal) {
  const Case& k = GetParam();
  std::shared_ptr<const TokenSource> source;
  if (k.source == 0) {
    source = *RandomTokenSource::Create(4, 1000);
  } else {
    source = *ByteTextSource::OpenDefault(4);
  }
  SpanCorruptionOptions o;
  o.encoder_length = k.encoder_length;
  o.eos_id = k.eos_id;
  o.raw_length = k.raw_length;
  o.seed = 77;
  auto probe = SpanCorruptor::Create(source->vocab_size(), o);
  ASSERT_TRUE(probe.ok()) << probe.status();
  o.decoder_length = probe->target_tokens() + k.extra_decoder;
  SpanCorruptionLoader loader = MakeLoader(source, {8, 1, 2}, o);
  const SpanCorruptor& c = loader.corruptor();
  const int64_t S = c.encoder_length(), Td = c.decoder_length(), L = c.raw_length();
  const int64_t V = source->vocab_size();
  if (k.raw_length == 0) {
    EXPECT_EQ(c.encoder_tokens(), S) << "automatic raw length fills the encoder";
  } else {
    EXPECT_EQ(L, k.raw_length);
    EXPECT_LT(c.encoder_tokens(), S) << "the case should exercise encoder padding";
  }
  std::vector<int64_t> original(L);
  for (int64_t step = 0; step < 25; ++step) {
    const Seq2SeqBatch batch = loader.Batch(step);
    ASSERT_EQ(batch.encoder_inputs.shape(), tensor::Shape({8, S}));
    ASSERT_EQ(batch.encoder_mask.shape(), tensor::Shape({8, S}));
    ASSERT_EQ(batch.decoder_inputs.shape(), tensor::Shape({8, Td}));
    ASSERT_EQ(batch.decoder_targets.shape(), tensor::Shape({8, Td}));
    ASSERT_EQ(batch.decoder_targets.dtype(), tensor::Dtype::kI64);
    for (int64_t b = 0; b < 8; ++b) {
      const auto enc = Row(batch.encoder_inputs, b), mask = Row(batch.encoder_mask, b);
      const auto dec_in = Row(batch.decoder_inputs, b), tgt = Row(batch.decoder_targets, b);
      // Lengths and padding.
      const int64_t enc_len = c.encoder_tokens(), tgt_len = c.target_tokens();
      for (int64_t i = 0; i < S; ++i) {
        ASSERT_EQ(mask[i], i < enc_len ? 1 : 0) << i;
        if (i >= enc_len) {
          ASSERT_EQ(enc[i], o.pad_id) << i;
        }
      }
      for (int64_t i = 0; i < Td; ++i) {
        ASSERT_EQ(tgt[i] == -100, i >= tgt_len) << i;
      }
      // Decoder inputs: start token, then targets shifted right, pad for padding.
      ASSERT_EQ(dec_in[0], 0);
      for (int64_t i = 1; i < Td; ++i) {
        ASSERT_EQ(dec_in[i], tgt[i - 1] == -100 ? o.pad_id : tgt[i - 1]) << i;
      }
      // Sentinels in order: <extra_id_0>, <extra_id_1>, ... in the input; the
      // targets start with <extra_id_0> and end with the final sentinel (+ EOS).
      int64_t next = 0;
      for (int64_t i = 0; i < enc_len; ++i) {
        if (enc[i] < V) continue;
        ASSERT_EQ(enc[i], c.SentinelId(next++));
        if (i > 0) {
          ASSERT_LT(enc[i - 1], V) << "adjacent sentinels";
        }
      }
      ASSERT_EQ(next, c.counts().num_spans);
      ASSERT_EQ(tgt[0], c.SentinelId(0));
      const int64_t last = tgt_len - 1 - (k.eos_id >= 0 ? 1 : 0);
      ASSERT_EQ(tgt[last], c.SentinelId(c.counts().num_spans));
      if (k.eos_id >= 0) {
        ASSERT_EQ(tgt[tgt_len - 1], k.eos_id);
        ASSERT_EQ(enc[enc_len - 1], k.eos_id);
      }
      // The check that matters: the original sequence comes back exactly.
      source->SampleSequence(step, /*row=*/8 + b, absl::MakeSpan(original));
      const int64_t kept = enc_len - (k.eos_id >= 0 ? 1 : 0);
      ASSERT_EQ(Reconstruct(enc, kept, tgt, last, V), original) << "step " << step << " row " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReconstructionTest,
    ::testing::Values(Case{"RandomTokens", 0, 128, 0, -1}, Case{"RandomTokensEos", 0, 100, 5, 1},
                      Case{"ByteText", 1, 256, 0, -1}, Case{"ByteTextEosPadded", 1, 57, 9, 10},
                      Case{"Short", 0, 8, 3, -1}, Case{"EncoderPadding", 0, 64, 0, -1, 40},
                      Case{"ByteTextEncoderPaddingEos", 1, 80, 2, 10, 50}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(SpanCorruptionTest, NoiseDensityAndSpanLengthsOverManySamples) {
  std::shared_ptr<const TokenSource> source = *RandomTokenSource::Create(2, 500);
  for (int64_t S : {64, 100, 128, 256, 512}) {
    SpanCorruptionOptions o;
    o.encoder_length = S;
    o.seed = 3;
    SpanCorruptionLoader loader = MakeLoader(source, {16, 0, 1}, o);
    const SpanCorruptor& c = loader.corruptor();
    const int64_t L = c.raw_length();
    int64_t noise = 0, spans = 0, total = 0, len1 = 0, longer = 0;
    std::vector<int64_t> noise_by_third(3, 0), tokens_by_third(3, 0);
    for (int64_t step = 0; step < 40; ++step) {
      const Seq2SeqBatch batch = loader.Batch(step);
      for (int64_t b = 0; b < 16; ++b) {
        // Count from the targets: tokens after each sentinel until the next one.
        const auto tgt = Row(batch.decoder_targets, b);
        int64_t run = -1;
        for (int64_t id : tgt) {
          if (id == -100) break;
          if (id >= source->vocab_size()) {
            if (run > 0) {
              ++spans;
              len1 += run == 1;
              longer += run > 3;
            }
            run = 0;
          } else {
            ++noise;
            ++run;
          }
        }
        total += L;
        // Where the noise falls: from the mask itself.
        const std::vector<bool> mask = RandomSpansNoiseMask(c.counts(), 3, step, b);
        for (int64_t i = 0; i < L; ++i) {
          noise_by_third[3 * i / L] += mask[i];
          ++tokens_by_third[3 * i / L];
        }
      }
    }
    const double density = static_cast<double>(noise) / total;
    const double mean_span = static_cast<double>(noise) / spans;
    EXPECT_NEAR(density, 0.15, 0.01) << "S = " << S;
    EXPECT_NEAR(mean_span, 3.0, 0.25) << "S = " << S;
    EXPECT_GT(len1, 0) << "span lengths are random, some are 1";
    EXPECT_GT(longer, 0) << "span lengths are random, some exceed 3";
    for (int t = 0; t < 3; ++t) {
      const double d = static_cast<double>(noise_by_third[t]) / tokens_by_third[t];
      EXPECT_NEAR(d, 0.15, 0.02) << "S = " << S << " third " << t;
    }
  }
}

TEST(SpanCorruptionTest, NoiseMasksDifferPerRowStepAndSeed) {
  const SpanCounts counts = ComputeSpanCounts(200, 0.15, 3.0);
  const auto m = RandomSpansNoiseMask(counts, 1, 0, 0);
  EXPECT_EQ(m, RandomSpansNoiseMask(counts, 1, 0, 0));
  EXPECT_NE(m, RandomSpansNoiseMask(counts, 1, 0, 1));
  EXPECT_NE(m, RandomSpansNoiseMask(counts, 1, 1, 0));
  EXPECT_NE(m, RandomSpansNoiseMask(counts, 2, 0, 0));
  int64_t n = 0, spans = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    n += m[i];
    spans += m[i] && (i == 0 || !m[i - 1]);
  }
  EXPECT_EQ(n, counts.num_noise);
  EXPECT_EQ(spans, counts.num_spans);
}

TEST(SpanCorruptionTest, EitherEndMayBeNoiseOrNot) {
  // Unlike T5, whose last token is always noise: over many masks both ends are
  // sometimes noise and sometimes not, at similar rates.
  const SpanCounts counts = ComputeSpanCounts(40, 0.15, 3.0);
  int first = 0, last = 0;
  const int n = 4000;
  for (int row = 0; row < n; ++row) {
    const auto m = RandomSpansNoiseMask(counts, 8, 0, row);
    first += m.front();
    last += m.back();
  }
  // P(end is noise) = K / (non-noise + 1) = 2 / 35 for 34 non-noise tokens in
  // 2 spans.
  EXPECT_NEAR(static_cast<double>(first) / n, 2.0 / 35, 0.015);
  EXPECT_NEAR(static_cast<double>(last) / n, 2.0 / 35, 0.015);
}

TEST(SpanCorruptionTest, ByteTextSentinelsAreAbove255) {
  std::shared_ptr<const TokenSource> text = *ByteTextSource::OpenDefault(1);
  SpanCorruptionOptions o;
  o.encoder_length = 64;
  o.num_sentinels = 20;
  SpanCorruptionLoader loader = MakeLoader(text, {2, 0, 1}, o);
  EXPECT_EQ(loader.vocab_size(), 256 + 20);
  EXPECT_EQ(loader.corruptor().SentinelId(0), 275);
  EXPECT_EQ(loader.corruptor().SentinelId(19), 256);
  EXPECT_TRUE(loader.corruptor().IsSentinel(256));
  EXPECT_FALSE(loader.corruptor().IsSentinel(255));
  const Seq2SeqBatch batch = loader.Next();
  const auto enc = Row(batch.encoder_inputs, 0);
  int sentinels = 0;
  for (int64_t id : enc) sentinels += id >= 256;
  EXPECT_EQ(sentinels, loader.corruptor().counts().num_spans);
  const std::string shown = loader.corruptor().Render(enc, DecodeBytes);
  EXPECT_NE(shown.find("<extra_id_0>"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("<27"), std::string::npos) << shown;  // no raw sentinel ids
}

TEST(SpanCorruptionTest, DeterminismRankSplitAndResume) {
  auto source = [](uint64_t seed) -> std::shared_ptr<const TokenSource> {
    return *RandomTokenSource::Create(seed, 300);
  };
  SpanCorruptionOptions o;
  o.encoder_length = 48;
  o.seed = 5;
  auto flat = [](const Seq2SeqBatch& b) {
    std::vector<int64_t> v = b.encoder_inputs.ToVector<int64_t>();
    for (const tensor::Tensor* t : {&b.encoder_mask, &b.decoder_inputs, &b.decoder_targets}) {
      const auto x = t->ToVector<int64_t>();
      v.insert(v.end(), x.begin(), x.end());
    }
    return v;
  };
  // Same (seed, step, rank): same batch; another rank, step or mask seed: different.
  SpanCorruptionLoader a = MakeLoader(source(1), {4, 0, 2}, o);
  SpanCorruptionLoader b = MakeLoader(source(1), {4, 0, 2}, o);
  EXPECT_EQ(flat(a.Batch(3)), flat(b.Batch(3)));
  EXPECT_NE(flat(a.Batch(3)), flat(MakeLoader(source(1), {4, 1, 2}, o).Batch(3)));
  EXPECT_NE(flat(a.Batch(3)), flat(a.Batch(4)));
  SpanCorruptionOptions o2 = o;
  o2.seed = 6;
  const Seq2SeqBatch same_tokens_other_mask = MakeLoader(source(1), {4, 0, 2}, o2).Batch(3);
  EXPECT_NE(flat(a.Batch(3)), flat(same_tokens_other_mask));

  // Rank r's rows are rows [r*B, (r+1)*B) of the global batch.
  const int world = 3, B = 2;
  SpanCorruptionLoader global = MakeLoader(source(1), {B * world, 0, 1}, o);
  for (int64_t step : {0, 9}) {
    const Seq2SeqBatch g = global.Batch(step);
    for (int rank = 0; rank < world; ++rank) {
      const Seq2SeqBatch l = MakeLoader(source(1), {B, rank, world}, o).Batch(step);
      for (int64_t r = 0; r < B; ++r) {
        EXPECT_EQ(Row(l.encoder_inputs, r), Row(g.encoder_inputs, rank * B + r));
        EXPECT_EQ(Row(l.encoder_mask, r), Row(g.encoder_mask, rank * B + r));
        EXPECT_EQ(Row(l.decoder_inputs, r), Row(g.decoder_inputs, rank * B + r));
        EXPECT_EQ(Row(l.decoder_targets, r), Row(g.decoder_targets, rank * B + r));
      }
    }
  }

  // With K micro-batches, micro-batch m of rank r is the global batch's rows
  // [(m*W + r)*B, (m*W + r + 1)*B) (gradient accumulation).
  const int K = 2;
  SpanCorruptionLoader accumulated = MakeLoader(source(1), {B * world * K, 0, 1}, o);
  const Seq2SeqBatch g = accumulated.Batch(4);
  for (int rank = 0; rank < world; ++rank) {
    const Seq2SeqBatch l = MakeLoader(source(1), {B, rank, world, K}, o).Batch(4);
    ASSERT_EQ(l.encoder_inputs.dim(0), K * B);
    for (int64_t m = 0; m < K; ++m) {
      for (int64_t r = 0; r < B; ++r) {
        const int64_t row = (m * world + rank) * B + r;
        EXPECT_EQ(Row(l.encoder_inputs, m * B + r), Row(g.encoder_inputs, row));
        EXPECT_EQ(Row(l.encoder_mask, m * B + r), Row(g.encoder_mask, row));
        EXPECT_EQ(Row(l.decoder_inputs, m * B + r), Row(g.decoder_inputs, row));
        EXPECT_EQ(Row(l.decoder_targets, m * B + r), Row(g.decoder_targets, row));
      }
    }
  }

  // Resume: save after 3 steps, restore in a fresh loader, continue identically.
  SpanCorruptionLoader straight = MakeLoader(source(1), {2, 1, 2}, o);
  std::vector<std::vector<int64_t>> expected;
  for (int i = 0; i < 6; ++i) expected.push_back(flat(straight.Next()));
  SpanCorruptionLoader first = MakeLoader(source(1), {2, 1, 2}, o);
  for (int i = 0; i < 3; ++i) first.Next();
  auto saved = LoaderState::FromString(first.state().ToString());
  ASSERT_TRUE(saved.ok());
  SpanCorruptionLoader resumed = MakeLoader(source(1), {2, 1, 2}, o);
  ASSERT_TRUE(resumed.Restore(*saved).ok());
  for (int i = 3; i < 6; ++i) EXPECT_EQ(flat(resumed.Next()), expected[i]) << i;
  // Another mask seed is another configuration.
  SpanCorruptionLoader other = MakeLoader(source(1), {2, 1, 2}, o2);
  EXPECT_FALSE(other.Restore(*saved).ok());
}

std::string CreateError(int64_t vocab, const SpanCorruptionOptions& o) {
  auto c = SpanCorruptor::Create(vocab, o);
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : std::string(c.status().message());
}

// The special ids read back from a loader's saved state; other states are
// refused.
TEST(SpanCorruptionTest, TheIdsReadBackFromTheState) {
  SpanCorruptionOptions o;
  o.encoder_length = 48;
  o.eos_id = 7;
  o.pad_id = 3;
  o.decoder_start_id = 5;
  SpanCorruptionLoader loader = MakeLoader(*RandomTokenSource::Create(1, 300), {4, 0, 1}, o);
  absl::StatusOr<SpanCorruptionIds> ids = SpanCorruptionIdsOf(loader.state().ToString());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->eos_id, 7);
  EXPECT_EQ(ids->pad_id, 3);
  EXPECT_EQ(ids->decoder_start_id, 5);
  o.eos_id = -1;
  ids = SpanCorruptionIdsOf(
      MakeLoader(*RandomTokenSource::Create(1, 300), {4, 0, 1}, o).state().ToString());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->eos_id, -1);
  for (const char* other : {"", "step=3;lm(random(seed=1,vocab=300),global_batch=4,seq_len=8)",
                            "step=3;span_corruption(random(seed=1),eos=x)"}) {
    EXPECT_EQ(SpanCorruptionIdsOf(other).status().code(), absl::StatusCode::kInvalidArgument)
        << other;
  }
}

// The source's vocabulary and the sentinels read back from a loader's state,
// for each kind of source; other states are refused.
TEST(SpanCorruptionTest, TheVocabularyReadsBackFromTheState) {
  SpanCorruptionOptions o;
  o.encoder_length = 48;
  o.num_sentinels = 7;
  absl::StatusOr<SpanCorruptionVocab> vocab = SpanCorruptionVocabOf(
      MakeLoader(*RandomTokenSource::Create(1, 300), {4, 0, 1}, o).state().ToString());
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->source_vocab, 300);
  EXPECT_EQ(vocab->sentinels, 7);
  std::shared_ptr<const TokenSource> bytes = *ByteTextSource::FromString(std::string(400, 'a'), 1);
  vocab = SpanCorruptionVocabOf(MakeLoader(bytes, {4, 0, 1}, o).state().ToString());
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->source_vocab, 256);
  // A token file's record, as a checkpoint holds it.
  vocab = SpanCorruptionVocabOf(
      "step=10;span_corruption(token_file(tokens=36269,vocab=50257,seed=1337),global_batch=4,"
      "S=64,T_dec=16,L=71,density=0.15,mean_span=3,sentinels=100,eos=-1,pad=0,ignore=-100,"
      "start=0,seed=1337)");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->source_vocab, 50257);
  EXPECT_EQ(vocab->sentinels, 100);
  // A slice of one (--val_fraction's training part): its range holds a ')'.
  vocab = SpanCorruptionVocabOf(
      "step=10;span_corruption(token_file(tokens=32642,range=[0, 32642),vocab=50257,seed=1337),"
      "global_batch=4,S=64,T_dec=16,L=71,density=0.15,mean_span=3,sentinels=100,eos=-1,pad=0,"
      "ignore=-100,start=0,seed=1337)");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->source_vocab, 50257);
  for (const char* other : {"", "step=3;lm(random_tokens(vocab=300,seed=1),global_batch=4)",
                            "step=3;span_corruption(other(seed=1),sentinels=100)",
                            "step=3;span_corruption(random_tokens(vocab=300,seed=1),eos=1)"}) {
    EXPECT_EQ(SpanCorruptionVocabOf(other).status().code(), absl::StatusCode::kInvalidArgument)
        << other;
  }
}

TEST(SpanCorruptionTest, ClearErrors) {
  SpanCorruptionOptions o;
  o.encoder_length = 512;
  o.num_sentinels = 10;
  EXPECT_NE(CreateError(1000, o).find("gives 28 noise spans, which need 29 sentinels; "
                                      "num_sentinels is 10"),
            std::string::npos)
      << CreateError(1000, o);
  o = SpanCorruptionOptions();
  o.encoder_length = 128;
  o.decoder_length = 10;
  EXPECT_NE(CreateError(1000, o).find("decoder_length 10 is shorter than the targets"),
            std::string::npos)
      << CreateError(1000, o);
  o = SpanCorruptionOptions();
  o.encoder_length = 1;
  EXPECT_NE(CreateError(1000, o).find("encoder_length 1 is too short"), std::string::npos);
  o = SpanCorruptionOptions();
  o.encoder_length = 16;
  o.raw_length = 40;
  EXPECT_NE(CreateError(1000, o).find("raw_length 40 makes 36 encoder tokens, more than "
                                      "encoder_length 16"),
            std::string::npos)
      << CreateError(1000, o);
  o = SpanCorruptionOptions();
  o.noise_density = 1.0;
  EXPECT_NE(CreateError(1000, o).find("noise_density must be in (0, 1)"), std::string::npos);
  o = SpanCorruptionOptions();
  o.eos_id = 1000;
  EXPECT_NE(CreateError(1000, o).find("eos_id 1000 must be -1 (none) or an id of the source"),
            std::string::npos);
  o = SpanCorruptionOptions();
  o.ignore_index = 5;
  EXPECT_NE(CreateError(1000, o).find("ignore_index 5 is a token id"), std::string::npos);

  // A source shorter than one example.
  std::shared_ptr<const TokenSource> tiny = *ByteTextSource::FromString("short text", 0, "tiny");
  SpanCorruptionOptions t;
  t.encoder_length = 64;
  auto loader = SpanCorruptionLoader::Create(tiny, {1, 0, 1}, t);
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find("bytes of tiny (10 bytes) is too small: "
                                           "encoder_length 64 takes"),
            absl::string_view::npos)
      << loader.status();
  EXPECT_FALSE(SpanCorruptionLoader::Create(tiny, {1, 2, 2}, SpanCorruptionOptions()).ok());
}

}  // namespace
}  // namespace data
