// RowRandom: words are Philox words of (seed ^ stream, step, row, block); rows,
// steps, streams and seeds give different words; UniformInt stays in range and
// is close to uniform.
#include "models/data/row_random.h"

#include <vector>

#include "gtest/gtest.h"
#include "tensor/random.h"

namespace data {
namespace {

TEST(RowRandomTest, WordsArePhiloxWordsOfTheCounter) {
  const uint64_t seed = 1234;
  RowRandom rng(seed, RandomStream::kTokens, /*step=*/7, /*row=*/3);
  const uint64_t key =
      seed ^ (static_cast<uint64_t>(RandomStream::kTokens) * 0x9E3779B97F4A7C15ull);
  for (uint64_t i = 0; i < 20; ++i) {
    const auto block = tensor::Philox4x32(key, 7, (uint64_t{3} << 32) | (i / 4));
    EXPECT_EQ(rng.Word(i), block[i % 4]) << i;
  }
}

TEST(RowRandomTest, SameInputsSameWordsInAnyOrder) {
  RowRandom a(5, RandomStream::kWindowStart, 2, 9);
  RowRandom b(5, RandomStream::kWindowStart, 2, 9);
  std::vector<uint32_t> forward, backward(16);
  for (int i = 0; i < 16; ++i) forward.push_back(a.Word(i));
  for (int i = 15; i >= 0; --i) backward[i] = b.Word(i);
  EXPECT_EQ(forward, backward);
}

TEST(RowRandomTest, SeedStreamStepAndRowEachChangeTheWords) {
  auto words = [](uint64_t seed, RandomStream stream, int64_t step, int64_t row) {
    RowRandom r(seed, stream, step, row);
    std::vector<uint32_t> w;
    for (int i = 0; i < 8; ++i) w.push_back(r.Word(i));
    return w;
  };
  const auto base = words(1, RandomStream::kTokens, 0, 0);
  EXPECT_NE(base, words(2, RandomStream::kTokens, 0, 0));
  EXPECT_NE(base, words(1, RandomStream::kNoiseMask, 0, 0));
  EXPECT_NE(base, words(1, RandomStream::kTokens, 1, 0));
  EXPECT_NE(base, words(1, RandomStream::kTokens, 0, 1));
}

TEST(RowRandomTest, UniformIntIsInRangeAndCloseToUniform) {
  RowRandom rng(99, RandomStream::kTokens, 0, 0);
  const int64_t n = 10;
  const int draws = 100000;
  std::vector<int> counts(n, 0);
  for (int i = 0; i < draws; ++i) {
    const int64_t v = rng.UniformInt(i, n);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, n);
    ++counts[v];
  }
  double chi2 = 0;
  const double expected = static_cast<double>(draws) / n;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 27.9);  // chi-square, 9 degrees of freedom, p = 0.001
  EXPECT_EQ(rng.UniformInt(5, 1), 0);
}

}  // namespace
}  // namespace data
