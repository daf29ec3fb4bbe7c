// Philox known-answer values, determinism and rough distribution checks.
#include "tensor/random.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tensor {
namespace {

TEST(PhiloxTest, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10: zero key and counter, and all ones.
  auto z = Philox4x32(0, 0, 0);
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
  auto f = Philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(f[0], 0x408f276du);
  EXPECT_EQ(f[1], 0x41c83b0eu);
  EXPECT_EQ(f[2], 0xa20bc7c6u);
  EXPECT_EQ(f[3], 0x6d5451fdu);
}

TEST(GeneratorTest, SameSeedSameNumbersAndOffsetsAdvance) {
  Generator a(42), b(42), c(43);
  EXPECT_EQ(a.Reserve(10), 0u);
  EXPECT_EQ(a.Reserve(5), 10u);
  EXPECT_EQ(a.offset(), 15u);
  EXPECT_EQ(a.Uniform(3), b.Uniform(3));
  EXPECT_NE(a.Uniform(3), c.Uniform(3));
}

// Part 1 of 3 takes the middle n counters of each 3 n a whole batch would
// reserve, and the offset moves as the whole batch's.
TEST(GeneratorTest, BatchPartsReserveTheirShareOfTheWholesCounters) {
  Generator whole(7), part(7);
  part.SetBatchPart(1, 3);
  EXPECT_EQ(whole.Reserve(30), 0u);
  EXPECT_EQ(part.Reserve(10), 10u);
  EXPECT_EQ(whole.Reserve(6), 30u);
  EXPECT_EQ(part.Reserve(2), 32u);
  EXPECT_EQ(part.offset(), whole.offset());
}

TEST(GeneratorTest, UniformAndNormalMoments) {
  Generator g(1);
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    const float u = g.Uniform(i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    const float x = g.Normal(i);
    ASSERT_TRUE(std::isfinite(x));
    sn += x;
    sn2 += x * x;
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.02);
}

}  // namespace
}  // namespace tensor
