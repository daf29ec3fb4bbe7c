// The one form of the engines' rank names: the world group's, a subgroup's
// label, and ranks with their world ranks ("?" where not known).
#include "dist/rank_names.h"

#include "gtest/gtest.h"

namespace dist {
namespace internal {
namespace {

TEST(RankNamesTest, AGroupAndASubgroup) {
  EXPECT_EQ(GroupWho(1, 4, ""), "rank 1 of 4");
  EXPECT_EQ(GroupWho(1, 2, "world/split0/color1"), "rank 1 of 2 in group world/split0/color1");
  EXPECT_EQ(SubgroupLabel("", 0, 1), "world/split0/color1");
  EXPECT_EQ(SubgroupLabel("world/split0/color1", 2, 0), "world/split0/color1/split2/color0");
}

TEST(RankNamesTest, RanksOfASubgroupAreNamedWithTheWorlds) {
  EXPECT_EQ(NameRanks({1}, {}), "rank 1");
  EXPECT_EQ(NameRanks({1}, {2, 6}), "rank 1 (world 6)");
  EXPECT_EQ(NameRanks({0, 1}, {}), "ranks 0, 1");
  EXPECT_EQ(NameRanks({0, 1}, {2, 6}), "ranks 0, 1 (world 2, 6)");
  // A rank the list lacks, or holds as not known: "?".
  EXPECT_EQ(NameRanks({0, 5}, {2, 6}), "ranks 0, 5 (world 2, ?)");
  EXPECT_EQ(NameRanks({2, 3}, {1, -1, 5, -1}), "ranks 2, 3 (world 5, ?)");
}

}  // namespace
}  // namespace internal
}  // namespace dist
