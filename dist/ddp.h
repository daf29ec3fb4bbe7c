// dist::DistributedDataParallel: plain data parallelism with bucketed,
// asynchronous gradient all-reduce (PyTorch DDP's design, over ProcessGroup),
// in fp32 or with bf16/f16 mixed precision.
//
//   dist::DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 25});
//   model.ForwardBackward(idx, targets);   // buckets all-reduce during backward
//   optimizer->Step(optim::FromModule(model));
//   ddp.ZeroGrad();
//
// At construction every parameter value and buffer is broadcast from rank 0,
// so the ranks start equal; and the buffers again before each training
// forward (DdpOptions::broadcast_buffers, PyTorch's default). The parameters, in reverse registration order (the
// order backward produces their gradients), are packed into flat fp32 buckets
// of at most bucket_cap_mb (a parameter larger than the cap gets a bucket of
// its own; parameters kept fp32 get buckets of their own when the others are
// reduced in low precision); each Parameter::grad becomes a view of its
// bucket, so layers accumulate straight into the buckets. Frozen parameters
// (requires_grad false, set before construction) are in no bucket and have no
// gradient: as PyTorch DDP, nothing of theirs is communicated.
//
// Hooks: a ModuleHooks object of this class is installed on every module of
// the model (chaining to hooks installed before it, which still run first in
// PostBackward and last in PreBackward). A parameter's gradient is final when
// its module's backward is done -- its last backward of the step, for a module
// run several times in forward (T5's shared embedding, run by the encoder and
// the decoder) -- and the backward wrote it as often as the first synced
// backward did (a use by another module, like T5's tied head, is waited for;
// internal::BucketReadiness). The first synced backward, which learns those
// counts, issues every bucket at its end, as PyTorch DDP's first iteration
// learns the order; later ones overlap: a bucket whose parameters are all
// final is all-reduced (avg) asynchronously, in bucket order on every rank,
// while backward goes on (a gradient written after its bucket went out stops
// the backward with an error naming it, not a wrong average; the ranks agree
// on it, so a late write on one rank stops every rank's backward, the others
// naming that rank; so does a backward that threw partway on one rank, whose
// gradients are partial: see FinishBackward). At the root's PostBackward the
// remaining buckets are issued and all are waited for (FinishBackward), so when
// the root's RunBackward returns, every rank holds the averaged gradients.
// Hooks installed on the model's modules after this object are not chained:
// install other wrappers first.
//
// no_sync(): while the returned guard lives, backward accumulates locally and
// communicates nothing; the next synced backward all-reduces the accumulated
// sum (PyTorch semantics).
//
// Mixed precision (DdpOptions::mixed_precision; default fp32 = the above, bit
// for bit). The module's own fp32 Parameter::value tensors are the masters
// (the optimizer updates them, as in one process). The training loop does not
// change: the root's PreForward sets each parameter's value to a param_dtype
// copy of its master (parameters of modules whose class the policy keeps fp32
// keep their fp32 value) -- nn::MixedPrecision::CastForCompute, the same
// values as one process gets -- and the root's PostBackward, after the
// all-reduces, points the values back at the fp32 masters
// (RestoreMasters), so the optimizer step and anything after it see fp32.
// Layers accumulate fp32 gradients into the fp32 buckets (as in one process).
// With reduce_dtype != f32 and more than one rank, each bucket is cast to a
// reduce_dtype copy (kCommunication) when it is issued, all-reduced (avg) in
// that dtype (PyTorch's bf16 compress hook) and cast back into its fp32 bucket
// as soon as its all-reduce has completed; the copy is then freed. Parameters
// of modules the policy keeps fp32 (BatchNorm) have buckets of their own,
// all-reduced in fp32 (unlike PyTorch DDP's bf16 hook, which compresses every
// bucket; as PyTorch FSDP's units of such modules). With one
// rank nothing is communicated and the fp32 gradients are kept exactly, so a
// world-1 run equals nn::MixedPrecision in one process bit for bit.
//
// Memory per rank (ledger categories; Psi parameters; S the optimizer's bytes
// of state per parameter, AdamW 8):
//   held between steps   kParameters 4 Psi (fp32 masters), kGradients 4 Psi
//                        (fp32 buckets), kOptimizerState S Psi: 16 Psi for
//                        AdamW in fp32 and in mixed precision alike = the ZeRO
//                        paper's DDP formula, (4+4+K) Psi with K = S in fp32
//                        and (2+2+K) Psi with K = 4 + S (the fp32 master
//                        counted in K) in mixed precision;
//   added during a step  mixed: kParameters 2 Psi (param_dtype compute copies,
//                        forward to backward), kCommunication up to 2 Psi
//                        (reduce_dtype bucket copies in flight).
// After a forward without backward (evaluation), values stay param_dtype copies
// until the next backward or the destruction of this object; the next forward
// casts again from the masters. The masters are the value tensors at
// construction: update them in place (the optimizer does), do not assign new
// tensors to Parameter::value.
//
// The model's parameters must be materialized contiguous fp32 tensors on one
// device (the CPU, or a GPU: buckets, casts and all-reduces then run in device
// memory, through an engine that takes device tensors: nccl, or threads).
#ifndef DIST_DDP_H_
#define DIST_DDP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/grad_buckets.h"
#include "dist/process_group.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "precision/policy.h"
#include "tensor/tensor.h"

namespace dist {

// Broadcasts every parameter value and every buffer of `module` from `root`
// (all issued, then all waited for).
absl::Status BroadcastModuleState(nn::Module& module, ProcessGroup& pg, int root = 0);

namespace internal {
// broadcast_buffers (DDP's and ZeRO-1's option): at the root's PreForward of
// a training forward -- not under no_sync (`require_sync` false), not while
// forward-only, not a recomputed forward -- every buffer from rank 0; throws
// OpError naming `op` when the broadcast fails. Nothing for a model without
// buffers or a group of one.
void BroadcastBuffersForForward(const char* op, nn::Module& model, ProcessGroup& pg,
                                bool require_sync, bool forward_only);
}  // namespace internal

// The device of `params` (CPU when empty). Throws tensor::OpError naming the
// parameter when a wrapper holds it already (Parameter::held_by), or it is
// undefined, not a contiguous fp32 tensor, or on another device than the
// first. DDP's and ZeRO-1's check of the model.
tensor::Device ModelDevice(const char* op,
                           const std::vector<std::pair<std::string, nn::Parameter*>>& params);

namespace internal {

// Throws tensor::OpError (naming `op` and the module) when a module of
// `root`'s tree carries DDP's or ZeRO-1's hooks: a model wrapped twice, whose
// collectives would run twice per backward. (FSDP's parameters are refused
// by ModelDevice; a user's own hooks are chained to.)
void CheckNotWrapped(const char* op, nn::Module& root);

// A ModuleHooks installed on every module of `root`'s tree, chaining to the
// hooks each module had. Calls `post_backward(module)` after each module's
// backward (after the chained hook), `root_pre_backward()` before the root's
// backward and `pre_forward(module)` (if set) before each module's forward
// (both after the chained hook). Restores the previous hooks on destruction.
class BackwardHooks : public nn::ModuleHooks {
 public:
  BackwardHooks(nn::Module& root, std::function<void()> root_pre_backward,
                std::function<void(nn::Module&)> post_backward,
                std::function<void(nn::Module&)> pre_forward = nullptr);
  ~BackwardHooks() override;
  BackwardHooks(const BackwardHooks&) = delete;
  BackwardHooks& operator=(const BackwardHooks&) = delete;

  void PreForward(nn::Module& module) override;
  void PostForward(nn::Module& module) override;
  void PreBackward(nn::Module& module) override;
  void PostBackward(nn::Module& module) override;

 private:
  nn::ModuleHooks* Previous(nn::Module& module) const;

  nn::Module& root_;
  std::function<void()> root_pre_backward_;
  std::function<void(nn::Module&)> post_backward_;
  std::function<void(nn::Module&)> pre_forward_;
  std::unordered_map<nn::Module*, nn::ModuleHooks*> previous_;
};

}  // namespace internal

struct DdpOptions {
  // The largest bucket, in MiB of fp32 gradients.
  double bucket_cap_mb = 25;
  // With a low-precision reduce_dtype: the most buckets whose reduce_dtype
  // copy exists at once (issuing another first waits for the oldest), so the
  // copies take at most this many buckets' bytes (0: no bound, as PyTorch
  // DDP). fp32 buckets reduce in place and are not bounded.
  int max_inflight_buckets = 2;
  // Compute / communication dtypes (see above). Default: everything fp32.
  precision::MixedPrecisionPolicy mixed_precision = precision::MixedPrecisionPolicy::Fp32();
  // PyTorch DDP's broadcast_buffers: each training forward (not under
  // no_sync, not between BeginForwardOnly and EndForwardOnly) starts by
  // broadcasting every buffer from rank 0 (BatchNorm's running statistics),
  // so that the ranks' buffers stay rank 0's rather than drift apart. A model
  // without buffers communicates nothing. false: each rank keeps its own.
  bool broadcast_buffers = true;
};

class DistributedDataParallel {
 public:
  // Throws tensor::OpError if a parameter is not a materialized fp32 tensor
  // on the model's one device, the mixed-precision policy names a dtype that
  // device lacks, or the initial broadcast fails.
  DistributedDataParallel(nn::Module& model, ProcessGroup& pg, DdpOptions options = {});
  // Waits for all-reduces still in flight, points the values back at the fp32
  // masters (mixed precision) and restores the modules' hooks. The
  // parameters' grads stay views of the buckets.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  nn::Module& module() { return model_; }
  const precision::MixedPrecisionPolicy& mixed_precision() const {
    return options_.mixed_precision;
  }
  // True when gradients travel in reduce_dtype (not f32, more than one rank;
  // the buckets of parameters kept fp32 travel in fp32 still).
  bool reduces_in_low_precision() const { return reduce_low_; }

  // Issues the buckets not issued yet and waits for all; idempotent within a
  // step (the root's PostBackward calls it; it throws there on error). Returns
  // this rank's first error (its all-reduces', or a gradient it wrote late);
  // or, when another rank failed so, an error naming that rank: the ranks
  // agree on the result in one all-reduce. OK and nothing to do under
  // no_sync. After a backward that threw on this rank (out of memory), this
  // or ZeroGrad issues what it did not, so the ranks' collectives stay in
  // step. A backward that threw before the root's backward ended left partial
  // gradients (internal::PartialBackward): this returns FailedPrecondition on
  // that rank and an error naming it on the others (their root's
  // PostBackward throws it), so no rank steps. The gradients stay partial
  // until ZeroGrad, on every rank, skips the batch: a synced backward after
  // one that stopped under no_sync, or after this error without ZeroGrad, is
  // refused too. One that threw after the root's backward ended (a reduction
  // copy out of memory) wrote every gradient: this issues what it did not and
  // the step goes on. A parameter that no rank's backward reached since the
  // last ZeroGrad (a branch or expert no rank ran; agreed in the same
  // all-reduce) keeps the gradient it had then, as in one process and as
  // PyTorch's DDP leaves a globally unused parameter's grad: none after
  // ZeroGrad(set_to_none=true) (or when it had none when wrapped), so the
  // optimizer skips it; zeros after ZeroGrad(set_to_none=false), which the
  // optimizer steps (weight decay, momentum). One that some rank reached is
  // averaged as usual (zeros from the others). The step begins at this
  // wrapper's ZeroGrad (or construction): the model's own nn::Module::ZeroGrad
  // does not begin one here, so a parameter reached before it counts as
  // reached.
  absl::Status FinishBackward();

  // Sets every gradient (every bucket) to zero in place, except that an
  // undefined one (none when wrapped, or none since set_to_none, and no rank
  // has reached it since) stays so, as nn::Module::ZeroGrad leaves it; or, with
  // set_to_none (PyTorch's zero_grad default), drops the parameters'
  // gradients (undefined until the next backward) and zeroes nothing: that
  // backward writes each gradient into its bucket instead of adding to zeros.
  // A backward whose all-reduces are still in flight (one that threw) is
  // finished first: a backward that stopped partway on some rank is no error
  // here (its gradients are the ones dropped); its all-reduces failing is
  // (OpError).
  void ZeroGrad(bool set_to_none = false);
  // Before forward passes without a backward (evaluation, generation): the
  // compute copies (mixed precision) are made once here and kept until
  // EndForwardOnly, where each root forward would cast them again. A backward
  // in between throws OpError.
  void BeginForwardOnly();
  // After forward passes without a backward (evaluation): points the
  // parameters back at their fp32 masters (mixed precision), as the root's
  // PostBackward would, so that a checkpoint or an optimizer step sees them.
  void EndForwardOnly();

  // While the guard lives, backward passes do not all-reduce.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel* ddp) : ddp_(ddp), previous_(ddp->require_sync_) {
      ddp_->require_sync_ = false;
    }
    ~NoSyncGuard() { ddp_->require_sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(this); }
  bool require_sync() const { return require_sync_; }

  // ---- Introspection (tests, logs) ----
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Names of bucket i's parameters, in their order in the bucket.
  std::vector<std::string> BucketParameterNames(int i) const;
  int64_t BucketNumel(int i) const { return buckets_.at(i).flat.numel(); }

  // The most buckets' reduce_dtype copies that existed at once during the
  // last synced backward (0 when reducing in fp32).
  int last_peak_inflight_copies() const { return copies_ ? copies_->last_peak_inflight() : 0; }

  // What happened during the last synced backward, in order.
  using Event = BackwardEvent;
  const std::vector<Event>& last_backward_events() const { return events_; }

 private:
  struct Bucket {
    tensor::Tensor flat;      // fp32 (numel), the gradients
    std::vector<int> params;  // indices into params_, in bucket order
    bool kept_fp32 = false;   // parameters the policy keeps fp32: all-reduced in fp32
    WorkPtr work;             // set once issued this step
  };

  void OnPreForward(nn::Module& module);
  void OnRootPreBackward();
  void OnPostBackward(nn::Module& module);
  void IssueReadyBuckets();
  internal::AgreedReductions Finish();

  nn::Module& model_;
  ProcessGroup& pg_;
  DdpOptions options_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;
  std::vector<bool> frozen_;  // per params_, at construction
  std::vector<tensor::Tensor> grad_views_;  // per parameter: its view of its bucket
  std::vector<Bucket> buckets_;
  std::unique_ptr<internal::BucketReadiness> readiness_;
  bool finished_ = true;              // this step's all-reduces waited for
  internal::AgreedReductions agreed_;  // their result
  internal::PartialBackward partial_;  // a backward stopped partway since ZeroGrad
  // Each parameter's Parameter::grad_writes at the last ZeroGrad (the step's
  // start): the step's writes, over its micro-batches, are the difference.
  std::vector<int64_t> writes_at_zero_grad_;
  // Per parameter: it had no gradient at the last ZeroGrad (or when
  // wrapped); unless some rank writes one, it keeps none after the step.
  std::vector<bool> none_at_zero_grad_;
  bool require_sync_ = true;
  bool syncing_this_step_ = false;
  bool forward_only_ = false;  // between BeginForwardOnly and EndForwardOnly
  std::vector<Event> events_;
  bool reduce_low_ = false;                    // all-reduce in reduce_dtype
  std::unique_ptr<internal::LowPrecisionCopies> copies_;  // of the buckets in flight (reduce_low_)
  internal::ComputeCopies compute_{"ddp"};                // param_dtype copies (mixed only)
  std::unique_ptr<internal::BackwardHooks> hooks_;
};

}  // namespace dist

#endif  // DIST_DDP_H_
