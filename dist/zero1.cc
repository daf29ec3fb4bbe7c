// dist::Zero1: bucket segments of the flat buffers, reduce-scatters during
// backward, the sharded step, all-gathers, and the mixed-precision variants
// of each.
#include "dist/zero1.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nn/fp32_modules.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"

namespace dist {

Zero1::Zero1(nn::Module& model, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> optimizer,
             Zero1Options options)
    : model_(model),
      pg_(pg),
      optimizer_(std::move(optimizer)),
      options_(std::move(options)),
      params_(model.NamedParameters()),
      frozen_(internal::FrozenFlags(params_)) {
  OP_CHECK(optimizer_ != nullptr, "zero1", "the optimizer is null");
  internal::CheckNotWrapped("zero1", model_);
  const precision::MixedPrecisionPolicy& mp = options_.mixed_precision;
  reduce_low_ = mp.reduce_dtype != tensor::Dtype::kF32 && pg_.size() > 1;
  // Buckets of their own for the parameters kept fp32 when the others are
  // reduced in low precision; a low-precision flat parameter only when no
  // parameter is kept.
  const std::set<const nn::Parameter*> all_kept =
      nn::KeptFp32Parameters(model_, mp.fp32_module_classes);
  const std::set<const nn::Parameter*> kept_fp32 =
      reduce_low_ ? all_kept : std::set<const nn::Parameter*>();
  const std::vector<std::vector<int>> groups = internal::ReverseOrderBuckets(
      "zero1", params_, options_.bucket_cap_mb, /*skip_frozen=*/false, kept_fp32);
  const tensor::Device device = ModelDevice("zero1", params_);
  {
    absl::Status s = mp.Validate(device);
    OP_CHECK(s.ok(), "zero1", "mixed precision: ", s.ToString());
  }
  absl::Status status = BroadcastModuleState(model_, pg_, /*root=*/0);
  tensor::ThrowIfError(status, "zero1", "initial broadcast failed");

  // Segments: buckets laid out so that the parameters are in registration
  // order (the last bucket first), each padded to a multiple of N.
  const int64_t n = pg_.size();
  const int num_buckets = static_cast<int>(groups.size());
  std::vector<int> bucket_of(params_.size(), -1);
  offsets_.assign(params_.size(), 0);
  buckets_.resize(num_buckets);
  int64_t padded_total = 0;
  for (int b = num_buckets - 1; b >= 0; --b) {
    Bucket& bucket = buckets_[b];
    bucket.params.assign(groups[b].rbegin(), groups[b].rend());
    bucket.kept_fp32 = kept_fp32.count(params_[bucket.params.front()].second) > 0;
    bucket.seg.begin = padded_total;
    for (int i : bucket.params) {
      offsets_[i] = bucket.seg.begin + bucket.seg.numel;
      bucket.seg.numel += params_[i].second->numel();
      bucket_of[i] = b;
    }
    bucket.seg.shard_numel = (bucket.seg.numel + n - 1) / n;
    bucket.seg.padded = bucket.seg.shard_numel * n;
    bucket.seg.shard_begin = bucket.seg.begin + pg_.rank() * bucket.seg.shard_numel;
    padded_total += bucket.seg.padded;
    numel_ += bucket.seg.numel;
  }
  const int64_t k = padded_total / n;

  // A low-precision flat parameter when every parameter computes in param_dtype.
  const bool low_flat = mp.IsMixed() && all_kept.empty();
  OP_CHECK(options_.max_inflight_buckets >= 0, "zero1", "max_inflight_buckets must be >= 0, got ",
           options_.max_inflight_buckets);
  if (reduce_low_) {
    copies_ = std::make_unique<internal::LowPrecisionCopies>(
        options_.max_inflight_buckets, [this](int b, const tensor::Tensor& reduced) {
          // This rank's slice of the result lands in the fp32 gradient slice.
          const Segment& seg = buckets_[b].seg;
          grad_shard(b).CopyFrom(reduced.Narrow(0, seg.shard_begin - seg.begin, seg.shard_numel));
        });
  }
  padded_numel_ = padded_total;
  flat_param_dtype_ = low_flat ? mp.param_dtype : tensor::Dtype::kF32;
  if (low_flat) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
    master_ = tensor::Tensor::Zeros({k}, tensor::Dtype::kF32, device);
  }
  // The parameters move into their bucket's buffer one bucket at a time: each
  // original tensor is freed as its value becomes a view, so the model's
  // tensors and the buffers coexist for one bucket only (the set-up peak is
  // Psi + one bucket, not 2 Psi; DeepSpeed moves the model to the host first
  // for the same reason). Each bucket's master slice is a view of its buffer
  // (fp32) or the next k_b elements of master_ (in bucket order).
  int64_t master_offset = 0;
  for (Bucket& bucket : buckets_) {
    const Segment& seg = bucket.seg;
    {
      tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kParameters);
      bucket.param = tensor::Tensor::Zeros({seg.padded}, flat_param_dtype_, device);
    }
    const int64_t mine = seg.shard_begin - seg.begin;  // this rank's slice in the bucket
    bucket.master = low_flat ? master_.Narrow(0, master_offset, seg.shard_numel)
                             : bucket.param.Narrow(0, mine, seg.shard_numel);
    master_offset += seg.shard_numel;
    for (int i : bucket.params) {
      nn::Parameter* p = params_[i].second;
      const int64_t m = p->numel(), local = offsets_[i] - seg.begin;
      if (low_flat) {
        // This rank's part of the parameter, in fp32, into the master slice.
        const int64_t lo = std::max(local, mine), hi = std::min(local + m, mine + seg.shard_numel);
        if (lo < hi) {
          bucket.master.Narrow(0, lo - mine, hi - lo)
              .CopyFrom(p->value.Flatten().Narrow(0, lo - local, hi - lo));
        }
      }
      tensor::Tensor value = bucket.param.Narrow(0, local, m).View(p->shape);
      value.CopyFrom(p->value);  // rounded to param_dtype when low_flat
      p->value = value;          // frees the original
    }
  }
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kGradients);
    flat_grad_ = tensor::Tensor::Zeros({padded_total}, tensor::Dtype::kF32, device);
  }
  grad_views_.resize(params_.size());
  optim::ElementRanges frozen_ranges;  // sorted: offsets grow with i
  for (size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i].second;
    const int64_t m = p->numel(), offset = offsets_[i];
    tensor::Tensor grad = flat_grad_.Narrow(0, offset, m).View(p->shape);
    grad_views_[i] = grad;
    if (p->weight_decay && m > 0) decay_ranges_.emplace_back(offset, offset + m);
    if (!p->requires_grad) {  // frozen: no gradient; its slice stays zero
      if (m > 0) frozen_ranges.emplace_back(offset, offset + m);
      p->grad = tensor::Tensor();
      continue;
    }
    if (p->grad.defined()) grad.CopyFrom(p->grad);
    p->grad = grad;
  }
  for (Bucket& bucket : buckets_) {
    const int64_t begin = bucket.seg.shard_begin, end = begin + bucket.seg.shard_numel;
    bucket.shard_decay = optim::SliceRanges(decay_ranges_, begin, end);
    bucket.shard_frozen = optim::SliceRanges(frozen_ranges, begin, end);
    bucket.trains = false;
    for (int i : bucket.params) bucket.trains |= !frozen_[i];
  }
  readiness_ =
      std::make_unique<internal::BucketReadiness>(model_, std::move(bucket_of), num_buckets);
  if (mp.IsMixed() && !low_flat) {
    // Kept-fp32 classes: fp32 views stay the values between steps; the others
    // compute with param_dtype copies from forward to backward.
    compute_.SetCasts(std::make_unique<nn::MixedPrecision>(model_, mp));
  }
  hooks_ = std::make_unique<internal::BackwardHooks>(
      model_, [this] { OnRootPreBackward(); }, [this](nn::Module& m) { OnPostBackward(m); },
      [this](nn::Module& m) { OnPreForward(m); });
  // Each rank's gradient is averaged in its own slices only: an optimizer of
  // the caller's stepping on the whole parameters would set the ranks apart.
  for (auto& [name, p] : params_) p->held_by = "ZeRO-1";
}

Zero1::~Zero1() {
  for (auto& [name, p] : params_) p->held_by.clear();
  hooks_.reset();
  for (Bucket& b : buckets_) {
    if (b.work) b.work->Wait().IgnoreError();
  }
  compute_.RestoreMasters();
}

Zero1::Segment Zero1::segment(int b) const { return buckets_.at(b).seg; }

std::vector<std::pair<std::string, nn::Parameter*>> Zero1::BucketParameters(int b) const {
  std::vector<std::pair<std::string, nn::Parameter*>> out;
  for (int i : buckets_.at(b).params) out.push_back(params_[i]);
  return out;
}

std::vector<bool> Zero1::BucketFrozen(int b) const {
  std::vector<bool> out;
  for (int i : buckets_.at(b).params) out.push_back(frozen_[i]);
  return out;
}

tensor::Tensor Zero1::grad_shard(int b) const {
  const Segment& seg = buckets_.at(b).seg;
  return flat_grad_.Narrow(0, seg.shard_begin, seg.shard_numel);
}

std::vector<optim::ParamRef> Zero1::ParamRefs() const {
  std::vector<optim::ParamRef> refs;
  for (int b = 0; b < num_buckets(); ++b) {
    optim::ParamRef ref;
    ref.name = absl::StrCat("zero1.bucket", b);
    ref.param = buckets_[b].master;
    ref.grad = grad_shard(b);
    ref.decay_ranges = buckets_[b].shard_decay;
    ref.frozen_ranges = buckets_[b].shard_frozen;
    refs.push_back(std::move(ref));
  }
  return refs;
}

void Zero1::ZeroGrad(bool set_to_none) {
  // A backward whose reductions Step never took may still be reduce-
  // scattering into the flat gradient: finish it before it is zeroed.
  // Its gradients, partial on some rank or not, are dropped here: that is no
  // error.
  if (syncing_this_step_ || in_flight_) {
    const internal::AgreedReductions agreed = Finish();
    if (!agreed.only_partial) {
      tensor::ThrowIfError(agreed.status, "zero1", "ZeroGrad: the reduce-scatters in flight failed");
    }
  }
  partial_.Clear();
  refused_ = absl::OkStatus();
  compute_.RestoreMastersAfterBackward();
  stepped_ = false;
  reduced_ = false;  // gradients a Step() did not take are dropped too
  if (set_to_none) {
    internal::DropGrads(params_);
    return;
  }
  tensor::Zero(flat_grad_);
  internal::ZeroReplacedGrads(params_, grad_views_);
}

void Zero1::BeginForwardOnly() {
  compute_.BeginForwardOnly();
  forward_only_ = true;
}

void Zero1::EndForwardOnly() {
  readiness_->EndForward();
  compute_.EndForwardOnly();
  forward_only_ = false;
}

void Zero1::OnPreForward(nn::Module& module) {
  readiness_->OnPreForward(module);
  if (&module != &model_) return;
  if (options_.broadcast_buffers) {  // before the casts, which may fail on one rank alone
    internal::BroadcastBuffersForForward("zero1", model_, pg_, require_sync_, forward_only_);
  }
  compute_.OnRootPreForward();
}

void Zero1::OnRootPreBackward() {
  compute_.OnRootPreBackward();
  readiness_->EndForward();
  // A step still in flight (a backward whose reductions Step never took).
  if (syncing_this_step_ || in_flight_) Finish().status.IgnoreError();
  // The reduce-scatters work in place: after a synced backward this rank's
  // slices hold averages and the rest of the flat gradient its own local
  // gradient, which no later backward can add to and reduce again.
  OP_CHECK(!reduced_, "zero1",
           "a backward after a synced backward whose gradients Step() has not taken: the "
           "reduce-scatters average the flat gradient in place, so a second one would average "
           "this rank's slices again; accumulate micro-batches under no_sync() with only the "
           "last one synced (as the train binaries do), or Step() in between");
  OP_CHECK(!stepped_, "zero1",
           "a backward after Step() without ZeroGrad(): the flat gradient still holds the last "
           "step's reduced slices and local gradients; call ZeroGrad() after Step()");
  internal::CheckFrozenUnchanged("zero1", params_, frozen_);
  partial_.OnRootPreBackward();
  // Gradients dropped (ZeroGrad(set_to_none)) or replaced go back to the buckets.
  internal::PointGradsAtBuckets(params_, grad_views_);
  syncing_this_step_ = require_sync_;
  if (!syncing_this_step_) return;
  events_.clear();
  readiness_->StartBackward();
}

void Zero1::IssueReadyBuckets() {
  // In bucket order, so every rank issues the same sequence.
  for (int i = readiness_->TakeNextReady(); i >= 0; i = readiness_->TakeNextReady()) {
    Bucket& b = buckets_[i];
    internal::ZeroUnwrittenGrads(params_, b.params);  // parameters the backward did not reach
    in_flight_ = true;        // this step's reductions (none for a frozen bucket)
    if (!b.trains) continue;  // frozen parameters only: nothing to reduce
    tensor::Tensor segment = flat_grad_.Narrow(0, b.seg.begin, b.seg.padded);
    const int64_t mine = b.seg.shard_begin - b.seg.begin;
    const bool cast = reduce_low_ && !b.kept_fp32;
    internal::IssueOrGiveBack(*readiness_, cast ? copies_.get() : nullptr, i, b.work, [&] {
      if (cast) {
        const tensor::Tensor low =
            copies_->Make(i, segment, options_.mixed_precision.reduce_dtype);
        b.work = pg_.ReduceScatter(low, low.Narrow(0, mine, b.seg.shard_numel), ReduceOp::kAvg);
        copies_->Issued(i, b.work);
      } else {
        b.work = pg_.ReduceScatter(segment, segment.Narrow(0, mine, b.seg.shard_numel),
                                   ReduceOp::kAvg);
      }
    });
    events_.push_back({BackwardEvent::Kind::kBucketIssued, i});
  }
  // Free the copies of the buckets already reduced (errors surface in FinishBackward).
  if (reduce_low_) copies_->UnpackCompleted();
}

void Zero1::OnPostBackward(nn::Module& module) {
  if (&module == &model_) {
    partial_.OnRootPostBackward();
    compute_.RestoreMasters();  // backward is over
    internal::ZeroUnwrittenGrads(params_);  // what it did not reach: zeros (under no_sync too)
    if (!syncing_this_step_) return;
    events_.push_back({BackwardEvent::Kind::kRootPostBackward, -1});
    readiness_->EndBackward();
    IssueReadyBuckets();
    syncing_this_step_ = false;
    return;
  }
  if (!syncing_this_step_) return;
  readiness_->OnPostBackward(module);
  IssueReadyBuckets();
}

internal::AgreedReductions Zero1::Finish() {
  if (syncing_this_step_) {  // the root's PostBackward did not run
    readiness_->MarkAllFinal();
    IssueReadyBuckets();
    syncing_this_step_ = false;
  }
  if (!in_flight_) return {};
  absl::Status status;
  for (Bucket& b : buckets_) {
    if (b.work) status.Update(b.work->Wait());
  }
  if (reduce_low_) status.Update(copies_->Finish());
  const internal::AgreedReductions agreed =
      readiness_->AgreeOnReductions(pg_, status, partial_.partial(), "zero1", "reduce-scatter");
  for (Bucket& b : buckets_) b.work.reset();
  events_.push_back({BackwardEvent::Kind::kReductionsDone, -1});
  in_flight_ = false;
  if (agreed.status.ok()) reduced_ = true;
  refused_ = agreed.status;
  return agreed;
}

absl::Status Zero1::Step() {
  absl::Status status = FinishBackward();
  if (!status.ok()) return status;
  if (!reduced_ && !refused_.ok()) return refused_;  // FinishBackward said why
  if (!reduced_) {
    return absl::FailedPreconditionError(
        "zero1: Step() without a synced backward since the last step");
  }
  // A GPU check of this step's inputs still unread (an embedding's ids) throws
  // here, before anything changes (the optimizer would, after the flags below).
  std::vector<optim::ParamRef> refs = ParamRefs();
  optim::RaiseDeferredGpuChecks(refs);
  reduced_ = false;
  stepped_ = true;  // until ZeroGrad
  // Bucket by bucket (those that train): step this rank's slices, then start the bucket's
  // all-gather, which runs while the next bucket steps.
  // Mixed precision: the step also writes this rank's slice of the bucket's
  // low-precision flat parameter (its updated master shard's cast, in
  // AdamW's / SGD's own pass on a GPU), which the all-gather then sends.
  std::vector<WorkPtr> works;
  for (int b = 0; b < num_buckets(); ++b) {
    if (!buckets_[b].trains) continue;  // frozen parameters only: unchanged everywhere
    const tensor::Tensor mine = OwnSlice(buckets_[b]);
    const bool low = mine.dtype() != tensor::Dtype::kF32;  // the fp32 master is no copy
    if (low) refs[b].low_precision_copy = mine;
    optimizer_->Step({refs[b]});
    works.push_back(GatherBucket(buckets_[b], /*own_slice_current=*/low));
  }
  for (WorkPtr& w : works) status.Update(w->Wait());
  return status;
}

tensor::Tensor Zero1::OwnSlice(const Bucket& b) const {
  return b.param.Narrow(0, b.seg.shard_begin - b.seg.begin, b.seg.shard_numel);
}

WorkPtr Zero1::GatherBucket(Bucket& b, bool own_slice_current) {
  tensor::Tensor mine = OwnSlice(b);
  if (!own_slice_current && !mine.SharesStorageWith(b.master)) {
    mine.CopyFrom(b.master);  // rounded to param_dtype
  }
  return pg_.AllGather(mine, b.param);
}

absl::Status Zero1::RefreshParameters() {
  std::vector<WorkPtr> works;
  for (Bucket& b : buckets_) works.push_back(GatherBucket(b, /*own_slice_current=*/false));
  absl::Status status;
  for (WorkPtr& w : works) status.Update(w->Wait());
  return status;
}

std::vector<std::pair<std::string, tensor::Tensor>> Zero1::FullStateDict() {
  // Per bucket: its fp32 parameters (padded), the buffer itself or the
  // gathered master slices.
  std::vector<tensor::Tensor> fp32(buckets_.size());
  if (master_.defined()) {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    std::vector<WorkPtr> works;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      fp32[b] =
          tensor::Tensor::Empty({buckets_[b].seg.padded}, tensor::Dtype::kF32, master_.device());
      works.push_back(pg_.AllGather(buckets_[b].master, fp32[b]));
    }
    absl::Status s;
    for (WorkPtr& w : works) s.Update(w->Wait());
    tensor::ThrowIfError(s, "zero1", "full_state_dict all_gather");
  } else {
    for (size_t b = 0; b < buckets_.size(); ++b) fp32[b] = buckets_[b].param;
  }
  std::vector<std::pair<std::string, tensor::Tensor>> out;
  if (pg_.rank() != 0) return out;
  std::vector<tensor::Tensor> copies(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int i : buckets_[b].params) {
      nn::Parameter* p = params_[i].second;
      const tensor::Tensor view =
          fp32[b].Narrow(0, offsets_[i] - buckets_[b].seg.begin, p->numel()).View(p->shape);
      copies[i] = view.device().is_cpu() ? view.Clone() : view.To(tensor::Device::Cpu());
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(params_[i].first, copies[i]);
  for (auto& [name, b] : model_.NamedBuffers()) {  // rank 0's, as PyTorch's state_dict
    if (b->defined()) out.emplace_back(name, b->To(tensor::Device::Cpu()).Clone());
  }
  return out;
}

}  // namespace dist
