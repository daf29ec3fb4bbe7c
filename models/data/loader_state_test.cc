// DataParallel validation and the loader state's string form.
#include "models/data/loader_state.h"

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
}

}  // namespace
}  // namespace data
