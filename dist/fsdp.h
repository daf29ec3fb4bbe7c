// FSDP (Fully Sharded Data Parallel, as PyTorch FSDP / DeepSpeed ZeRO-3) over a
// dist::ProcessGroup: fp32 masters, optional mixed-precision compute (below).
//
// FullyShard(root, pg, options) splits the model into units by the wrap
// policy (see wrap_policy.h), gives each unit a FlatParameter whose shard this
// rank owns (sharded initialization: no rank ever materializes the model), and
// installs nn::ModuleHooks on each unit's module:
//   PreForward   all-gather the flat parameter (shard -> unsharded buffer,
//                copy-free) and point every parameter's value at its view.
//   PostForward  FULL_SHARD: free the unsharded buffer (values undefined),
//                except the root unit, kept unsharded until its backward (as
//                PyTorch). SHARD_GRAD_OP keeps it.
//   PreBackward  all-gather again if freed; point every parameter's grad at a
//                view of a zeroed unsharded fp32 flat gradient buffer.
//   PostBackward reduce-scatter (avg) the flat gradient; this rank's chunk is
//                added to its sharded fp32 gradient; free the unsharded
//                gradient and parameters.
//   NO_SHARD (= DDP): every rank holds the whole flat parameter (values stay
//   views of it) and the gradient is all-reduced (avg) into the full fp32 grad.
// The hooks run inside Module::Run / RunBackward, so a model whose containers
// call their children through Run / RunBackward (minGPT does) needs no change.
//
// Mixed precision (FsdpOptions::mixed_precision, default fp32 = the above bit
// for bit): shards, sharded gradients and optimizer state stay fp32. With
// param_dtype bf16/f16 PreForward/PreBackward cast the fp32 shard into a
// low-precision send buffer and all-gather it into a low-precision unsharded
// buffer; parameter values are views of it. Layers accumulate into fp32 grad
// views (unchanged); PostBackward casts the fp32 unsharded gradient to
// reduce_dtype, reduce-scatters (all-reduces under NO_SHARD) in that dtype and
// adds the result into the fp32 gradient shard (reduce_dtype f32: as before).
// Modules whose class the policy keeps fp32 (fp32_module_classes, BatchNorm):
// under low-precision compute or reduction FullyShard makes each outermost one
// a unit of its own, nested in the unit that would hold it
// (WrapPolicy::ForMixedPrecision; PyTorch wraps its _module_classes_to_ignore
// in fp32 units under an auto-wrap policy, here under None() too). Such a
// unit gathers and reduces in fp32 -- per parameter the values
// nn::MixedPrecision gives in one process -- and the others stay in the low
// precision. (A unit that still holds kept and other parameters -- a kept
// parameter shared with a module of another unit -- gathers in fp32, gives
// the others param_dtype copies of their views, and reduces in fp32 as a
// whole.)
// FullStateDict always gathers the fp32 shards.
//
// Frozen parameters (nn::Parameter::requires_grad false, set before
// FullyShard; nn::FreezeParameters): a unit may mix frozen and trainable
// parameters, as FSDP's use_orig_params=True allows. Frozen parameters get no
// gradient views (their elements of the flat gradient stay zero) and their
// ranges of the shard are ParamRef::frozen_ranges, which the optimizer skips.
// A unit whose parameters are all frozen is still gathered for forward and
// backward (its input gradients need the weights) but allocates no gradient,
// reduces nothing and has no ParamRef and no optimizer state.
//
// Overlap (communication runs on the process group's worker thread while this
// thread computes). The first forward and backward record the order in which
// units run; later passes use it:
//   forward_prefetch   PreForward of a unit issues the all-gather of the next
//                      unit(s) in forward order before waiting for its own.
//   backward_prefetch  kPre: PreBackward issues the next unit's all-gather
//                      (backward order) before this unit's backward computes;
//                      kPost: PostBackward issues it before this unit's
//                      reduce-scatter; kNone: each unit gathers when it runs.
//   max_inflight_all_gathers  at most this many all-gathers issued and not yet
//                      used by their unit (the waiting unit's own included):
//                      bounds the unsharded units held at once; 1 = no prefetch.
//   SetForwardPrefetch / SetBackwardPrefetch (below) name the units a unit
//   prefetches instead, from the first pass on (FSDP2's explicit prefetch).
//   Reduce-scatters are issued asynchronously by PostBackward; each unit's is
//   finished (waited, added into the fp32 shard) by the next unit's
//   PostBackward, and all by the root's, so when the root's backward returns
//   every gradient shard is final. A unit's prefetched gather is used only in
//   the same forward/backward pass (a pass starts at the root's PreForward);
//   otherwise PreForward gathers again (the shard may have changed: an
//   optimizer step, a loaded checkpoint).
//
// no_sync(): while the guard lives, backward accumulates each unit's unsharded
// fp32 gradient locally (kept between backwards: one full gradient per unit,
// as PyTorch) and communicates nothing; the next synced backward adds to it
// and reduce-scatters the sum.
//
// HYBRID_SHARD: FULL_SHARD within shard groups of hybrid_shard_group_size
// consecutive ranks (a node), replicated across groups: gradients are
// reduce-scattered (avg) in the shard group, then all-reduced (avg) over the
// replicate group (ranks holding the same shard).
// HYBRID_SHARD_ZERO2 (PyTorch's _HYBRID_SHARD_ZERO2): the same groups with
// SHARD_GRAD_OP inside them: units stay unsharded from their forward to their
// backward, so a step all-gathers once per unit (within the node) instead of
// twice, for the memory of every unit's unsharded parameters during the step.
//
// Devices (FsdpOptions::device): the unsharded parameters and gradients, the
// module's buffers and its computation live on the compute device (inputs
// must be there too); so do the shards, the sharded gradients and thus the
// optimizer state, unless offloaded. On a CUDA device the collectives run
// on device buffers: the nccl engine, or the threads engine (ranks sharing a
// GPU, staged through host memory).
//
// CPU offload (FsdpOptions::cpu_offload; PyTorch's
// CPUOffload(offload_params=True), ZeRO-Offload): the fp32 shards and sharded
// gradients stay in host memory, and so the optimizer steps on the host with
// its state there. The compute device holds only unsharded units: each
// unshard copies the shard to the device (cast to param_dtype on the host
// first: fewer bytes to copy) and all-gathers it there; each reduced gradient
// shard is copied back (in the unit's reduce dtype) and accumulated into the fp32 host
// shard. Both go through page-locked buffers of the largest shard, one per
// dtype, allocated by FullyShard, so no step allocates page-locked memory.
// Needs a CUDA compute device.
//
// Collective failures inside hooks throw tensor::OpError naming the unit.
// Every rank must call the same FSDP methods in the same order (they issue
// collectives).
#ifndef DIST_FSDP_H_
#define DIST_FSDP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/flat_param.h"
#include "dist/process_group.h"
#include "dist/wrap_policy.h"
#include "nn/module.h"
#include "optim/param_ref.h"
#include "precision/policy.h"
#include "tensor/memory_ledger.h"
#include "tensor/tensor.h"

namespace dist {

enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard, kHybridShardZero2 };
const char* ShardingStrategyName(ShardingStrategy s);  // "FULL_SHARD", ...
// HYBRID_SHARD or HYBRID_SHARD_ZERO2: sharded within groups, replicated across.
bool IsHybrid(ShardingStrategy s);
// FULL_SHARD or HYBRID_SHARD: a unit's unsharded parameters are freed after
// its forward (and gathered again for its backward).
bool ReshardsAfterForward(ShardingStrategy s);

enum class BackwardPrefetch { kPre, kPost, kNone };
const char* BackwardPrefetchName(BackwardPrefetch p);  // "BACKWARD_PRE", ...

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  WrapPolicy policy = WrapPolicy::None();
  // Seed of sharded initialization (parameters that have no value yet).
  uint64_t seed = 0;
  // Compute / communication dtypes (see above). Default: everything fp32.
  precision::MixedPrecisionPolicy mixed_precision = precision::MixedPrecisionPolicy::Fp32();
  // Prefetch and overlap (see above); PyTorch's defaults.
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  int max_inflight_all_gathers = 2;
  // HYBRID_SHARD(_ZERO2) only: ranks per shard group (e.g. ranks per node);
  // must divide the world size. Other strategies: must stay 0.
  int hybrid_shard_group_size = 0;
  // The compute device (see above): cpu, or cuda:N available to this rank.
  tensor::Device device = tensor::Device::Cpu();
  // Shards, sharded gradients and optimizer state in host memory (see
  // above); needs a CUDA device.
  bool cpu_offload = false;
  // PyTorch FSDP's sync_module_states: every rank's parameters and buffers
  // start as rank 0's (a unit at a time broadcast before it is sharded), so
  // a model only rank 0 loaded (or materialized) shards as that model. Rank 0
  // must have every parameter materialized; the other ranks need not. Off:
  // each rank shards its own values (or initializes from `seed`), which must
  // then agree (FULL_SHARD would otherwise stitch the ranks' slices
  // together, and replicas under NO_SHARD or HYBRID_SHARD would differ).
  bool sync_module_states = false;
};

namespace internal {
class FsdpUnit;
struct FsdpShared;
}

class FullyShardedModel {
 public:
  ~FullyShardedModel();  // uninstalls the hooks
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  // One ref per unit that trains: this rank's fp32 shard, its sharded fp32
  // gradient, its weight-decay and frozen ranges, named "fsdp.<unit>"
  // ("fsdp.root" for the root). Units of frozen parameters only have none.
  // The caller may change the shards: NO_SHARD's offloaded uploads still
  // queued on the GPU, which read them, are waited for first.
  std::vector<optim::ParamRef> ParamRefs();
  // Drops gradients accumulated under no_sync, and zeroes the sharded
  // gradients in place; with set_to_none (PyTorch's zero_grad default) marks
  // them unwritten instead (FlatParameter::DropGradShard): the next backward's
  // reduce writes each one, with no memset and no read of the old values. A
  // shard no reduce reached by the time ParamRefs, ClipGradNorm or
  // UnscaleGradsAndCheck reads it is zeroed there: optimizers and clipping see
  // zeros, as after ZeroGrad().
  void ZeroGrad(bool set_to_none = false);

  // While the guard lives, backward communicates nothing (see above).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedModel* m);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedModel* m_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(this); }
  // Gathers every unit's parameters (collective: every rank calls it) and
  // points their values at the unsharded buffers, in the compute dtype
  // (param_dtype; fp32 for kept classes), until Reshard(): PyTorch FSDP2's
  // unshard(), FSDP1's summon_full_params(writeback=False). For forward-only
  // work that runs many forwards on the same parameters (generation: one
  // gather for all the tokens, where each decoding step would otherwise
  // gather every unit again). Whatever a unit held from an earlier pass is
  // dropped first, so the values are the shards' current ones (after an
  // optimizer step or a loaded checkpoint). Writes to the values are not
  // kept. Until Reshard() forward hooks communicate nothing (so ranks may
  // run different forwards) and a backward throws OpError.
  void Unshard();
  // Unshard() for the root unit alone (as PyTorch FSDP2's unshard() on the
  // root module, which is not recursive): forward-only passes then gather
  // and free the other units one by one as a FULL_SHARD training forward
  // does (under every strategy: SHARD_GRAD_OP's units too, as no backward
  // follows), and the
  // root (embeddings, head: often the largest unit) is gathered once for
  // all of them instead of once per pass. Until Reshard(); a backward
  // throws OpError.
  void UnshardRoot();
  // Frees every unit's unsharded parameters (values undefined until the next
  // forward gathers them again), as PyTorch FSDP2's reshard(). For after
  // forward passes without a backward (evaluation): FULL_SHARD keeps the root
  // unit, and SHARD_GRAD_OP every unit, unsharded from a forward until its
  // backward, and with no backward to come they would stay held until the
  // next forward. Also ends Unshard() and UnshardRoot(). Local (no collective); must not run
  // between a forward and its backward. Gradients accumulated under no_sync
  // are kept.
  void Reshard();
  // Clips the global 2-norm of the gradients over all shards (sum of squares
  // summed across ranks; collective except under NO_SHARD) and returns the
  // norm before clipping.
  double ClipGradNorm(double max_norm);
  // Dynamic loss scaling (fp16): multiplies every gradient shard by
  // `inv_scale` and returns whether any rank found an inf or NaN (collective:
  // every rank gets the same answer, so all skip the step together; pass it
  // to precision::DynamicLossScaler::Update).
  bool UnscaleGradsAndCheck(double inv_scale);
  // Gathers every unit (collective) and returns, on rank 0, fp32 copies of all
  // parameters named relative to the root (Hugging Face names for minGPT), in
  // registration order, then copies of rank 0's buffers (BatchNorm's
  // statistics; not sharded), as nn::StateDict orders them: what
  // nn::LoadStateDict takes into an unwrapped model. Other ranks get an
  // empty list.
  std::vector<std::pair<std::string, tensor::Tensor>> FullStateDict();
  // The reverse (PyTorch FSDP's load_state_dict under FULL_STATE_DICT): every
  // rank passes the whole state dict (every parameter, then the buffers, as
  // FullStateDict or nn::StateDict name them; any floating dtype) and copies
  // its shards' parts of the parameters into its fp32 shards, and the buffers
  // whole; then frees the units held unsharded (as Reshard), so the next
  // forward gathers the loaded values. A collective: the ranks agree before
  // anything is written, so one rank's refusal fails every rank and changes
  // nothing anywhere. The optimizer's state is left as it is.
  // InvalidArgument naming a missing, unknown, twice-named, misshapen or
  // non-floating entry, as nn::CheckStateDict finds it (on the rank that
  // found it; FailedPrecondition naming that rank on the others);
  // ResourceExhausted when staging ran out of memory. Must not run between
  // a forward and its backward.
  absl::Status LoadFullStateDict(const std::vector<std::pair<std::string, tensor::Tensor>>& state);

  // Explicit prefetch (PyTorch FSDP2's set_modules_to_forward_prefetch and
  // set_modules_to_backward_prefetch): the PreForward (PreBackward) of unit
  // `unit` issues the all-gathers of the units `next`, in that order, right
  // after its own and before it waits for it, in every pass from the first
  // on: no recorded order is needed, and the units need not follow each
  // other (e.g. each block gathering the next two: layers[i] -> {layers[i+1],
  // layers[i+2]}). At that unit the list replaces forward_prefetch's
  // (backward_prefetch's, kPre or kPost) prefetch from the recorded order;
  // an empty list turns prefetching off there. The units named are gathered
  // whatever max_inflight_all_gathers says (the list is the bound) and count
  // against it for the recorded-order prefetches of other units. A listed
  // unit the pass does not run next is freed unused at the end of the pass;
  // once a backward has run, a backward list skips the units it did not run
  // (those under the model's lowest trainable parameter, whose backward the
  // model skips). Names are unit_name()'s ("" is the root); an unknown name, `unit` itself
  // in `next` or a name listed twice throws OpError naming it. Local, but
  // it changes which collectives a pass issues: every rank must set the
  // same lists.
  void SetForwardPrefetch(const std::string& unit, const std::vector<std::string>& next);
  void SetBackwardPrefetch(const std::string& unit, const std::vector<std::string>& next);
  // The index of the unit named `name` (unit_name's); OpError listing the
  // units if there is none.
  int unit_index(const std::string& name) const;
  // Whether unit `unit` frees its unsharded parameters after its forward
  // (PyTorch FSDP2's per-module reshard_after_forward), overriding the
  // strategy's rule for it (FULL_SHARD and HYBRID_SHARD: true; SHARD_GRAD_OP
  // and HYBRID_SHARD_ZERO2: false). False keeps it gathered until its
  // backward, which then all-gathers nothing: for the last block, whose
  // backward comes first, it saves an all-gather a step for the memory of
  // one unit held through the loss. Forward-only passes free units either
  // way. OpError for the root (always kept until its backward), under
  // NO_SHARD, or an unknown name. Local; every rank must set the same.
  void SetReshardAfterForward(const std::string& unit, bool reshard);
  // All-gathers of unit parameters issued since FullyShard (prefetches,
  // Unshard and UnshardRoot included; FullStateDict's not).
  int64_t all_gathers() const;

  // What the prefetches did since FullyShard: the unit gathers issued ahead
  // of the unit's own hook (by forward_prefetch, backward_prefetch and the
  // explicit lists), and how many of those were freed unused (a pass that
  // ran the units in another order than the one recorded from the pass
  // before it, or than a list said). Each kind of pass prefetches from its
  // own recorded order: training forwards, forward-only passes under
  // Unshard / UnshardRoot, and backwards.
  struct PrefetchStats {
    int64_t issued = 0;
    int64_t unused = 0;
  };
  PrefetchStats prefetch_stats() const;

  int num_units() const { return static_cast<int>(units_.size()); }
  // The wrapped model (its buffers, for checkpoints).
  nn::Module& root() { return *root_; }
  // Unit i's name relative to the root ("" for the root) and flat parameter.
  const std::string& unit_name(int i) const;
  const FlatParameter& flat_param(int i) const;
  ShardingStrategy strategy() const { return options_.strategy; }
  // The shard group: the ranks that each hold one shard of every unit (all
  // ranks, except under the hybrid strategies, where it is this rank's node
  // group), and the replicas: groups holding the same shards (1 except under
  // the hybrid strategies;
  // NO_SHARD: every rank is a replica of one shard). Checkpoint writers save
  // from replica 0 only.
  int shard_group_rank() const;
  int shard_group_size() const;
  int replica_index() const;
  int num_replicas() const;
  // The ParamRef name of unit i ("fsdp.<unit>", "fsdp.root"): the optimizer
  // keeps its state under this name.
  std::string param_ref_name(int i) const;

  // The memory ledger this rank charges (the one current when FullyShard ran).
  const tensor::MemoryLedger& ledger() const { return *ledger_; }
  // This rank's memory on the compute device, and on any device.
  tensor::MemoryStats Memory(tensor::MemoryCategory category) const {
    return ledger_->Stats(options_.device, category);
  }
  tensor::MemoryStats Memory(tensor::Device device, tensor::MemoryCategory category) const {
    return ledger_->Stats(device, category);
  }
  tensor::Device device() const { return options_.device; }

 private:
  friend std::unique_ptr<FullyShardedModel> FullyShard(nn::Module&, ProcessGroup&, FsdpOptions);
  FullyShardedModel(nn::Module& root, ProcessGroup& pg, FsdpOptions options);
  // Reshard, then gather units 0 .. num_units - 1 (0 is the root) and hold
  // them until Reshard.
  void Hold(size_t num_units);
  // Zeroes the sharded gradients ZeroGrad(set_to_none) dropped that no
  // reduce has written since (units the backward skipped, or no backward).
  void ZeroUnreducedGradShards();

  nn::Module* root_;
  ProcessGroup* pg_;
  FsdpOptions options_;
  tensor::MemoryLedger* ledger_;
  std::unique_ptr<ProcessGroup> shard_pg_;      // hybrid strategies only
  std::unique_ptr<ProcessGroup> replicate_pg_;  // hybrid strategies only
  std::unique_ptr<internal::FsdpShared> shared_;
  std::vector<std::unique_ptr<internal::FsdpUnit>> units_;
};

// FSDP2's usual explicit prefetch for a stack of blocks: each unit's forward
// list is the next `k` units in unit order (pre-order: a transformer's
// blocks in the order they run; the root's: units 1 .. k), its backward list
// the `k` before it, the root excluded (the root's: the last k units). So
// the first step prefetches as later ones do. k = 0 sets nothing; k < 0
// throws OpError.
void PrefetchNeighbors(FullyShardedModel& model, int k);

// Shards `root` over `pg` (any engine whose collectives take tensors on
// options.device). Throws tensor::OpError when a unit module already has
// hooks or an option is invalid (the message names it), e.g. a CUDA device
// this binary or machine does not have. A failure on some ranks only (out of
// memory moving the buffers to the device or initializing a unit's shard)
// fails every rank together: that rank with its own error, the others with
// one naming it (an OutOfMemoryError when every rank that failed ran out of
// memory, else an OpError), and the group stays usable.
std::unique_ptr<FullyShardedModel> FullyShard(nn::Module& root, ProcessGroup& pg,
                                              FsdpOptions options = {});

}  // namespace dist

#endif  // DIST_FSDP_H_
