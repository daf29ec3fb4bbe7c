// FSDP planning without allocation (fsdp_plan.h): units, flat layouts and
// per-rank memory from a model's shapes.
#include "dist/fsdp_plan.h"

#include <algorithm>
#include <utility>

#include "dist/flat_param.h"
#include "tensor/error.h"

namespace dist {

ShardingPlan PlanSharding(nn::Module& root, const WrapPolicy& policy, int num_shards) {
  OP_CHECK(num_shards >= 1, "PlanSharding", "num_shards=", num_shards, " must be >= 1");
  ShardingPlan plan;
  plan.num_shards = num_shards;
  std::vector<UnitPlan> units = PlanUnits(root, policy);
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].params.empty() && i != 0) continue;  // as FullyShard
    ShardingPlan::Unit u;
    u.name = units[i].name;
    u.num_params = static_cast<int>(units[i].params.size());
    // The layout only: constructing a FlatParameter allocates nothing.
    const FlatParameter flat(std::move(units[i].params), num_shards, 0);
    u.numel = flat.numel();
    u.padded_numel = flat.padded_numel();
    u.shard_numel = flat.shard_numel();
    u.trains = flat.trains() || u.num_params == 0;  // a root without parameters: as FullyShard
    plan.total_numel += u.numel;
    plan.shard_numel += u.shard_numel;
    if (u.trains) plan.trainable_shard_numel += u.shard_numel;
    plan.units.push_back(std::move(u));
  }
  for (size_t i = plan.units.size() > 1 ? 1 : 0; i < plan.units.size(); ++i) {
    plan.max_padded_numel = std::max(plan.max_padded_numel, plan.units[i].padded_numel);
    if (plan.units[i].trains) {
      plan.max_trainable_padded_numel =
          std::max(plan.max_trainable_padded_numel, plan.units[i].padded_numel);
    }
  }
  return plan;
}

FsdpRankBytes EstimateFsdpRank(const ShardingPlan& plan, const FsdpEstimateOptions& options) {
  FsdpRankBytes b;
  b.sharded_parameters = 4 * plan.shard_numel;
  b.sharded_gradients = 4 * plan.trainable_shard_numel;
  b.optimizer_state = int64_t{options.optimizer_bytes} * plan.trainable_shard_numel;
  const int64_t root = plan.units.empty() ? 0 : plan.units.front().padded_numel;
  const bool only_root = plan.units.size() <= 1;
  int64_t params = 0;
  if (!options.reshard_after_forward) {
    for (const ShardingPlan::Unit& u : plan.units) params += u.padded_numel;
  } else {
    const int64_t others = int64_t(plan.units.size()) - 1;
    params = root + (only_root ? 0
                               : std::min<int64_t>(options.max_inflight_all_gathers, others) *
                                     plan.max_padded_numel);
  }
  b.unsharded_parameters_peak = int64_t{options.param_bytes} * params;
  int64_t training_others = 0;
  for (size_t i = 1; i < plan.units.size(); ++i) training_others += plan.units[i].trains ? 1 : 0;
  const bool root_trains = !plan.units.empty() && plan.units.front().trains;
  b.unsharded_gradients_peak =
      4 * ((root_trains ? root : 0) +
           std::min<int64_t>(2, training_others) * plan.max_trainable_padded_numel);
  return b;
}

}  // namespace dist
