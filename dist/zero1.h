// dist::Zero1: ZeRO stage 1 -- data parallelism with the optimizer state
// sharded across the ranks (Rajbhandari et al., "ZeRO", stage P_os), in fp32
// or with bf16/f16 mixed precision.
//
//   auto opt = optim::AdamW::Create({...}).value();
//   dist::Zero1 zero(model, pg, std::move(opt));  // or (..., {.mixed_precision = Bf16()})
//   model.ForwardBackward(idx, targets);  // buckets reduce-scatter during backward
//   zero.Step();                          // step the slices, all-gather params
//   zero.ZeroGrad();
//
// At construction every parameter and buffer is broadcast from rank 0. The
// parameters are grouped into buckets of at most bucket_cap_mb MiB in reverse
// registration order, as DDP's (bucket 0 holds the last parameters: backward
// finalizes it first; kept-fp32 parameters apart, as there). The flat
// gradient holds the parameters' gradients in registration order, each
// bucket's segment right-padded to a multiple of N = pg.size() and split
// into N equal slices of k_b elements: rank r owns slice r of every bucket,
// k = sum of k_b elements in all. Each bucket has a
// parameter buffer laid out as its segment (the flat parameter is their
// concatenation, allocated per bucket so that construction, which moves the
// model's tensors in, holds the model twice for one bucket at most). Each
// Parameter::value becomes a view of its bucket's buffer and each
// Parameter::grad a view of the flat gradient, so backward accumulates in
// place and the all-gathers are copy-free. The
// optimizer holds state for this rank's slices only, one ParamRef per bucket
// ("zero1.bucket<b>"; kOptimizerState: S k bytes, about S Psi / N; AdamW
// S = 8 bytes per element). Frozen parameters (requires_grad false, set
// before construction) stay in the buckets, since the buckets hold the
// parameters too, but get no gradient view: their part of the flat gradient
// stays zero (reduce-scattered as zeros) and their slice ranges are the refs'
// frozen_ranges, which the optimizer leaves as they are (their state zero).
// A bucket of frozen parameters only (with the default reverse order, a
// large frozen embedding gets one of its own) reduce-scatters nothing, takes
// no optimizer step (no state) and all-gathers nothing.
//
// Backward (hooks installed on every module, as DDP's, chaining to earlier
// hooks): once every parameter of a bucket has its final gradient (the rule
// of internal::BucketReadiness, which the first synced backward learns: it
// issues every bucket at its end), the bucket's segment of the flat gradient is
// reduce-scattered (avg) asynchronously into this rank's slice of it, in
// bucket order, so the reduce-scatters overlap the rest of backward (as
// DeepSpeed's overlap_comm). The root's PostBackward issues what is left.
// Step() waits for them, then bucket by bucket steps the optimizer over the
// fp32 master slice (decay ranges from Parameter::weight_decay via
// optim::SliceRanges), writes it into the bucket's buffer and starts the
// bucket's all-gather, which runs while the next bucket steps; it returns
// once every all-gather is done, so every rank ends with the same full
// parameters. After a synced backward only this
// rank's slices of the flat gradient hold averaged values (the rest holds
// local gradients), so the next backward must follow ZeroGrad(): a backward
// after a synced one before Step(), or after Step() without ZeroGrad(), throws
// OpError saying so (accumulate micro-batches under no_sync(), the last one
// synced). DDP and FSDP add such backwards up; ZeRO-1 would average twice.
//
// fp32 (the default): the flat parameter is fp32 and this rank's slices of
// it are the master (master_shard(b) is a view of it: no copy).
//
// Mixed precision (Zero1Options::mixed_precision with param_dtype bf16/f16):
//   - No module of a class the policy keeps fp32 holds parameters (minGPT, T5
//     with the default policy): the flat parameter is in param_dtype and the
//     values are param_dtype views of it at all times (they are the compute
//     copies; Parameter::value is never fp32). The master is a separate fp32
//     buffer of k elements (kParameters), a slice per bucket. Step() writes
//     the master slices, rounded to param_dtype, into the flat parameter and
//     all-gathers them in param_dtype (half the bytes of fp32).
//     FullStateDict() gathers the fp32 masters.
//   - Otherwise (e.g. BatchNorm1d parameters): the flat parameter stays fp32
//     as above, and the root's PreForward points the values of parameters not
//     kept fp32 at param_dtype copies (nn::MixedPrecision::CastForCompute,
//     kParameters, freed at the root's PostBackward, which points them back at
//     the fp32 views).
//   Either way each parameter computes with the same values nn::MixedPrecision
//   gives it in one process. Layers accumulate fp32 gradients into the flat
//   gradient. With reduce_dtype != f32 and more than one rank each bucket is
//   cast to a reduce_dtype copy when it is issued (kCommunication, N k_b),
//   reduce-scattered in that dtype, and this rank's slice of the result is
//   cast back into the fp32 gradient slice (grad_shard(b)) as soon as it is
//   done, freeing the copy: only the buckets in flight hold copies, at most
//   max_inflight_buckets of them. Parameters of modules the policy keeps fp32
//   (BatchNorm) have buckets of their own, reduce-scattered in fp32. With one
//   rank nothing is communicated or rounded: a world-1 run equals
//   nn::MixedPrecision in one process bit for bit.
//
// Memory per rank held between steps (ledger; Psi parameters, K the ZeRO
// paper's optimizer constant: the optimizer's bytes per parameter in fp32,
// + 4 for the fp32 master in mixed precision, so AdamW K = 8 / 12):
//   fp32:   kParameters 4 Psi (flat parameter), kGradients 4 Psi (flat
//           gradient), kOptimizerState K Psi/N = (4+4) Psi + K Psi/N, the
//           paper's fp32 ZeRO-1 formula;
//   mixed:  kParameters 2 Psi (param_dtype flat parameter) + 4 Psi/N (fp32
//           master shard), kGradients 4 Psi (fp32 flat gradient),
//           kOptimizerState (K-4) Psi/N = (2+4) Psi + K Psi/N: the paper's
//           (2+2) Psi + K Psi/N but for the gradients, which are fp32 here
//           (Parameter::grad is fp32 by contract: layers accumulate in fp32,
//           no_sync accumulates micro-batches in fp32);
//   mixed with kept-fp32 classes: as fp32, plus up to 2 Psi of compute
//           copies from forward to backward.
// Psi above includes the padding: each bucket's elements rounded up to a
// multiple of N (fewer than N elements per bucket).
//
// no_sync(): backward accumulates locally and communicates nothing; the next
// synced backward reduce-scatters the accumulated sum.
//
// The master slices are the source of truth: changing Parameter::value
// directly between steps is overwritten by the next Step() (in fp32, changes
// to this rank's slices of it are the master).
#ifndef DIST_ZERO1_H_
#define DIST_ZERO1_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/ddp.h"
#include "dist/grad_buckets.h"
#include "dist/process_group.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/param_ref.h"
#include "precision/policy.h"
#include "tensor/tensor.h"

namespace dist {

struct Zero1Options {
  // Compute / communication dtypes (see above). Default: everything fp32.
  precision::MixedPrecisionPolicy mixed_precision = precision::MixedPrecisionPolicy::Fp32();
  // The largest bucket, in MiB of fp32 gradients (must be > 0). A cap above
  // the model's size gives one bucket, reduce-scattered when backward ends.
  double bucket_cap_mb = 25;
  // With a low-precision reduce_dtype: the most buckets whose reduce_dtype
  // copy exists at once (issuing another first waits for the oldest), so the
  // copies take at most this many buckets' bytes (0: no bound). DeepSpeed's
  // overlap_comm double-buffers: 2. fp32 buckets reduce in place.
  int max_inflight_buckets = 2;
  // As DdpOptions::broadcast_buffers (PyTorch's ZeroRedundancyOptimizer runs
  // under DDP, which does it): each training forward starts from rank 0's
  // buffers. false: each rank keeps its own.
  bool broadcast_buffers = true;
};

class Zero1 {
 public:
  // Throws tensor::OpError if a parameter is not a materialized fp32 tensor
  // on the model's one device (CPU or GPU: the flat buffers, the master
  // slices and so the optimizer state live there), the optimizer is null,
  // bucket_cap_mb is not > 0, the mixed-precision policy names a dtype that
  // device lacks, or the initial broadcast fails.
  Zero1(nn::Module& model, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> optimizer,
        Zero1Options options = {});
  // Waits for reduce-scatters in flight; points values back at the fp32
  // views if compute copies are out (kept-fp32 classes); restores the
  // modules' hooks.
  ~Zero1();
  Zero1(const Zero1&) = delete;
  Zero1& operator=(const Zero1&) = delete;

  // Waits for this step's reduce-scatters (issuing those the root's
  // PostBackward did not) and casts low-precision results into the fp32
  // gradient slices. Returns this rank's first error (its reduce-scatters',
  // or a gradient it wrote after its bucket went out); or, when another rank
  // failed so, an error naming that rank: the ranks agree on the result in
  // one all-reduce, so none steps. OK and nothing to do under no_sync. After
  // a backward that threw on this rank (out of memory), this or ZeroGrad
  // issues what it did not, so the ranks' collectives stay in step. A
  // backward that threw before the root's backward ended left partial
  // gradients (internal::PartialBackward): this (and Step, until ZeroGrad)
  // returns FailedPrecondition on that rank and an error naming it on the
  // others, so no rank steps. The gradients stay partial until ZeroGrad, on
  // every rank, skips the batch: a synced backward after one that stopped
  // under no_sync, or after this error without ZeroGrad, is refused too. One
  // that threw after the root's backward ended (a reduction copy out of
  // memory) wrote every gradient: this issues what it did not and the step
  // goes on.
  absl::Status FinishBackward() { return Finish().status; }
  // FinishBackward, then one optimizer step on this rank's slices
  // (ParamRefs(), one bucket at a time, each bucket's all-gather started
  // right after its step). FailedPrecondition when no synced backward ran
  // since the last Step.
  absl::Status Step();
  // Writes this rank's master slices into the flat parameter (rounded to the
  // compute dtype) and all-gathers every bucket, so every Parameter::value
  // reflects the masters (what Step does after the update; also after a
  // checkpoint load wrote the master slices). Collective.
  absl::Status RefreshParameters();
  // Zeroes the whole flat gradient in place; or, with set_to_none (PyTorch's
  // zero_grad default), drops the parameters' gradients (undefined until the
  // next backward) and zeroes nothing: that backward writes each gradient
  // into the flat gradient instead of adding to zeros (frozen parameters' and
  // padding elements stay the zeros they always are). A backward whose
  // reductions are still in flight (one that threw) is finished first: a
  // backward that stopped partway on some rank is no error here (its
  // gradients are the ones dropped); its reduce-scatters failing is (OpError).
  void ZeroGrad(bool set_to_none = false);
  // Before forward passes without a backward (evaluation, generation): the
  // compute copies (mixed precision) are made once here and kept until
  // EndForwardOnly, where each root forward would cast them again. A backward
  // in between throws OpError.
  void BeginForwardOnly();
  // After forward passes without a backward (evaluation): points the values
  // of parameters that computed with compute copies (kept-fp32 classes
  // present) back at the fp32 views, as the root's PostBackward would.
  void EndForwardOnly();

  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Zero1* z) : z_(z), previous_(z->require_sync_) {
      z_->require_sync_ = false;
    }
    ~NoSyncGuard() { z_->require_sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Zero1* z_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(this); }

  optim::Optimizer& optimizer() { return *optimizer_; }
  // The wrapped model (its buffers, for checkpoints).
  nn::Module& model() { return model_; }
  nn::Module& module() { return model_; }
  // Psi: the parameters' elements; padded: the flat buffers' (each bucket
  // padded to a multiple of N); k = padded / N, this rank's elements.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return padded_numel() / pg_.size(); }
  // Decay ranges of the whole flat buffer.
  const optim::ElementRanges& decay_ranges() const { return decay_ranges_; }

  // ---- Buckets ----
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bucket b's segment of the flat buffers, [begin, begin + padded) (of the
  // flat gradient; its parameter buffer is that segment of the flat
  // parameter, element begin at its index 0): its
  // parameters at [begin, begin + numel), zero padding after; this rank's
  // slice is [shard_begin, shard_begin + shard_numel), shard_begin = begin +
  // rank * shard_numel.
  struct Segment {
    int64_t begin = 0, numel = 0, padded = 0, shard_begin = 0, shard_numel = 0;
  };
  Segment segment(int b) const;
  // Bucket b's parameters, named as model.NamedParameters() names them, in
  // registration (flat buffer) order.
  std::vector<std::pair<std::string, nn::Parameter*>> BucketParameters(int b) const;
  // Per BucketParameters(b): frozen (requires_grad false) when wrapped, which
  // decides what the optimizer steps (a flag flipped since is refused at the
  // next backward).
  std::vector<bool> BucketFrozen(int b) const;
  // This rank's fp32 master slice of bucket b (k_b; in fp32 a view of the
  // flat parameter), its fp32 gradient slice (a view of the flat gradient)
  // and the slice's decay ranges.
  const tensor::Tensor& master_shard(int b) const { return buckets_.at(b).master; }
  tensor::Tensor grad_shard(int b) const;
  const optim::ElementRanges& shard_decay_ranges(int b) const { return buckets_.at(b).shard_decay; }
  // What Step() hands the optimizer: per bucket, "zero1.bucket<b>" over
  // master_shard(b), grad_shard(b) and its decay ranges.
  std::vector<optim::ParamRef> ParamRefs() const;
  // Whether bucket b holds a parameter that trains (see above).
  bool bucket_trains(int b) const { return buckets_.at(b).trains; }
  // What happened during the last synced backward, in order.
  const std::vector<BackwardEvent>& last_backward_events() const { return events_; }
  // The most buckets' reduce_dtype copies that existed at once during the
  // last synced backward (0 when reducing in fp32).
  int last_peak_inflight_copies() const { return copies_ ? copies_->last_peak_inflight() : 0; }

  const precision::MixedPrecisionPolicy& mixed_precision() const {
    return options_.mixed_precision;
  }
  // Dtype of the flat parameter (what Parameter::value views): param_dtype
  // under a mixed policy whose kept-fp32 classes hold no parameter, else f32.
  tensor::Dtype flat_param_dtype() const { return flat_param_dtype_; }
  // True when gradients travel in reduce_dtype (not f32, more than one rank;
  // the buckets of parameters kept fp32 travel in fp32 still).
  bool reduces_in_low_precision() const { return reduce_low_; }

  // Gathers the fp32 parameters (the masters; collective in mixed precision:
  // every rank must call it) and returns, on rank 0, fp32 copies of all of them
  // named as model.NamedParameters() names them, in that order, then copies
  // of rank 0's buffers (BatchNorm's statistics), as nn::StateDict orders
  // them; other ranks get an empty list.
  std::vector<std::pair<std::string, tensor::Tensor>> FullStateDict();

 private:
  struct Bucket {
    std::vector<int> params;           // indices into params_, registration order
    Segment seg;                       // its segment of the flat buffers
    tensor::Tensor param;              // fp32 or param_dtype (seg.padded): Parameter::value views
    tensor::Tensor master;             // fp32 (k_b): this rank's master slice
    optim::ElementRanges shard_decay;   // decay ranges of this rank's slice
    optim::ElementRanges shard_frozen;  // frozen parameters' ranges of this rank's slice
    bool trains = true;  // some parameter trains; false: no reduce-scatter, step or all-gather
    bool kept_fp32 = false;  // parameters the policy keeps fp32: reduce-scattered in fp32
    WorkPtr work;        // its reduce-scatter this step
  };

  void OnPreForward(nn::Module& module);
  void OnRootPreBackward();
  void OnPostBackward(nn::Module& module);
  void IssueReadyBuckets();
  internal::AgreedReductions Finish();
  // This rank's slice of `b`'s flat parameter (param_dtype).
  tensor::Tensor OwnSlice(const Bucket& b) const;
  // Writes this rank's master slice of `b` into its buffer (rounded to the
  // compute dtype), unless own_slice_current (the optimizer step wrote it),
  // and starts the bucket's all-gather.
  WorkPtr GatherBucket(Bucket& b, bool own_slice_current);

  nn::Module& model_;
  ProcessGroup& pg_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  Zero1Options options_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;
  std::vector<bool> frozen_;  // per params_, at construction
  std::vector<int64_t> offsets_;  // per parameter: its offset in the flat buffers
  std::vector<tensor::Tensor> grad_views_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  tensor::Dtype flat_param_dtype_ = tensor::Dtype::kF32;
  tensor::Tensor flat_grad_;  // fp32 (padded): Parameter::grad views
  tensor::Tensor master_;     // fp32 (k): the master slices, when not views of Bucket::param
  std::vector<Bucket> buckets_;
  std::unique_ptr<internal::BucketReadiness> readiness_;
  bool reduce_low_ = false;                    // reduce-scatter in reduce_dtype
  std::unique_ptr<internal::LowPrecisionCopies> copies_;  // of the buckets in flight (reduce_low_)
  internal::ComputeCopies compute_{"zero1"};              // when kept-fp32 classes exist
  optim::ElementRanges decay_ranges_;
  bool require_sync_ = true;
  bool forward_only_ = false;  // between BeginForwardOnly and EndForwardOnly
  bool syncing_this_step_ = false;  // in a synced backward (until its root PostBackward)
  bool in_flight_ = false;          // reduce-scatters issued and not waited for
  bool reduced_ = false;            // a synced backward's gradients are ready for Step
  bool stepped_ = false;            // Step() ran, and ZeroGrad() has not since
  internal::PartialBackward partial_;  // a backward stopped partway since ZeroGrad
  absl::Status refused_;  // the last Finish's error, which Step repeats until ZeroGrad
  std::vector<BackwardEvent> events_;
  std::unique_ptr<internal::BackwardHooks> hooks_;
};

}  // namespace dist

#endif  // DIST_ZERO1_H_
