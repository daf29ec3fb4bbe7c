// FSDP planning without allocation: the units a wrap policy gives, each
// unit's FlatParameter layout (numel, padding, shard size) at a world size,
// and the per-rank model-state bytes that follow. Nothing is materialized,
// so a gpt-175b or gpt-1t plan costs only its nn::Parameter objects (shapes):
//
//   mingpt::GPT gpt(*mingpt::Preset("gpt-175b"));   // no weights allocated
//   dist::ShardingPlan plan = dist::PlanSharding(gpt, WrapPolicy::Transformer({"Block"}), 1024);
//   dist::FsdpRankBytes b = dist::EstimateFsdpRank(plan, {...});
//
// The layouts are FlatParameter's own (the same code FullyShard runs), so
// plan.units[i].shard_numel equals FullyShard(...)->flat_param(i).shard_numel().
// The plan also records how units nest (a size-based policy wraps a module
// and modules inside it: FullyShard keeps the outer unit gathered while the
// inner ones run) and which units hold parameters of module classes a
// mixed-precision policy keeps fp32 (such a unit is gathered in fp32 and,
// when it trains one, reduced in fp32; under low precision FullyShard makes
// each such module a unit of its own, WrapPolicy::ForMixedPrecision).
#ifndef DIST_FSDP_PLAN_H_
#define DIST_FSDP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dist/wrap_policy.h"
#include "nn/module.h"
#include "precision/policy.h"

namespace dist {

struct ShardingPlan {
  struct Unit {
    std::string name;  // "" for the root
    int num_params = 0;
    int64_t numel = 0;         // parameters' elements
    int64_t padded_numel = 0;  // a multiple of num_shards
    int64_t shard_numel = 0;   // padded_numel / num_shards
    // Some parameter trains (requires_grad): the unit has a gradient shard
    // and optimizer state (of its whole shard, frozen elements included).
    bool trains = true;
    // The index in `units` of the nearest enclosing unit (0: the root; -1 for
    // the root itself). FullyShard holds every enclosing unit gathered (and
    // its gradient allocated) while this one runs its forward or backward.
    int parent = -1;
    // Elements of parameters owned by modules of the fp32 classes of the
    // policy given to PlanSharding: a unit with any gathers in fp32 (under a
    // low precision such modules are units of their own, fp32_numel == numel).
    int64_t fp32_numel = 0;
  };
  int num_shards = 1;
  std::vector<Unit> units;  // FullyShard's order: the root first (units without parameters dropped)
  int64_t total_numel = 0;       // Psi
  int64_t shard_numel = 0;       // elements one rank owns (sum over units)
  int64_t trainable_shard_numel = 0;  // of units that train (gradients, optimizer state)
  int64_t max_padded_numel = 0;  // the largest unit (the root excluded, when others exist)
  int64_t max_trainable_padded_numel = 0;  // the largest unit that trains (idem)
};

// `num_shards` >= 1: the shard group size (world size; HYBRID_SHARD: its
// group size). `mixed_precision`: FsdpOptions' (FullyShard's units are
// policy.ForMixedPrecision(mixed_precision)'s; the parameters of its
// fp32_module_classes count in Unit::fp32_numel).
ShardingPlan PlanSharding(nn::Module& root, const WrapPolicy& policy, int num_shards,
                          const precision::MixedPrecisionPolicy& mixed_precision =
                              precision::MixedPrecisionPolicy::Fp32());

struct FsdpEstimateOptions {
  int param_bytes = 4;       // unsharded compute copies: 4 fp32, 2 bf16/fp16
  int optimizer_bytes = 8;   // K per element: AdamW 8, SGD with momentum 4
  int max_inflight_all_gathers = 2;  // >= 1 (EstimateFsdpRank throws tensor::OpError)
  bool reshard_after_forward = true;  // FULL_SHARD (false: SHARD_GRAD_OP)
  // Gradient accumulation under no_sync (the train binaries'
  // --grad_accum_steps > 1): every trainable unit keeps its unsharded fp32
  // gradient from the first micro-batch's backward to the synced one.
  bool no_sync = false;
  // FSDP2's explicit prefetch as dist::PrefetchNeighbors(k) sets it (the train
  // binaries' --prefetch_units=k): each unit gathers the k next (forward) or
  // previous (backward) units ahead, whatever max_inflight_all_gathers says,
  // so k + 1 units are in flight. 0: the recorded-order prefetch, bounded by
  // max_inflight_all_gathers.
  int prefetch_units = 0;
  // Indices into ShardingPlan::units (>= 1) of units not resharded after
  // forward (FullyShardedModel::SetReshardAfterForward(unit, false); the
  // train binaries' --keep_last_unit keeps the last unit that trains): each
  // is held from its forward to its backward, so while every later unit runs.
  std::vector<int> kept_units;
};

// Bytes one rank holds (FULL_SHARD / SHARD_GRAD_OP), as the memory ledger
// counts them: sharded state exactly; the unsharded peaks as an upper bound
// from the layout (activations and temporaries are not included; explicit
// prefetch lists other than PrefetchNeighbors' are not modelled).
//
// A unit's unsharded parameters take param_bytes per padded element; under a
// low-precision param_bytes (< 4) a unit holding fp32-kept parameters
// (Unit::fp32_numel > 0) takes 4 per padded element (its fp32 gather), plus,
// once in use (not while only prefetched), param_bytes per element not kept
// (the compute copies FullyShard casts from the gather).
struct FsdpRankBytes {
  int64_t sharded_parameters = 0;  // fp32 shards: 4 * shard_numel
  int64_t sharded_gradients = 0;   // fp32: 4 * trainable_shard_numel
  int64_t optimizer_state = 0;     // K * trainable_shard_numel
  // FULL_SHARD: the root unit (kept from its forward to its backward) plus
  // the maximum over units u of: the units held while u runs (those
  // enclosing u, and the kept_units before u) plus max_inflight_all_gathers
  // (prefetch_units + 1) units (u, and the ones prefetched ahead of it):
  // the largest such set of distinct units not held. Without nesting, kept
  // units and fp32 units: the root plus max_inflight_all_gathers of the
  // largest units. SHARD_GRAD_OP: every unit.
  int64_t unsharded_parameters_peak = 0;
  // fp32 unsharded gradients: the root's plus the maximum over units u of
  // u's enclosing units' (allocated from their pre-backward to their
  // post-backward) plus the two largest units that do not enclose u (the
  // one computing and the one whose reduce-scatter is in flight); units of
  // frozen parameters only have none. Without nesting: the root plus the two
  // largest units. Under no_sync: every trainable unit's.
  int64_t unsharded_gradients_peak = 0;
  // Every unit gathered at once, as a forward-only pass with the whole model
  // holds it (FullyShardedModel::Unshard: the train binaries'
  // --sample_gather=model, the default for --sample_every's samples); no
  // unsharded gradient is held then. (A forward-only pass that gathers unit
  // by unit, evaluation's, holds what the training forward does, at most
  // unsharded_parameters_peak.)
  int64_t whole_model_parameters = 0;
  int64_t model_state() const { return sharded_parameters + sharded_gradients + optimizer_state; }
  int64_t peak() const {
    return model_state() + unsharded_parameters_peak + unsharded_gradients_peak;
  }
  // model_state() + whole_model_parameters: a sample's peak with the whole model gathered.
  int64_t whole_model_peak() const { return model_state() + whole_model_parameters; }
};

FsdpRankBytes EstimateFsdpRank(const ShardingPlan& plan, const FsdpEstimateOptions& options);

}  // namespace dist

#endif  // DIST_FSDP_PLAN_H_
