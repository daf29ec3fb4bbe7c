// dist::DistributedDataParallel: buckets, hooks, the overlapped all-reduce and
// the mixed-precision casts.
#include "dist/ddp.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nn/checkpoint.h"
#include "nn/fp32_modules.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"

namespace dist {

absl::Status BroadcastModuleState(nn::Module& module, ProcessGroup& pg, int root) {
  std::vector<WorkPtr> works;
  for (auto& [name, p] : module.NamedParameters()) {
    if (!p->value.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("broadcast_module_state: parameter ", name, " is not materialized"));
    }
    works.push_back(pg.Broadcast(p->value, root));
  }
  for (auto& [name, b] : module.NamedBuffers()) {
    if (b->defined()) works.push_back(pg.Broadcast(*b, root));
  }
  absl::Status status;
  for (auto& w : works) status.Update(w->Wait());
  return status;
}

tensor::Device ModelDevice(const char* op,
                           const std::vector<std::pair<std::string, nn::Parameter*>>& params) {
  tensor::Device device = tensor::Device::Cpu();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    OP_CHECK(p->held_by.empty(), op, "parameter ", name, " is held by ", p->held_by,
             " already: wrap a model once");
    OP_CHECK(p->value.defined(), op, "parameter ", name, " is not materialized");
    OP_CHECK(p->value.dtype() == tensor::Dtype::kF32 && p->value.is_contiguous(), op,
             "parameter ", name, " must be a contiguous fp32 tensor");
    if (i == 0) device = p->value.device();
    OP_CHECK(p->value.device() == device, op, "parameter ", name, " is on ",
             p->value.device().ToString(), " but ", params[0].first, " is on ", device.ToString(),
             ": the model must be on one device");
  }
  return device;
}

namespace internal {

void BroadcastBuffersForForward(const char* op, nn::Module& model, ProcessGroup& pg,
                                bool require_sync, bool forward_only) {
  if (!require_sync || forward_only || pg.size() == 1 || nn::IsRecomputing()) return;
  std::vector<WorkPtr> works;
  for (auto& [name, b] : model.NamedBuffers()) {
    if (b->defined()) works.push_back(pg.Broadcast(*b, /*root=*/0));
  }
  absl::Status status;
  for (auto& w : works) status.Update(w->Wait());
  tensor::ThrowIfError(status, op, "broadcasting the buffers (broadcast_buffers)");
}

void CheckNotWrapped(const char* op, nn::Module& root) {
  for (auto& [name, m] : root.NamedModules()) {
    OP_CHECK(dynamic_cast<const BackwardHooks*>(m->hooks()) == nullptr, op,
             name.empty() ? std::string("the model") : absl::StrCat("module '", name, "'"),
             " is wrapped already (DDP or ZeRO-1 hooks on it): wrap a model once");
  }
}

BackwardHooks::BackwardHooks(nn::Module& root, std::function<void()> root_pre_backward,
                             std::function<void(nn::Module&)> post_backward,
                             std::function<void(nn::Module&)> pre_forward)
    : root_(root),
      root_pre_backward_(std::move(root_pre_backward)),
      post_backward_(std::move(post_backward)),
      pre_forward_(std::move(pre_forward)) {
  for (auto& [name, m] : root.NamedModules()) {
    previous_[m] = m->hooks();
    m->set_hooks(this);
  }
}

BackwardHooks::~BackwardHooks() {
  for (auto& [m, prev] : previous_) {
    if (m->hooks() == this) m->set_hooks(prev);
  }
}

nn::ModuleHooks* BackwardHooks::Previous(nn::Module& module) const {
  auto it = previous_.find(&module);
  return it == previous_.end() ? nullptr : it->second;
}

void BackwardHooks::PreForward(nn::Module& module) {
  if (nn::ModuleHooks* prev = Previous(module)) prev->PreForward(module);
  if (pre_forward_) pre_forward_(module);
}

void BackwardHooks::PostForward(nn::Module& module) {
  if (nn::ModuleHooks* prev = Previous(module)) prev->PostForward(module);
}

void BackwardHooks::PreBackward(nn::Module& module) {
  if (nn::ModuleHooks* prev = Previous(module)) prev->PreBackward(module);
  if (&module == &root_ && root_pre_backward_) root_pre_backward_();
}

void BackwardHooks::PostBackward(nn::Module& module) {
  if (nn::ModuleHooks* prev = Previous(module)) prev->PostBackward(module);
  if (post_backward_) post_backward_(module);
}

}  // namespace internal

DistributedDataParallel::DistributedDataParallel(nn::Module& model, ProcessGroup& pg,
                                                 DdpOptions options)
    : model_(model),
      pg_(pg),
      options_(options),
      params_(model.NamedParameters()),
      frozen_(internal::FrozenFlags(params_)) {
  internal::CheckNotWrapped("ddp", model_);
  const precision::MixedPrecisionPolicy& mp = options_.mixed_precision;
  reduce_low_ = mp.reduce_dtype != tensor::Dtype::kF32 && pg_.size() > 1;
  // Buckets of their own for the parameters kept fp32 when the others are
  // reduced in low precision.
  const std::set<const nn::Parameter*> kept_fp32 =
      reduce_low_ ? nn::KeptFp32Parameters(model_, mp.fp32_module_classes)
                  : std::set<const nn::Parameter*>();
  const std::vector<std::vector<int>> groups = internal::ReverseOrderBuckets(
      "ddp", params_, options_.bucket_cap_mb, /*skip_frozen=*/true, kept_fp32);
  const tensor::Device device = ModelDevice("ddp", params_);
  {
    absl::Status s = options_.mixed_precision.Validate(device);
    OP_CHECK(s.ok(), "ddp", "mixed precision: ", s.ToString());
  }
  absl::Status status = BroadcastModuleState(model_, pg_, /*root=*/0);
  tensor::ThrowIfError(status, "ddp", "initial broadcast failed");

  const int n = static_cast<int>(params_.size());
  std::vector<int> bucket_of(n, -1);
  grad_views_.resize(n);
  none_at_zero_grad_.assign(n, true);
  tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
  for (auto& group : groups) {
    int64_t numel = 0;
    for (int i : group) numel += params_[i].second->numel();
    Bucket bucket;
    bucket.flat = tensor::Tensor::Zeros({numel}, tensor::Dtype::kF32, device);
    bucket.params = group;
    bucket.kept_fp32 = kept_fp32.count(params_[group.front()].second) > 0;
    int64_t offset = 0;
    for (int i : group) {
      nn::Parameter* p = params_[i].second;
      tensor::Tensor view = bucket.flat.Narrow(0, offset, p->numel()).View(p->shape);
      none_at_zero_grad_[i] = !p->grad.defined();
      if (p->grad.defined()) {  // one it has moves into the bucket; none stays none
        view.CopyFrom(p->grad);
        p->grad = view;
      }
      grad_views_[i] = view;
      bucket_of[i] = static_cast<int>(buckets_.size());
      offset += p->numel();
    }
    buckets_.push_back(std::move(bucket));
  }
  readiness_ =
      std::make_unique<internal::BucketReadiness>(model_, std::move(bucket_of), num_buckets());
  for (const auto& [name, p] : params_) writes_at_zero_grad_.push_back(p->grad_writes);
  OP_CHECK(options_.max_inflight_buckets >= 0, "ddp", "max_inflight_buckets must be >= 0, got ",
           options_.max_inflight_buckets);
  if (reduce_low_) {
    copies_ = std::make_unique<internal::LowPrecisionCopies>(
        options_.max_inflight_buckets, [this](int b, const tensor::Tensor& reduced) {
          buckets_[b].flat.CopyFrom(reduced);  // reduce_dtype -> fp32
        });
  }
  // The masters are the (broadcast) fp32 values.
  if (mp.IsMixed()) compute_.SetCasts(std::make_unique<nn::MixedPrecision>(model_, mp));
  hooks_ = std::make_unique<internal::BackwardHooks>(
      model_, [this] { OnRootPreBackward(); }, [this](nn::Module& m) { OnPostBackward(m); },
      [this](nn::Module& m) { OnPreForward(m); });
}

DistributedDataParallel::~DistributedDataParallel() {
  hooks_.reset();
  for (auto& b : buckets_) {
    if (b.work) b.work->Wait().IgnoreError();
  }
  compute_.RestoreMasters();
}

std::vector<std::string> DistributedDataParallel::BucketParameterNames(int i) const {
  std::vector<std::string> names;
  for (int p : buckets_.at(i).params) names.push_back(params_[p].first);
  return names;
}

void DistributedDataParallel::ZeroGrad(bool set_to_none) {
  // A backward whose root PostBackward never ran (an API user's, abandoned)
  // may still be all-reducing into the buckets: finish it before they are
  // zeroed or handed back to the next backward.
  // Its gradients, partial on some rank or not, are dropped here: that is no
  // error.
  if (syncing_this_step_ && !finished_) {
    const internal::AgreedReductions agreed = Finish();
    if (!agreed.only_partial) {
      tensor::ThrowIfError(agreed.status, "ddp", "ZeroGrad: the all-reduces in flight failed");
    }
  }
  partial_.Clear();
  compute_.RestoreMastersAfterBackward();
  for (size_t i = 0; i < params_.size(); ++i) {
    writes_at_zero_grad_[i] = params_[i].second->grad_writes;
  }
  if (set_to_none) {
    internal::DropGrads(params_);
  } else {
    // An undefined gradient stays so (PyTorch's zero_grad(set_to_none=False)).
    for (auto& b : buckets_) tensor::Zero(b.flat);
    internal::ZeroReplacedGrads(params_, grad_views_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    none_at_zero_grad_[i] = !params_[i].second->grad.defined();
  }
}

void DistributedDataParallel::BeginForwardOnly() {
  compute_.BeginForwardOnly();
  forward_only_ = true;
}

void DistributedDataParallel::EndForwardOnly() {
  readiness_->EndForward();
  compute_.EndForwardOnly();
  forward_only_ = false;
}

void DistributedDataParallel::OnPreForward(nn::Module& module) {
  readiness_->OnPreForward(module);
  if (&module != &model_) return;
  // Before the casts, which may fail on one rank alone.
  if (options_.broadcast_buffers) {
    internal::BroadcastBuffersForForward("ddp", model_, pg_, require_sync_, forward_only_);
  }
  compute_.OnRootPreForward();
}

void DistributedDataParallel::OnRootPreBackward() {
  compute_.OnRootPreBackward();
  readiness_->EndForward();
  // A step still in flight (a backward whose root PostBackward never ran).
  if (!finished_) Finish().status.IgnoreError();
  internal::CheckFrozenUnchanged("ddp", params_, frozen_);
  partial_.OnRootPreBackward();
  // Gradients dropped (ZeroGrad(set_to_none)) or replaced go back to the buckets.
  internal::PointGradsAtBuckets(params_, grad_views_);
  syncing_this_step_ = require_sync_;
  if (!syncing_this_step_) return;
  events_.clear();
  readiness_->StartBackward();
  for (auto& b : buckets_) b.work.reset();
  finished_ = false;
  agreed_ = {};
}

void DistributedDataParallel::IssueReadyBuckets() {
  // In bucket order, so every rank issues the same sequence.
  for (int i = readiness_->TakeNextReady(); i >= 0; i = readiness_->TakeNextReady()) {
    Bucket& b = buckets_[i];
    internal::ZeroUnwrittenGrads(params_, b.params);  // parameters the backward did not reach
    const bool cast = reduce_low_ && !b.kept_fp32;
    internal::IssueOrGiveBack(*readiness_, cast ? copies_.get() : nullptr, i, b.work, [&] {
      if (cast) {
        const tensor::Tensor low =
            copies_->Make(i, b.flat, options_.mixed_precision.reduce_dtype);
        b.work = pg_.AllReduce(low, ReduceOp::kAvg);
        copies_->Issued(i, b.work);
      } else {
        b.work = pg_.AllReduce(b.flat, ReduceOp::kAvg);
      }
    });
    events_.push_back({Event::Kind::kBucketIssued, i});
  }
  // Free the copies of the buckets already reduced (errors surface in Finish).
  if (reduce_low_) copies_->UnpackCompleted();
}

void DistributedDataParallel::OnPostBackward(nn::Module& module) {
  if (&module == &model_) {
    // Backward is over: the optimizer steps the fp32 masters; gradients it
    // did not reach are zeros (under no_sync too).
    partial_.OnRootPostBackward();
    compute_.RestoreMasters();
    internal::ZeroUnwrittenGrads(params_);
    if (!syncing_this_step_ || finished_) return;
    events_.push_back({Event::Kind::kRootPostBackward, -1});
    readiness_->EndBackward();
    const absl::Status status = Finish().status;
    tensor::ThrowIfError(status, "ddp", "the synced backward failed");
    return;
  }
  if (!syncing_this_step_ || finished_) return;
  readiness_->OnPostBackward(module);
  IssueReadyBuckets();
}

internal::AgreedReductions DistributedDataParallel::Finish() {
  if (finished_) return agreed_;
  readiness_->MarkAllFinal();
  IssueReadyBuckets();
  absl::Status status;
  for (auto& b : buckets_) {
    if (b.work) status.Update(b.work->Wait());
  }
  if (reduce_low_) status.Update(copies_->Finish());
  // Which parameters any rank's backwards of this step reached, in the same
  // exchange: one that none reached and that had no gradient when the step
  // began keeps none (its zeros dropped), so the optimizer skips it as in
  // one process, and as PyTorch's DDP leaves a globally unused parameter's
  // grad untouched: no weight decay or momentum step for an expert or branch
  // that no rank ran. One that had a gradient then (zeros after
  // ZeroGrad(set_to_none=false), one held when wrapped) keeps it, as there.
  std::vector<float> written(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    written[i] = params_[i].second->grad_writes > writes_at_zero_grad_[i] ? 1.0f : 0.0f;
  }
  agreed_ = readiness_->AgreeOnReductions(pg_, status, partial_.partial(), "ddp", "all-reduce",
                                          &written);
  if (agreed_.status.ok()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      nn::Parameter* p = params_[i].second;
      if (written[i] == 0.0f && none_at_zero_grad_[i] && p->requires_grad) p->DropGrad();
    }
  }
  events_.push_back({Event::Kind::kReductionsDone, -1});
  finished_ = true;
  return agreed_;
}

absl::Status DistributedDataParallel::FinishBackward() {
  if (!syncing_this_step_) return absl::OkStatus();
  return Finish().status;
}

}  // namespace dist
