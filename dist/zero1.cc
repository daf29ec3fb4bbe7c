// dist::Zero1: flat buffers, reduce-scatter, sharded step, all-gather.
#include "dist/zero1.h"

#include <cstring>
#include <utility>

#include "tensor/error.h"
#include "tensor/memory_ledger.h"

namespace dist {

Zero1::Zero1(nn::Module& model, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> optimizer)
    : model_(model), pg_(pg), optimizer_(std::move(optimizer)), params_(model.NamedParameters()) {
  OP_CHECK(optimizer_ != nullptr, "zero1", "the optimizer is null");
  for (auto& [name, p] : params_) {
    OP_CHECK(p->value.defined(), "zero1", "parameter ", name, " is not materialized");
    OP_CHECK(p->value.dtype() == tensor::Dtype::kF32 && p->value.device().is_cpu() &&
                 p->value.is_contiguous(),
             "zero1", "parameter ", name, " must be a contiguous fp32 CPU tensor");
    numel_ += p->numel();
  }
  absl::Status status = BroadcastModuleState(model_, pg_, /*root=*/0);
  OP_CHECK(status.ok(), "zero1", "initial broadcast failed: ", status.ToString());

  const int64_t n = pg_.size();
  const int64_t padded = (numel_ + n - 1) / n * n;
  const int64_t k = padded / n;
  shard_begin_ = pg_.rank() * k;
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    flat_param_ = tensor::Tensor::Zeros({padded}, tensor::Dtype::kF32);
  }
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
    flat_grad_ = tensor::Tensor::Zeros({padded}, tensor::Dtype::kF32);
  }
  grad_views_.resize(params_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i].second;
    const int64_t m = p->numel();
    tensor::Tensor value = flat_param_.Narrow(0, offset, m).View(p->shape);
    value.CopyFrom(p->value);
    p->value = value;
    tensor::Tensor grad = flat_grad_.Narrow(0, offset, m).View(p->shape);
    if (p->grad.defined()) grad.CopyFrom(p->grad);
    p->grad = grad;
    grad_views_[i] = grad;
    if (p->weight_decay && m > 0) decay_ranges_.emplace_back(offset, offset + m);
    offset += m;
  }
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    master_ = flat_param_.Narrow(0, shard_begin_, k).Clone();
  }
  hooks_ = std::make_unique<internal::BackwardHooks>(
      model_, [this] { OnRootPreBackward(); }, [this](nn::Module& m) { OnPostBackward(m); });
}

Zero1::~Zero1() {
  hooks_.reset();
  if (reduce_scatter_) reduce_scatter_->Wait().IgnoreError();
}

optim::ElementRanges Zero1::shard_decay_ranges() const {
  return optim::SliceRanges(decay_ranges_, shard_begin_, shard_begin_ + master_.numel());
}

void Zero1::ZeroGrad() { std::memset(flat_grad_.raw_data(), 0, flat_grad_.nbytes()); }

void Zero1::OnRootPreBackward() {
  if (reduce_scatter_) FinishBackward().IgnoreError();
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i].second;
    tensor::Tensor& view = grad_views_[i];
    if (!p->grad.defined()) {
      std::memset(view.raw_data(), 0, view.nbytes());
      p->grad = view;
    } else if (p->grad.raw_data() != view.raw_data()) {
      view.CopyFrom(p->grad);
      p->grad = view;
    }
  }
  syncing_this_step_ = require_sync_;
}

void Zero1::IssueReduceScatter() {
  reduce_scatter_ =
      pg_.ReduceScatter(flat_grad_, flat_grad_.Narrow(0, shard_begin_, master_.numel()),
                        ReduceOp::kAvg);
  syncing_this_step_ = false;
}

void Zero1::OnPostBackward(nn::Module& module) {
  if (&module != &model_ || !syncing_this_step_) return;
  IssueReduceScatter();
}

absl::Status Zero1::FinishBackward() {
  if (syncing_this_step_) IssueReduceScatter();
  if (!reduce_scatter_) return absl::OkStatus();
  absl::Status status = reduce_scatter_->Wait();
  reduce_scatter_.reset();
  if (status.ok()) reduced_ = true;
  return status;
}

absl::Status Zero1::Step() {
  absl::Status status = FinishBackward();
  if (!status.ok()) return status;
  if (!reduced_) {
    return absl::FailedPreconditionError(
        "zero1: Step() without a synced backward since the last step");
  }
  reduced_ = false;
  optim::ParamRef ref;
  ref.name = "zero1.shard";
  ref.param = master_;
  ref.grad = grad_shard();
  ref.decay_ranges = shard_decay_ranges();
  optimizer_->Step({ref});
  tensor::Tensor mine = flat_param_.Narrow(0, shard_begin_, master_.numel());
  mine.CopyFrom(master_);
  return pg_.AllGatherSync(mine, flat_param_);
}

}  // namespace dist
