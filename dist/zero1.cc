// dist::Zero1: flat buffers, reduce-scatter, sharded step, all-gather, and
// the mixed-precision variants of each.
#include "dist/zero1.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"

namespace dist {
namespace {

// True if a module of a class the policy keeps fp32 owns parameters.
bool HasKeptFp32Parameters(nn::Module& root, const precision::MixedPrecisionPolicy& mp) {
  for (auto& [prefix, module] : root.NamedModules()) {
    if (mp.KeepsFp32(module->class_name()) && !module->LocalParameters().empty()) return true;
  }
  return false;
}

}  // namespace

Zero1::Zero1(nn::Module& model, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> optimizer,
             Zero1Options options)
    : model_(model),
      pg_(pg),
      optimizer_(std::move(optimizer)),
      options_(std::move(options)),
      params_(model.NamedParameters()) {
  OP_CHECK(optimizer_ != nullptr, "zero1", "the optimizer is null");
  const precision::MixedPrecisionPolicy& mp = options_.mixed_precision;
  const tensor::Device device = ModelDevice("zero1", params_);
  {
    absl::Status s = mp.Validate(device);
    OP_CHECK(s.ok(), "zero1", "mixed precision: ", s.ToString());
  }
  for (auto& [name, p] : params_) numel_ += p->numel();
  absl::Status status = BroadcastModuleState(model_, pg_, /*root=*/0);
  OP_CHECK(status.ok(), "zero1", "initial broadcast failed: ", status.ToString());

  const int64_t n = pg_.size();
  const int64_t padded = (numel_ + n - 1) / n * n;
  const int64_t k = padded / n;
  shard_begin_ = pg_.rank() * k;
  // A low-precision flat parameter when every parameter computes in param_dtype.
  const bool low_flat = mp.IsMixed() && !HasKeptFp32Parameters(model_, mp);
  reduce_low_ = mp.reduce_dtype != tensor::Dtype::kF32 && n > 1;
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    flat_param_ = tensor::Tensor::Zeros(
        {padded}, low_flat ? mp.param_dtype : tensor::Dtype::kF32, device);
    if (low_flat) master_ = tensor::Tensor::Zeros({k}, tensor::Dtype::kF32, device);
  }
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
    flat_grad_ = tensor::Tensor::Zeros({padded}, tensor::Dtype::kF32, device);
  }
  grad_views_.resize(params_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i].second;
    const int64_t m = p->numel();
    if (low_flat) {
      // This rank's part of the parameter, in fp32, into the master shard.
      const int64_t lo = std::max(offset, shard_begin_),
                    hi = std::min(offset + m, shard_begin_ + k);
      if (lo < hi) {
        master_.Narrow(0, lo - shard_begin_, hi - lo)
            .CopyFrom(p->value.Flatten().Narrow(0, lo - offset, hi - lo));
      }
    }
    tensor::Tensor value = flat_param_.Narrow(0, offset, m).View(p->shape);
    value.CopyFrom(p->value);  // rounded to param_dtype when low_flat
    p->value = value;
    tensor::Tensor grad = flat_grad_.Narrow(0, offset, m).View(p->shape);
    if (p->grad.defined()) grad.CopyFrom(p->grad);
    p->grad = grad;
    grad_views_[i] = grad;
    if (p->weight_decay && m > 0) decay_ranges_.emplace_back(offset, offset + m);
    offset += m;
  }
  if (!low_flat) master_ = flat_param_.Narrow(0, shard_begin_, k);  // the master, in place
  std::function<void(nn::Module&)> pre_forward;
  if (mp.IsMixed() && !low_flat) {
    // Kept-fp32 classes: fp32 views stay the values between steps; the others
    // compute with param_dtype copies from forward to backward.
    casts_ = std::make_unique<nn::MixedPrecision>(model_, mp);
    pre_forward = [this](nn::Module& m) {
      if (&m == &model_) casts_->CastForCompute();
    };
  }
  hooks_ = std::make_unique<internal::BackwardHooks>(
      model_, [this] { OnRootPreBackward(); }, [this](nn::Module& m) { OnPostBackward(m); },
      std::move(pre_forward));
}

Zero1::~Zero1() {
  hooks_.reset();
  if (reduce_scatter_) reduce_scatter_->Wait().IgnoreError();
  if (casts_) casts_->RestoreMasters();
}

optim::ElementRanges Zero1::shard_decay_ranges() const {
  return optim::SliceRanges(decay_ranges_, shard_begin_, shard_begin_ + master_.numel());
}

void Zero1::ZeroGrad() { tensor::Zero(flat_grad_); }

void Zero1::EndForwardOnly() {
  if (casts_) casts_->RestoreMasters();
}

void Zero1::OnRootPreBackward() {
  if (reduce_scatter_) FinishBackward().IgnoreError();
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i].second;
    tensor::Tensor& view = grad_views_[i];
    if (!p->grad.defined()) {
      tensor::Zero(view);
      p->grad = view;
    } else if (p->grad.raw_data() != view.raw_data()) {
      view.CopyFrom(p->grad);
      p->grad = view;
    }
  }
  syncing_this_step_ = require_sync_;
}

void Zero1::IssueReduceScatter() {
  if (reduce_low_) {
    {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
      low_grad_ = flat_grad_.To(options_.mixed_precision.reduce_dtype);
    }
    reduce_scatter_ = pg_.ReduceScatter(
        low_grad_, low_grad_.Narrow(0, shard_begin_, master_.numel()), ReduceOp::kAvg);
  } else {
    reduce_scatter_ = pg_.ReduceScatter(
        flat_grad_, flat_grad_.Narrow(0, shard_begin_, master_.numel()), ReduceOp::kAvg);
  }
  syncing_this_step_ = false;
}

void Zero1::OnPostBackward(nn::Module& module) {
  if (&module != &model_) return;
  if (casts_) casts_->RestoreMasters();  // backward is over
  if (syncing_this_step_) IssueReduceScatter();
}

absl::Status Zero1::FinishBackward() {
  if (syncing_this_step_) IssueReduceScatter();
  if (!reduce_scatter_) return absl::OkStatus();
  absl::Status status = reduce_scatter_->Wait();
  reduce_scatter_.reset();
  if (low_grad_.defined()) {
    // The reduced chunk lands in the fp32 gradient shard.
    if (status.ok()) grad_shard().CopyFrom(low_grad_.Narrow(0, shard_begin_, master_.numel()));
    low_grad_ = tensor::Tensor();
  }
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
  return RefreshParameters();
}

absl::Status Zero1::RefreshParameters() {
  tensor::Tensor mine = flat_param_.Narrow(0, shard_begin_, master_.numel());
  if (!mine.SharesStorageWith(master_)) mine.CopyFrom(master_);  // rounded to param_dtype
  return pg_.AllGatherSync(mine, flat_param_);
}

std::vector<std::pair<std::string, tensor::Tensor>> Zero1::FullStateDict() {
  tensor::Tensor full = flat_param_;
  if (!master_.SharesStorageWith(flat_param_)) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    full = tensor::Tensor::Empty({flat_param_.numel()}, tensor::Dtype::kF32, master_.device());
    absl::Status s = pg_.AllGatherSync(master_, full);
    OP_CHECK(s.ok(), "zero1", "full_state_dict all_gather: ", s.ToString());
  }
  std::vector<std::pair<std::string, tensor::Tensor>> out;
  if (pg_.rank() != 0) return out;
  int64_t offset = 0;
  for (auto& [name, p] : params_) {
    const tensor::Tensor view = full.Narrow(0, offset, p->numel()).View(p->shape);
    out.emplace_back(name, view.device().is_cpu() ? view.Clone() : view.To(tensor::Device::Cpu()));
    offset += p->numel();
  }
  return out;
}

}  // namespace dist
