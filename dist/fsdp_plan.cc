// FSDP planning without allocation (fsdp_plan.h): units, flat layouts, their
// nesting and per-rank memory from a model's shapes.
#include "dist/fsdp_plan.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "dist/flat_param.h"
#include "nn/fp32_modules.h"
#include "tensor/error.h"

namespace dist {
namespace {

// Sets each unit's parent: the nearest enclosing module that is a unit of
// the plan (`index`: module -> plan index; units dropped for holding no
// parameter are not in it, so their nested units hang from the unit above).
void SetParents(nn::Module& root, const std::map<nn::Module*, int>& index, ShardingPlan* plan) {
  std::function<void(nn::Module&, int)> walk = [&](nn::Module& m, int enclosing) {
    for (auto& [child_name, child] : m.NamedChildren()) {
      auto it = index.find(child);
      if (it != index.end() && it->second != 0) {
        plan->units[it->second].parent = enclosing;
        walk(*child, it->second);
      } else {
        walk(*child, enclosing);
      }
    }
  };
  walk(root, 0);
}

// Unit u's unsharded parameters in bytes (see FsdpRankBytes): its gather
// alone (`cast` false: prefetched, not yet in use), or with the param_dtype
// copies of its parameters not kept fp32 (`cast`: in use).
int64_t UnshardedBytes(const ShardingPlan::Unit& u, int param_bytes, bool cast) {
  if (param_bytes >= 4 || u.fp32_numel == 0) return int64_t{param_bytes} * u.padded_numel;
  return 4 * u.padded_numel + (cast ? int64_t{param_bytes} * (u.numel - u.fp32_numel) : 0);
}

// The root's `in_use` bytes plus the maximum over non-root units u of: the
// `in_use` bytes of the non-root units held while u runs (those enclosing u,
// and the `kept` units before u in pre-order: gathered by their forward,
// which ran before u's, until their backward, which runs after u's), plus,
// of the other non-root units, one running (its `in_use`) and `window` - 1
// others gathered ahead of their use (their `ahead`), at most as many units
// as there are: the largest such sum, each unit counted once. A unit of zero
// bytes (frozen, for gradients) still counts as u. `kept`: empty, or one
// flag per unit.
int64_t HeldPeak(const ShardingPlan& plan, const std::vector<int64_t>& in_use,
                 const std::vector<int64_t>& ahead, int64_t window,
                 const std::vector<bool>& kept = {}) {
  const int n = static_cast<int>(plan.units.size());
  if (n <= 1) return n == 1 ? in_use[0] : 0;
  // Non-root units with bytes, largest first by each measure.
  std::vector<int> by_use, by_ahead;
  for (int i = 1; i < n; ++i) {
    if (in_use[i] > 0) by_use.push_back(i);
  }
  by_ahead = by_use;
  std::stable_sort(by_use.begin(), by_use.end(),
                   [&](int a, int b) { return in_use[a] > in_use[b]; });
  std::stable_sort(by_ahead.begin(), by_ahead.end(),
                   [&](int a, int b) { return ahead[a] > ahead[b]; });
  int64_t best = 0;
  for (int u = 1; u < n; ++u) {
    std::set<int> held_units;  // with bytes
    for (int a = plan.units[u].parent; a > 0; a = plan.units[a].parent) held_units.insert(a);
    for (int k = 1; k < u && !kept.empty(); ++k) {
      if (kept[k]) held_units.insert(k);
    }
    int64_t held = 0;
    for (auto it = held_units.begin(); it != held_units.end();) {
      held += in_use[*it];
      it = in_use[*it] > 0 ? std::next(it) : held_units.erase(it);
    }
    const int64_t others = int64_t(by_use.size() - held_units.size());  // not held
    const int64_t count = std::min(window, others);
    if (count > 0) {
      // The unit running, r, and the count - 1 largest `ahead` of the other
      // units not held: the top count - 1 of them, or, when r is among
      // those, the others and the next one.
      std::vector<int> free_ahead;  // by_ahead's units not held, largest first
      for (int i : by_ahead) {
        if (held_units.count(i) == 0) free_ahead.push_back(i);
      }
      const size_t k = static_cast<size_t>(count - 1);
      std::vector<bool> in_top(n, false);
      int64_t top = 0;
      for (size_t j = 0; j < k && j < free_ahead.size(); ++j) {
        top += ahead[free_ahead[j]];
        in_top[free_ahead[j]] = true;
      }
      const int64_t next = free_ahead.size() > k ? ahead[free_ahead[k]] : 0;
      int64_t most = 0;
      for (int r : by_use) {
        if (held_units.count(r) > 0) continue;
        most = std::max(most, in_use[r] + (in_top[r] ? top - ahead[r] + next : top));
      }
      held += most;
    }
    best = std::max(best, held);
  }
  return in_use[0] + best;
}

}  // namespace

ShardingPlan PlanSharding(nn::Module& root, const WrapPolicy& policy, int num_shards,
                          const precision::MixedPrecisionPolicy& mixed_precision) {
  OP_CHECK(num_shards >= 1, "PlanSharding", "num_shards=", num_shards, " must be >= 1");
  ShardingPlan plan;
  plan.num_shards = num_shards;
  const std::set<const nn::Parameter*> kept =
      nn::KeptFp32Parameters(root, mixed_precision.fp32_module_classes);
  std::vector<UnitPlan> units = PlanUnits(root, policy.ForMixedPrecision(mixed_precision));
  std::map<nn::Module*, int> index;  // module -> index in plan.units
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].params.empty() && i != 0) continue;  // as FullyShard
    ShardingPlan::Unit u;
    u.name = units[i].name;
    u.num_params = static_cast<int>(units[i].params.size());
    for (const auto& [name, p] : units[i].params) {
      if (kept.count(p) > 0) u.fp32_numel += p->numel();
    }
    index[units[i].module] = static_cast<int>(plan.units.size());
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
  SetParents(root, index, &plan);
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
  OP_CHECK(options.max_inflight_all_gathers >= 1, "EstimateFsdpRank",
           "max_inflight_all_gathers=", options.max_inflight_all_gathers, " must be >= 1");
  FsdpRankBytes b;
  b.sharded_parameters = 4 * plan.shard_numel;
  b.sharded_gradients = 4 * plan.trainable_shard_numel;
  b.optimizer_state = int64_t{options.optimizer_bytes} * plan.trainable_shard_numel;
  OP_CHECK(options.prefetch_units >= 0, "EstimateFsdpRank",
           "prefetch_units=", options.prefetch_units, " must be >= 0");
  const int n = static_cast<int>(plan.units.size());
  std::vector<bool> kept(n, false);
  for (int k : options.kept_units) {
    OP_CHECK(k >= 1 && k < n, "EstimateFsdpRank", "kept unit ", k, " is not a unit index in [1, ",
             n, ") (the root is always kept)");
    kept[k] = true;
  }
  // Explicit lists replace the recorded-order prefetch at every unit, and a
  // unit's list is gathered whatever max_inflight_all_gathers says: the unit
  // running and the k it names.
  const int64_t window = options.prefetch_units > 0 ? int64_t{options.prefetch_units} + 1
                                                    : options.max_inflight_all_gathers;
  std::vector<int64_t> params, gathers, grads;  // per unit, bytes
  for (const ShardingPlan::Unit& u : plan.units) {
    params.push_back(UnshardedBytes(u, options.param_bytes, /*cast=*/true));
    gathers.push_back(UnshardedBytes(u, options.param_bytes, /*cast=*/false));
    grads.push_back(u.trains ? 4 * u.padded_numel : 0);
  }
  for (int64_t p : params) b.whole_model_parameters += p;
  if (!options.reshard_after_forward) {
    b.unsharded_parameters_peak = b.whole_model_parameters;  // every unit, from its forward on
  } else {
    b.unsharded_parameters_peak = HeldPeak(plan, params, gathers, window, kept);
  }
  if (options.no_sync) {
    for (int64_t g : grads) b.unsharded_gradients_peak += g;  // all kept between backwards
  } else {
    b.unsharded_gradients_peak = HeldPeak(plan, grads, grads, 2);
  }
  return b;
}

}  // namespace dist
