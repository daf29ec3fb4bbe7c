// Gradient buckets and their readiness during backward, shared by DDP (whose
// buckets all-reduce) and ZeRO-1 (whose buckets reduce-scatter): parameters
// grouped in the order backward finalizes their gradients, and the rule for
// when a bucket's gradients are final, so its collective can go out while the
// rest of backward still runs.
#ifndef DIST_GRAD_BUCKETS_H_
#define DIST_GRAD_BUCKETS_H_

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/process_group.h"
#include "dist/work.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace dist {

// What happened during the last synced backward, in order (DDP and ZeRO-1
// record it for tests and logs).
struct BackwardEvent {
  enum class Kind {
    kBucketIssued,      // bucket `bucket`'s collective went out
    kRootPostBackward,  // the root module's backward ended
    kReductionsDone,    // every bucket's collective was waited for
  };
  Kind kind;
  int bucket = -1;  // kBucketIssued
};

namespace internal {

// `params` (a module's NamedParameters()) grouped into buckets in reverse
// registration order, the order backward finalizes them: bucket 0 starts with
// the last parameter. A bucket holds at most cap_mb MiB of fp32 gradients,
// except that a larger parameter gets a bucket of its own. Each bucket lists
// indices into `params`, in reverse registration order. `skip_frozen`: frozen
// parameters (requires_grad false) are in no bucket (DDP: nothing to reduce);
// otherwise they are bucketed as the others (ZeRO-1, whose buckets also hold
// the parameters). A bucket never mixes parameters in `kept_fp32` (those the
// mixed-precision policy keeps fp32, whose buckets reduce in fp32) with
// others. Throws tensor::OpError (naming `op`) unless cap_mb > 0.
std::vector<std::vector<int>> ReverseOrderBuckets(
    const char* op, const std::vector<std::pair<std::string, nn::Parameter*>>& params,
    double cap_mb, bool skip_frozen = false,
    const std::set<const nn::Parameter*>& kept_fp32 = {});

// Before a backward: params[i]'s gradient becomes grad_views[i] (its view of
// its bucket; frozen parameters are skipped, and keep no gradient) again where
// it was dropped (ZeroGrad(set_to_none): the view, not zeroed, is marked
// Parameter::grad_unwritten, so the backward writes it instead of adding to
// zeros) or replaced by another tensor (its values are copied in), so that
// backward puts the gradients into the buckets.
void PointGradsAtBuckets(const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                         std::vector<tensor::Tensor>& grad_views);

// Zeroes the gradients of params[i], i in `indices` (or every one), still
// marked unwritten (no backward reached them) and clears their marks: before
// a bucket's collective, and when a backward ends.
// ZeroGrad(set_to_none=false), once the buckets are zeroed: no gradient is
// unwritten, and one the user replaced by another tensor is zeroed in place
// (PyTorch's zero_grad) and pointed back at its bucket, so the next backward
// does not copy its old values in (dropped ones stay undefined).
void ZeroReplacedGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                       std::vector<tensor::Tensor>& grad_views);
void ZeroUnwrittenGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                        const std::vector<int>& indices);
void ZeroUnwrittenGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params);

// Drops every trainable parameter's gradient (a view of its bucket), leaving
// the buckets as they are: the next backward's PointGradsAtBuckets marks the
// views unwritten (DDP's and ZeRO-1's ZeroGrad(set_to_none=true)).
void DropGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params);

// Which of `params` are frozen (requires_grad false), as a wrapper sees them
// when it is built.
std::vector<bool> FrozenFlags(const std::vector<std::pair<std::string, nn::Parameter*>>& params);
// Throws tensor::OpError naming `op` and the first parameter whose
// requires_grad differs from `frozen` (what the wrapper was built with): its
// buckets and views follow the flags at construction, so a parameter frozen
// or unfrozen later would train wrongly without a word.
void CheckFrozenUnchanged(const char* op,
                          const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                          const std::vector<bool>& frozen);

// For each module of `root`'s tree, the indices (into root.NamedParameters())
// of the parameters in its subtree.
std::unordered_map<nn::Module*, std::vector<int>> SubtreeParameterIndices(nn::Module& root);

// Whether a rank's gradients hold the writes of a backward that stopped
// partway -- it threw before the root's backward ended (an error or an out
// of memory in some layer), so some gradients are missing or half
// accumulated -- since they were last zeroed. DDP and ZeRO-1 still issue
// such a backward's remaining collectives (the ranks stay in step), but the
// average is not one of the batch's gradients, so no rank may step on it
// (AgreeOnReductions). A backward that threw after its root's backward ended
// (a reduction copy out of memory at the root's PostBackward) wrote every
// gradient: it is not partial.
class PartialBackward {
 public:
  // The root's PreBackward, after any backward still in flight was finished:
  // a backward still open stopped partway, and its writes stay in the
  // gradients this one adds to.
  void OnRootPreBackward() {
    partial_ = partial_ || open_;
    open_ = true;
  }
  // The root's PostBackward: this backward wrote every gradient it would.
  void OnRootPostBackward() { open_ = false; }
  // Outside a backward (FinishBackward, ZeroGrad, Step, the next root
  // PreBackward): the gradients hold a partial backward's writes.
  bool partial() const { return partial_ || open_; }
  // ZeroGrad zeroed or dropped the gradients.
  void Clear() { partial_ = open_ = false; }

 private:
  bool open_ = false;     // a root PreBackward without its PostBackward yet
  bool partial_ = false;  // an earlier backward stopped partway
};

// The result of BucketReadiness::AgreeOnReductions.
struct AgreedReductions {
  // OK; this rank's own error; an error naming the ranks that failed; or
  // the exchange's own error (the group is broken).
  absl::Status status;
  // Every failure any rank reported was a partial backward (its collectives
  // completed, no gradient was written late): ZeroGrad, which drops the
  // gradients, skips the batch on every rank without an error.
  bool only_partial = false;
};

// Which buckets' gradients are final during a synced backward. A
// parameter's gradient is final once both hold:
//  - the modules of its subtree ran as many backwards as forwards (a module
//    run twice, like T5's shared embedding, is done only after its second
//    backward). Forwards count from the root's PreForward to EndForward;
//    forwards recomputed during backward (activation checkpointing) do not;
//  - the backward wrote it (Parameter::grad_writes) as often as the synced
//    backwards before did (the most any made), so a use by another module
//    (T5's tied head, a weight a parent module reads itself) is waited for.
// The first synced backward knows no write counts yet: no bucket is final
// before its end (EndBackward), which records them (PyTorch DDP's first
// iteration, too, learns the order gradients become ready). A later backward
// that writes a gradient after its bucket was taken (a parameter used more
// often than in the first) is reported by CheckNoLateWrites. Buckets are
// taken strictly in bucket order, so every rank issues the same sequence of
// collectives.
class BucketReadiness {
 public:
  // bucket_of: per parameter of root.NamedParameters(), its bucket in
  // [0, num_buckets), or -1 for a parameter in no bucket (a frozen one under
  // DDP), which no bucket waits for.
  BucketReadiness(nn::Module& root, std::vector<int> bucket_of, int num_buckets);

  // From a module hook's PreForward: the root's starts a new count.
  void OnPreForward(nn::Module& module);
  // The forward phase is over (the root's PreBackward, or the end of a
  // forward-only pass).
  void EndForward();
  // A synced backward starts: no parameter is final, no bucket taken.
  void StartBackward();
  // From a module hook's PostBackward during a synced backward.
  void OnPostBackward(nn::Module& module);
  // The root's backward ended: every parameter is final, and each one's
  // writes this backward become the count later backwards wait for (the
  // largest seen).
  void EndBackward();
  // Every parameter is final (the step is being finished early; nothing is
  // learned from a partial backward: a loop whose synced backwards never
  // reach the root's PostBackward never overlaps its collectives).
  void MarkAllFinal();
  // The next bucket, in bucket order, whose parameters are all final, now
  // taken; -1 when the next one is not ready (or all were taken).
  int TakeNextReady();
  // Bucket `bucket`, the last one taken, was not issued (making its copy or
  // issuing its collective threw): it is the next one ready again, so the
  // FinishBackward or ZeroGrad that ends this backward issues it and this
  // rank's collectives stay in step with the other ranks'.
  void GiveBack(int bucket);
  // Buckets taken this backward: [0, num_taken()).
  int num_taken() const { return next_; }
  // FailedPrecondition (starting "[op] ") naming the first parameter whose
  // gradient was written after its bucket was taken this backward: the
  // `collective` read it while it changed, so every rank's copy is wrong.
  absl::Status CheckNoLateWrites(const char* op, const char* collective) const;
  // The step's reductions agreed over the ranks: `collectives` (this rank's
  // result of waiting for them), then `partial` (this rank's gradients hold
  // a backward that stopped partway: PartialBackward), then
  // CheckNoLateWrites, exchanged in an all-reduce of one flag per rank (none
  // at world size 1). A failure on some ranks only (a late write from a
  // rank-dependent forward, a result this rank alone could not copy back, a
  // backward that threw partway on one rank) fails every rank, this one with
  // its own error and the others naming the ranks, instead of some stepping
  // on a wrong average or waiting in their next collective. Collective: every
  // rank calls it once per synced backward, whatever its own result.
  // `written` (optional): one flag per parameter, this rank's (1: its
  // gradient was written this step), replaced by the maximum over the ranks
  // in the same all-reduce (left as it is at world size 1, or when the
  // exchange fails).
  AgreedReductions AgreeOnReductions(ProcessGroup& pg, const absl::Status& collectives,
                                     bool partial, const char* op, const char* collective,
                                     std::vector<float>* written = nullptr) const;

 private:
  void MarkFinal(int param);
  // Marks final the parameters whose modules are done and whose writes
  // reached the learned count.
  void MarkWrittenFinal();
  int64_t Writes(int param) const;  // this backward's

  nn::Module& root_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;
  std::vector<int> bucket_of_;
  std::vector<std::vector<int>> bucket_params_;
  std::vector<int> bucket_size_;  // parameters per bucket
  std::vector<int> pending_;      // per bucket: parameters not final yet
  // Per parameter, this backward: final; its modules done; grad_writes at
  // StartBackward; writes when its bucket was taken (-1: not taken).
  std::vector<bool> final_;
  std::vector<bool> modules_done_;
  std::vector<int64_t> writes_at_start_;
  std::vector<int64_t> writes_when_taken_;
  // Per parameter: the writes a backward makes (the largest an ended synced
  // backward made); known once one ended.
  std::vector<int64_t> expected_writes_;
  bool learned_ = false;
  int next_ = 0;
  std::unordered_map<nn::Module*, std::vector<int>> subtree_;
  // Per module this step: {forward calls, backward calls}.
  std::unordered_map<nn::Module*, std::pair<int, int>> calls_;
  bool forward_phase_ = false;
};

// The reduce_dtype copies of the buckets whose low-precision collective is in
// flight (DDP's all-reduces, ZeRO-1's reduce-scatters): a bucket's copy is
// made when it is issued and, once its collective completed, handed to
// `unpack` (which casts the result back into the fp32 gradient) and freed.
// At most `max_inflight` copies exist at once (0: no bound): making another
// first waits for the oldest and unpacks it, so the memory the copies take is
// bounded by the largest max_inflight buckets, whatever the speed of the
// collectives (DeepSpeed's overlap_comm double-buffers its buckets: 2).
class LowPrecisionCopies {
 public:
  using Unpack = std::function<void(int bucket, const tensor::Tensor& reduced)>;
  LowPrecisionCopies(int max_inflight, Unpack unpack)
      : max_inflight_(max_inflight), unpack_(std::move(unpack)) {}

  // Bucket b's copy of `src` in `dtype` (kCommunication), to issue its
  // collective on; waits for the oldest copies while max_inflight are out
  // (their errors are kept for Finish).
  tensor::Tensor Make(int bucket, const tensor::Tensor& src, tensor::Dtype dtype);
  // The collective issued on bucket b's copy.
  void Issued(int bucket, WorkPtr work);
  // Bucket b's copy, made last, whose collective was never issued (issuing it
  // threw): freed, so that nothing unpacks its unreduced values; a no-op when
  // Make threw before the copy existed.
  void Abandon(int bucket);
  // Unpacks and frees the copies whose collective completed, oldest first.
  void UnpackCompleted();
  // Waits for every copy out, unpacks those that succeeded, frees all;
  // returns the first error (including those of earlier waits).
  absl::Status Finish();
  int inflight() const { return static_cast<int>(out_.size()); }
  // The most copies out at once before the last Finish.
  int last_peak_inflight() const { return last_peak_; }

 private:
  struct Out {
    int bucket;
    tensor::Tensor copy;
    WorkPtr work;  // null until Issued
  };
  void WaitOldest();

  int max_inflight_;
  Unpack unpack_;
  std::deque<Out> out_;  // in issue order
  absl::Status status_;
  int peak_ = 0, last_peak_ = 0;
};

// Runs issue(), which makes bucket `bucket`'s copy (when `copies` is set)
// and starts its collective into `work`. When it throws before the collective
// went out (out of memory for the copy), the copy is abandoned and the bucket
// given back, so that the FinishBackward or ZeroGrad ending this backward
// issues it and the ranks' collectives stay in step; the exception goes on.
void IssueOrGiveBack(BucketReadiness& readiness, LowPrecisionCopies* copies, int bucket,
                     const WorkPtr& work, const std::function<void()>& issue);

// The low-precision compute copies of a replicated model (DDP's, ZeRO-1's):
// the casts (SetCasts; none: nothing to cast) make param_dtype copies of the
// fp32 masters at each root forward, and the masters are the values again
// once the backward is over. A forward-only region (BeginForwardOnly ..
// EndForwardOnly: evaluation, generation) makes them once for all its
// forwards, and refuses a backward. `op` ("ddp", "zero1") names the wrapper
// in errors.
class ComputeCopies {
 public:
  explicit ComputeCopies(const char* op) : op_(op) {}
  void SetCasts(std::unique_ptr<nn::MixedPrecision> casts) { casts_ = std::move(casts); }

  // The root's PreForward: cast, unless the region's copies are current.
  void OnRootPreForward() {
    if (casts_ && !forward_only_) casts_->CastForCompute();
  }
  // The root's PreBackward: throws OpError inside a forward-only region.
  void OnRootPreBackward() const;
  void BeginForwardOnly() {
    if (casts_) casts_->CastForCompute();
    forward_only_ = true;
  }
  void EndForwardOnly() {
    forward_only_ = false;
    RestoreMasters();
  }
  // The values are the fp32 masters again (the backward is over, or the
  // wrapper goes away).
  void RestoreMasters() {
    if (casts_) casts_->RestoreMasters();
  }
  // ZeroGrad: the masters again after a backward that threw before its
  // root's PostBackward restored them (a no-op when it did); a forward-only
  // region keeps its copies.
  void RestoreMastersAfterBackward() {
    if (!forward_only_) RestoreMasters();
  }

 private:
  std::unique_ptr<nn::MixedPrecision> casts_;
  const char* op_;             // a string literal
  bool forward_only_ = false;  // between BeginForwardOnly and EndForwardOnly
};

}  // namespace internal
}  // namespace dist

#endif  // DIST_GRAD_BUCKETS_H_
