// DataParallel validation and the loader state's string form.
#include "models/data/loader_state.h"

#include <vector>

#include "gtest/gtest.h"

namespace data {
namespace {

TEST(DataParallelTest, GlobalRows) {
  DataParallel dp{/*batch_size=*/4, /*rank=*/2, /*world_size=*/3};
  EXPECT_TRUE(dp.Validate("t").ok());
  EXPECT_EQ(dp.global_batch_size(), 12);
  EXPECT_EQ(dp.GlobalRow(0), 8);
  EXPECT_EQ(dp.GlobalRow(3), 11);
}

TEST(DataParallelTest, MicroBatchRowsInterleaveTheRanks) {
  // K = 2 micro-batches of B = 2 rows on rank 1 of 3: micro-batch m is global
  // rows [(m*3 + 1)*2, (m*3 + 2)*2), so each micro-batch step of the ranks
  // together is a contiguous block of the global batch of 12 rows.
  DataParallel dp{/*batch_size=*/2, /*rank=*/1, /*world_size=*/3, /*micro_batches=*/2};
  EXPECT_TRUE(dp.Validate("t").ok());
  EXPECT_EQ(dp.local_rows(), 4);
  EXPECT_EQ(dp.global_batch_size(), 12);
  EXPECT_EQ(dp.GlobalRow(0), 2);
  EXPECT_EQ(dp.GlobalRow(1), 3);
  EXPECT_EQ(dp.GlobalRow(2), 8);
  EXPECT_EQ(dp.GlobalRow(3), 9);
  // Every global row once over the ranks.
  std::vector<int> seen(12, 0);
  for (int r = 0; r < 3; ++r) {
    const DataParallel d{2, r, 3, 2};
    for (int64_t i = 0; i < d.local_rows(); ++i) ++seen[d.GlobalRow(i)];
  }
  EXPECT_EQ(seen, std::vector<int>(12, 1));
}

TEST(DataParallelTest, BadLayoutsAreErrors) {
  EXPECT_NE(DataParallel({0, 0, 1}).Validate("who").message().find(
                "[who] batch_size must be >= 1, got 0"),
            absl::string_view::npos);
  EXPECT_NE(DataParallel({1, 0, 0}).Validate("who").message().find("world_size must be >= 1"),
            absl::string_view::npos);
  EXPECT_NE(DataParallel({1, 4, 4}).Validate("who").message().find(
                "rank 4 is not in [0, world_size = 4)"),
            absl::string_view::npos);
  EXPECT_FALSE(DataParallel({1, -1, 4}).Validate("who").ok());
  EXPECT_FALSE(DataParallel({int64_t{1} << 30, 0, 2}).Validate("who").ok());
  EXPECT_NE(DataParallel({1, 0, 1, 0})
                .Validate("who")
                .message()
                .find("[who] micro_batches must be >= 1, got 0"),
            absl::string_view::npos);
  EXPECT_NE(DataParallel({int64_t{1} << 20, 0, 2, int64_t{1} << 10})
                .Validate("who")
                .message()
                .find("global batch 1024 x 2 x 1048576 is too large"),
            absl::string_view::npos);
  EXPECT_FALSE(DataParallel({2, 0, 2, int64_t{1} << 62}).Validate("who").ok());
}

TEST(LoaderStateTest, StringRoundTrip) {
  LoaderState s{42, "lm(random_tokens(vocab=5,seed=1),global_batch=8,seq_len=4)"};
  EXPECT_EQ(s.ToString(), "step=42;lm(random_tokens(vocab=5,seed=1),global_batch=8,seq_len=4)");
  auto back = LoaderState::FromString(s.ToString());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 42);
  EXPECT_EQ(back->config, s.config);
}

TEST(LoaderStateTest, BadStringsAreErrors) {
  EXPECT_FALSE(LoaderState::FromString("").ok());
  EXPECT_FALSE(LoaderState::FromString("step=12").ok());
  EXPECT_FALSE(LoaderState::FromString("step=-3;x").ok());
  auto bad = LoaderState::FromString("step=abc;x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad step \"abc\""), absl::string_view::npos)
      << bad.status();
}

TEST(LoaderStateTest, CheckRestoreComparesConfigs) {
  EXPECT_TRUE(CheckRestore({3, "a"}, "a", "w").ok());
  const absl::Status s = CheckRestore({3, "a"}, "b", "w");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("saved \"a\", this loader \"b\""), absl::string_view::npos) << s;
  EXPECT_FALSE(CheckRestore({-1, "a"}, "a", "w").ok());
  // The fields that differ are named.
  const absl::Status fields =
      CheckRestore({3, "span_corruption(src(seed=1),S=32,T_dec=8,noise=0.15)"},
                   "span_corruption(src(seed=1),S=64,T_dec=16,noise=0.15)", "w");
  EXPECT_NE(fields.message().find("; it differs in span_corruption.S (32 saved, 64 now), "
                                  "span_corruption.T_dec (8 saved, 16 now); resume with the data "
                                  "flags it was saved with"),
            absl::string_view::npos)
      << fields;
  // Keys of several calls apart; another file is said as such.
  const absl::Status file =
      CheckRestore({3, "lm(token_file(tokens=100,vocab=50257,seed=1),seed=1)"},
                   "lm(token_file(tokens=200,vocab=50257,seed=2),seed=1)", "w");
  EXPECT_NE(file.message().find("; it differs in token_file.tokens (100 saved, 200 now), "
                                "token_file.seed (1 saved, 2 now); the data differs: resume with "
                                "the data it was saved with"),
            absl::string_view::npos)
      << file;
  // A held-out tail (--val_fraction) that differs is named.
  const absl::Status sliced =
      CheckRestore({3, "lm(byte_text(bytes=10,range=[0, 90),seed=4))"},
                   "lm(byte_text(bytes=10,seed=4))", "w");
  EXPECT_NE(sliced.message().find("; the part of the data trained on differs (saved range=[0, "
                                  "90), now all of it): resume with the run's --val_fraction"),
            absl::string_view::npos)
      << sliced;
}

// A file of the same size with other content (its digest differs) is
// another file; a state saved before configs held digests is compared
// without them, its content unchecked.
TEST(LoaderStateTest, CheckRestoreComparesTheDataContent) {
  const absl::Status other =
      CheckRestore({3, "lm(byte_text(bytes=10,content=00000000000000aa,seed=4),seed=1)"},
                   "lm(byte_text(bytes=10,content=00000000000000bb,seed=4),seed=1)", "w");
  EXPECT_NE(other.message().find("; it differs in byte_text.content (00000000000000aa saved, "
                                 "00000000000000bb now); the data differs: resume with the data "
                                 "it was saved with"),
            absl::string_view::npos)
      << other;
  EXPECT_TRUE(CheckRestore({3, "lm(byte_text(bytes=10,seed=4),seed=1)"},
                           "lm(byte_text(bytes=10,content=00000000000000bb,seed=4),seed=1)", "w")
                  .ok());
  EXPECT_TRUE(
      CheckRestore({3, "span_corruption(token_file(tokens=9,range=[0, 9),vocab=5,seed=1),S=4)"},
                   "span_corruption(token_file(tokens=9,range=[0, 9),vocab=5,content=0123456789"
                   "abcdef,seed=1),S=4)",
                   "w")
          .ok());
  // Two sources, each digest the last field of its call.
  EXPECT_TRUE(CheckRestore({3, "mix(byte_text(bytes=4),byte_text(bytes=5))"},
                           "mix(byte_text(bytes=4,content=00000000000000aa),"
                           "byte_text(bytes=5,content=00000000000000bb))",
                           "w")
                  .ok());
  // Still refused when something else differs.
  EXPECT_FALSE(CheckRestore({3, "lm(byte_text(bytes=10,seed=4),seed=1)"},
                            "lm(byte_text(bytes=11,content=00000000000000bb,seed=4),seed=1)", "w")
                   .ok());
}

}  // namespace
}  // namespace data
