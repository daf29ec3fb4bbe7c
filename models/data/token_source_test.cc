// Window placement: in range, every start reachable, deterministic per
// (seed, step, row); content digests that tell data of one size apart.
#include "models/data/token_source.h"

#include <set>

#include "gtest/gtest.h"

namespace data {
namespace {

TEST(SampleWindowStartTest, InRangeAndEveryStartReachable) {
  const int64_t total = 10, length = 4;
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 50; ++step) {
    for (int64_t row = 0; row < 20; ++row) {
      const int64_t s = SampleWindowStart(3, step, row, total, length);
      ASSERT_GE(s, 0);
      ASSERT_LE(s, total - length);
      seen.insert(s);
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(total - length + 1));
}

TEST(SampleWindowStartTest, WholeSequenceStartsAtZero) {
  EXPECT_EQ(SampleWindowStart(1, 5, 2, 7, 7), 0);
}

TEST(SampleWindowStartTest, DeterministicAndVaries) {
  const int64_t total = 1000000;
  EXPECT_EQ(SampleWindowStart(1, 4, 2, total, 10), SampleWindowStart(1, 4, 2, total, 10));
  int same_row = 0, same_step = 0, same_seed = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const int64_t s = SampleWindowStart(1, i, 0, total, 10);
    same_row += s == SampleWindowStart(1, i, 1, total, 10);
    same_step += s == SampleWindowStart(1, i + 1000, 0, total, 10);
    same_seed += s == SampleWindowStart(2, i, 0, total, 10);
  }
  EXPECT_LE(same_row, 1);
  EXPECT_LE(same_step, 1);
  EXPECT_LE(same_seed, 1);
}

// Equal data, equal digest; one byte changed, another; past 64 MiB the
// windows are what is read, the size too.
TEST(ContentDigestTest, TellsDataOfTheSameSizeApart) {
  std::string a(1000, 'a');
  EXPECT_EQ(ContentDigest(a), ContentDigest(std::string(1000, 'a')));
  EXPECT_EQ(ContentDigest(a).size(), 16u);
  std::string b = a;
  b[999] = 'b';
  EXPECT_NE(ContentDigest(a), ContentDigest(b));
  std::string big((size_t{64} << 20) + 4096, 'x');
  const std::string digest = ContentDigest(big);
  big[0] = 'y';  // in the first window
  EXPECT_NE(ContentDigest(big), digest);
  big[0] = 'x';
  big.back() = 'y';  // in the last window
  EXPECT_NE(ContentDigest(big), digest);
  big.back() = 'x';
  EXPECT_EQ(ContentDigest(big), digest);
  big.push_back('x');  // one byte longer
  EXPECT_NE(ContentDigest(big), digest);
}

}  // namespace
}  // namespace data
