// How the engines' errors name a group's ranks, one form for gloo, threads
// and nccl: "rank 1 of 4"; a subgroup labelled by its place among the splits,
// "rank 1 of 2 in group world/split0/color1" (the world group's first split,
// color 1), its ranks followed by their world ranks, "rank 0 (world 2)".
#ifndef DIST_RANK_NAMES_H_
#define DIST_RANK_NAMES_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dist {
namespace internal {

// "rank 1 of 4", with " in group <label>" when `label` (a subgroup's) is set.
std::string GroupWho(int rank, int size, absl::string_view label);

// The label of split number `split` (of its parent group, counted from 0 in
// the order every rank splits), color `color`, of the group `parent_label`
// ("" for the world group): "world/split0/color1".
std::string SubgroupLabel(absl::string_view parent_label, int split, int color);

// "rank 2" / "ranks 0, 2"; in a subgroup (`world_ranks`: by rank; empty for
// the world group) with their world ranks, "ranks 0, 2 (world 4, 6)": "?"
// for a rank the list lacks or holds as -1 (not known).
std::string NameRanks(const std::vector<int>& ranks, const std::vector<int>& world_ranks);

}  // namespace internal
}  // namespace dist

#endif  // DIST_RANK_NAMES_H_
