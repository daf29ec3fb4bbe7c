// How the engines' errors name ranks and groups (rank_names.h).
#include "dist/rank_names.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dist {
namespace internal {

std::string GroupWho(int rank, int size, absl::string_view label) {
  std::string who = absl::StrCat("rank ", rank, " of ", size);
  if (!label.empty()) absl::StrAppend(&who, " in group ", label);
  return who;
}

std::string SubgroupLabel(absl::string_view parent_label, int split, int color) {
  return absl::StrCat(parent_label.empty() ? "world" : parent_label, "/split", split, "/color",
                      color);
}

std::string NameRanks(const std::vector<int>& ranks, const std::vector<int>& world_ranks) {
  std::string s =
      absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
  if (world_ranks.empty()) return s;
  std::vector<std::string> world;
  for (int r : ranks) {
    const bool known = r >= 0 && r < static_cast<int>(world_ranks.size()) && world_ranks[r] >= 0;
    world.push_back(known ? absl::StrCat(world_ranks[r]) : "?");
  }
  return absl::StrCat(s, " (world ", absl::StrJoin(world, ", "), ")");
}

}  // namespace internal
}  // namespace dist
