// T5 generation with the decoder's key/value cache: DecodeStep over a
// sequence fed in pieces gives DecodeLogits' logits for the whole sequence
// (v1.0 tied and v1.1 gated, a padded encoder batch, relative positions past
// the exact buckets); Generate gives the same tokens with and without the
// cache, greedy and sampled; sampling follows the seed and top_k 1 is greedy;
// misuse is a named error.
#include "models/t5/generate.h"

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
    options.kv_cache = true;
    absl::StatusOr<std::vector<std::vector<int64_t>>> cached =
        Generate(model_, EncoderInputs(), EncoderMask(), options);
    options.kv_cache = false;
    absl::StatusOr<std::vector<std::vector<int64_t>>> whole =
        Generate(model_, EncoderInputs(), EncoderMask(), options);
    ASSERT_TRUE(cached.ok()) << cached.status();
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(*cached, *whole);
    ASSERT_EQ(cached->size(), 2u);
    EXPECT_EQ((*cached)[0].size(), 12u);
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

INSTANTIATE_TEST_SUITE_P(Forms, T5GenerateTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "v1_1" : "v1_0";
                         });

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
}

}  // namespace
}  // namespace t5
