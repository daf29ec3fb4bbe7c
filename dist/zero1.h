// dist::Zero1: ZeRO stage 1 — data parallelism with the optimizer state
// sharded across the ranks (Rajbhandari et al., "ZeRO", stage P_os).
//
//   auto opt = optim::AdamW::Create({...}).value();
//   dist::Zero1 zero(model, pg, std::move(opt));
//   model.ForwardBackward(idx, targets);  // reduce-scatter issued at the end
//   zero.Step();                          // shard step, then all-gather params
//   zero.ZeroGrad();
//
// At construction every parameter and buffer is broadcast from rank 0. The
// parameters (registration order) are packed into one flat fp32 buffer,
// right-padded to a multiple of N = pg.size() and split into N equal shards of
// k elements; rank r owns [r k, (r+1) k). Each Parameter::value becomes a view
// of the flat parameter and each Parameter::grad a view of a flat gradient of
// the same layout, so backward accumulates in place and the all-gather is
// copy-free. Each rank keeps an fp32 master copy of its shard only
// (kParameters), and its optimizer holds state for that shard only
// (kOptimizerState: K * k * 4 bytes, about K * Psi * 4 / N).
//
// Backward: at the root's PostBackward (hooks installed on every module, as
// DDP's, chaining to earlier hooks) the flat gradient is reduce-scattered
// (avg) asynchronously into this rank's shard of it. Step() waits for it, steps
// the optimizer over the master shard (one ParamRef, decay ranges from
// Parameter::weight_decay via optim::SliceRanges), copies the master shard
// into the flat parameter and all-gathers it, so every rank ends with the same
// full parameters. After a synced backward only this rank's shard of the flat
// gradient holds averaged values (the rest holds local gradients).
//
// no_sync(): backward accumulates locally and communicates nothing; the next
// synced backward reduce-scatters the accumulated sum.
//
// The master shard is the source of truth: changing Parameter::value directly
// between steps is overwritten by the next Step().
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
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/param_ref.h"
#include "tensor/tensor.h"

namespace dist {

class Zero1 {
 public:
  // Throws tensor::OpError if a parameter is not a materialized fp32 CPU
  // tensor, the optimizer is null, or the initial broadcast fails.
  Zero1(nn::Module& model, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> optimizer);
  // Waits for a reduce-scatter in flight; restores the modules' hooks.
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
  // Zeroes the whole flat gradient in place.
  void ZeroGrad();

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
  // This rank's fp32 master shard (k) and its gradient shard (a view of the
  // flat gradient).
  const tensor::Tensor& master_shard() const { return master_; }
  tensor::Tensor grad_shard() const { return flat_grad_.Narrow(0, shard_begin_, master_.numel()); }
  // Decay ranges of the whole flat buffer and of this rank's shard.
  const optim::ElementRanges& decay_ranges() const { return decay_ranges_; }
  optim::ElementRanges shard_decay_ranges() const;

 private:
  void OnRootPreBackward();
  void OnPostBackward(nn::Module& module);
  void IssueReduceScatter();

  nn::Module& model_;
  ProcessGroup& pg_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<std::pair<std::string, nn::Parameter*>> params_;
  std::vector<tensor::Tensor> grad_views_;
  int64_t numel_ = 0;
  int64_t shard_begin_ = 0;
  tensor::Tensor flat_param_;  // fp32 (N k): Parameter::value views
  tensor::Tensor flat_grad_;   // fp32 (N k): Parameter::grad views
  tensor::Tensor master_;      // fp32 (k): this rank's master shard
  optim::ElementRanges decay_ranges_;
  bool require_sync_ = true;
  bool syncing_this_step_ = false;
  WorkPtr reduce_scatter_;
  bool reduced_ = false;  // a synced backward's gradients are ready for Step
  std::unique_ptr<internal::BackwardHooks> hooks_;
};

}  // namespace dist

#endif  // DIST_ZERO1_H_
