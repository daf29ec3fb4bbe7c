// dist::Zero1: ZeRO stage 1 -- data parallelism with the optimizer state
// sharded across the ranks (Rajbhandari et al., "ZeRO", stage P_os), in fp32
// or with bf16/f16 mixed precision.
//
//   auto opt = optim::AdamW::Create({...}).value();
//   dist::Zero1 zero(model, pg, std::move(opt));  // or (..., {.mixed_precision = Bf16()})
//   model.ForwardBackward(idx, targets);  // reduce-scatter issued at the end
//   zero.Step();                          // shard step, then all-gather params
//   zero.ZeroGrad();
//
// At construction every parameter and buffer is broadcast from rank 0. The
// parameters (registration order) are packed into one flat parameter buffer,
// right-padded to a multiple of N = pg.size() and split into N equal shards of
// k elements; rank r owns [r k, (r+1) k). Each Parameter::value becomes a view
// of the flat parameter and each Parameter::grad a view of a flat fp32
// gradient of the same layout, so backward accumulates in place and the
// all-gather is copy-free. The optimizer holds state for this rank's shard
// only (kOptimizerState: S k bytes, about S Psi / N; AdamW S = 8 bytes per
// element).
//
// Backward: at the root's PostBackward (hooks installed on every module, as
// DDP's, chaining to earlier hooks) the flat gradient is reduce-scattered
// (avg) asynchronously into this rank's shard of it. Step() waits for it, steps
// the optimizer over the fp32 master shard (one ParamRef, decay ranges from
// Parameter::weight_decay via optim::SliceRanges), writes the master shard
// into the flat parameter and all-gathers it, so every rank ends with the same
// full parameters. After a synced backward only this rank's shard of the flat
// gradient holds averaged values (the rest holds local gradients).
//
// fp32 (the default): the flat parameter is fp32 and this rank's shard of it
// is the master (master_shard() is a view of it: no copy).
//
// Mixed precision (Zero1Options::mixed_precision with param_dtype bf16/f16):
//   - No module of a class the policy keeps fp32 holds parameters (minGPT, T5
//     with the default policy): the flat parameter is in param_dtype and the
//     values are param_dtype views of it at all times (they are the compute
//     copies; Parameter::value is never fp32). The master is a separate fp32
//     shard of k elements (kParameters). Step() writes the master shard,
//     rounded to param_dtype, into the flat parameter and all-gathers it in
//     param_dtype (half the bytes of fp32). FullStateDict() gathers the fp32
//     masters.
//   - Otherwise (e.g. BatchNorm1d parameters): the flat parameter stays fp32
//     as above, and the root's PreForward points the values of parameters not
//     kept fp32 at param_dtype copies (nn::MixedPrecision::CastForCompute,
//     kParameters, freed at the root's PostBackward, which points them back at
//     the fp32 views).
//   Either way each parameter computes with the same values nn::MixedPrecision
//   gives it in one process. Layers accumulate fp32 gradients into the flat
//   gradient. With reduce_dtype != f32 and more than one rank the root's
//   PostBackward casts the flat gradient to a reduce_dtype copy
//   (kCommunication, N k, freed by FinishBackward), reduce-scatters it in that
//   dtype and FinishBackward casts this rank's chunk back into the fp32
//   gradient shard (grad_shard()). With one rank nothing is communicated or
//   rounded: a world-1 run equals nn::MixedPrecision in one process bit for
//   bit.
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
// Psi above is rounded up to a multiple of N (the padding).
//
// no_sync(): backward accumulates locally and communicates nothing; the next
// synced backward reduce-scatters the accumulated sum.
//
// The master shard is the source of truth: changing Parameter::value directly
// between steps is overwritten by the next Step() (in fp32, changes to this
// rank's shard of it are the master).
#ifndef DIST_ZERO1_H_
#define DIST_ZERO1_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/ddp.h"
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
};

class Zero1 {
 public:
  // Throws tensor::OpError if a parameter is not a materialized fp32 tensor
  // on the model's one device (CPU or GPU: the flat buffers, the master shard
  // and so the optimizer state live there), the optimizer is null, the
  // mixed-precision policy names a dtype that device lacks, or the initial
  // broadcast fails.
  Zero1(nn::Module& model, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> optimizer,
        Zero1Options options = {});
  // Waits for a reduce-scatter in flight; points values back at the fp32
  // views if compute copies are out (kept-fp32 classes); restores the
  // modules' hooks.
  ~Zero1();
  Zero1(const Zero1&) = delete;
  Zero1& operator=(const Zero1&) = delete;

  // Waits for this step's reduce-scatter (issuing it if the root's
  // PostBackward did not run). OK and nothing to do under no_sync.
  absl::Status FinishBackward();
  // FinishBackward, then one optimizer step on this rank's shard and the
  // all-gather of the parameters. FailedPrecondition when no synced backward
  // ran since the last Step.
  absl::Status Step();
  // Writes this rank's master shard into the flat parameter (rounded to the
  // compute dtype) and all-gathers it, so every Parameter::value reflects the
  // master shards (what Step does after the update; also after a checkpoint
  // load wrote master_shard()). Collective.
  absl::Status RefreshParameters();
  // Zeroes the whole flat gradient in place.
  void ZeroGrad();
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
  nn::Module& module() { return model_; }
  // Psi: the parameters' elements; padded to a multiple of N; k = padded / N.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return flat_param_.numel(); }
  int64_t shard_numel() const { return master_.numel(); }
  int64_t shard_begin() const { return shard_begin_; }
  // This rank's fp32 master shard (k; in fp32 a view of the flat parameter)
  // and its fp32 gradient shard (a view of the flat gradient).
  const tensor::Tensor& master_shard() const { return master_; }
  tensor::Tensor grad_shard() const { return flat_grad_.Narrow(0, shard_begin_, master_.numel()); }
  // Decay ranges of the whole flat buffer and of this rank's shard.
  const optim::ElementRanges& decay_ranges() const { return decay_ranges_; }
  optim::ElementRanges shard_decay_ranges() const;

  const precision::MixedPrecisionPolicy& mixed_precision() const {
    return options_.mixed_precision;
  }
  // Dtype of the flat parameter (what Parameter::value views): param_dtype
  // under a mixed policy whose kept-fp32 classes hold no parameter, else f32.
  tensor::Dtype flat_param_dtype() const { return flat_param_.dtype(); }
  // True when gradients travel in reduce_dtype (not f32, more than one rank).
  bool reduces_in_low_precision() const { return reduce_low_; }

  // Gathers the fp32 parameters (the masters; collective in mixed precision:
  // every rank must call it) and returns, on rank 0, fp32 copies of all of them
  // named as model.NamedParameters() names them, in that order; other ranks
  // get an empty list.
  std::vector<std::pair<std::string, tensor::Tensor>> FullStateDict();

 private:
  void OnRootPreBackward();
  void OnPostBackward(nn::Module& module);
  void IssueReduceScatter();

  nn::Module& model_;
  ProcessGroup& pg_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  Zero1Options options_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;
  std::vector<tensor::Tensor> grad_views_;
  int64_t numel_ = 0;
  int64_t shard_begin_ = 0;
  tensor::Tensor flat_param_;  // fp32 or param_dtype (N k): Parameter::value views
  tensor::Tensor flat_grad_;   // fp32 (N k): Parameter::grad views
  tensor::Tensor master_;      // fp32 (k): this rank's master shard (fp32: a view of flat_param_)
  tensor::Tensor low_grad_;    // reduce_dtype (N k) while a low-precision reduce-scatter runs
  bool reduce_low_ = false;    // reduce-scatter in reduce_dtype
  std::unique_ptr<nn::MixedPrecision> casts_;  // compute copies when kept-fp32 classes exist
  optim::ElementRanges decay_ranges_;
  bool require_sync_ = true;
  bool syncing_this_step_ = false;
  WorkPtr reduce_scatter_;
  bool reduced_ = false;  // a synced backward's gradients are ready for Step
  std::unique_ptr<internal::BackwardHooks> hooks_;
};

}  // namespace dist

#endif  // DIST_ZERO1_H_
