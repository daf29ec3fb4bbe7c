// Gradient buckets in backward order and the rule for when one is final.
#include "dist/grad_buckets.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/init.h"

namespace dist {
namespace internal {

std::vector<std::vector<int>> ReverseOrderBuckets(
    const char* op, const std::vector<std::pair<std::string, nn::Parameter*>>& params,
    double cap_mb, bool skip_frozen, const std::set<const nn::Parameter*>& kept_fp32) {
  OP_CHECK(cap_mb > 0, op, "bucket_cap_mb must be > 0, got ", cap_mb);
  // Clamped before the cast (an infinite or huge cap is one bucket, not the
  // undefined conversion's).
  const int64_t cap_bytes = static_cast<int64_t>(
      std::clamp(cap_mb * 1024.0 * 1024.0, 1.0, static_cast<double>(int64_t{1} << 62)));
  std::vector<std::vector<int>> groups;
  int64_t bytes = 0;
  bool group_kept = false;  // the last group holds kept-fp32 parameters
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    if (skip_frozen && !params[i].second->requires_grad) continue;
    const int64_t b = params[i].second->numel() * 4;
    const bool kept = kept_fp32.count(params[i].second) > 0;
    if (groups.empty() || (bytes > 0 && bytes + b > cap_bytes) || kept != group_kept) {
      groups.emplace_back();
      bytes = 0;
      group_kept = kept;
    }
    groups.back().push_back(i);
    bytes += b;
  }
  return groups;
}

void PointGradsAtBuckets(const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                         std::vector<tensor::Tensor>& grad_views) {
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* p = params[i].second;
    if (!p->requires_grad) continue;  // frozen: no gradient
    tensor::Tensor& view = grad_views[i];
    if (!p->grad.defined()) {
      p->grad = view;
      p->grad_unwritten = true;
    } else if (p->grad.raw_data() != view.raw_data()) {
      view.CopyFrom(p->grad);
      p->grad = view;
      p->grad_unwritten = false;
    }
  }
}

void ZeroReplacedGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                       std::vector<tensor::Tensor>& grad_views) {
  for (size_t i = 0; i < params.size(); ++i) {
    nn::Parameter* p = params[i].second;
    p->grad_unwritten = false;
    // Frozen when wrapped (no view; CheckFrozenUnchanged names a flag flipped
    // since), frozen, or dropped: nothing to zero.
    if (!grad_views[i].defined() || !p->requires_grad || !p->grad.defined()) continue;
    if (p->grad.raw_data() == grad_views[i].raw_data()) continue;  // the bucket's, zeroed
    tensor::Zero(p->grad);
    p->grad = grad_views[i];
  }
}

void ZeroUnwrittenGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                        const std::vector<int>& indices) {
  for (int i : indices) params[i].second->ZeroGradIfUnwritten();
}

void ZeroUnwrittenGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params) {
  for (const auto& [name, p] : params) p->ZeroGradIfUnwritten();
}

void DropGrads(const std::vector<std::pair<std::string, nn::Parameter*>>& params) {
  for (const auto& [name, p] : params) p->DropGrad();
}

std::vector<bool> FrozenFlags(const std::vector<std::pair<std::string, nn::Parameter*>>& params) {
  std::vector<bool> frozen;
  frozen.reserve(params.size());
  for (const auto& [name, p] : params) frozen.push_back(!p->requires_grad);
  return frozen;
}

void CheckFrozenUnchanged(const char* op,
                          const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                          const std::vector<bool>& frozen) {
  for (size_t i = 0; i < params.size(); ++i) {
    const bool now = !params[i].second->requires_grad;
    OP_CHECK(now == frozen[i], op, "parameter ", params[i].first, " was ",
             now ? "frozen" : "unfrozen", " (requires_grad) after the wrapper was built; set ",
             "requires_grad before wrapping the model");
  }
}

std::unordered_map<nn::Module*, std::vector<int>> SubtreeParameterIndices(nn::Module& root) {
  std::unordered_map<nn::Parameter*, int> index;
  int i = 0;
  for (auto& [name, p] : root.NamedParameters()) index[p] = i++;
  std::unordered_map<nn::Module*, std::vector<int>> out;
  for (auto& [name, m] : root.NamedModules()) {
    std::vector<int>& v = out[m];
    for (auto& [pname, p] : m->NamedParameters()) v.push_back(index.at(p));
  }
  return out;
}

BucketReadiness::BucketReadiness(nn::Module& root, std::vector<int> bucket_of, int num_buckets)
    : root_(root),
      params_(root.NamedParameters()),
      bucket_of_(std::move(bucket_of)),
      bucket_params_(num_buckets),
      bucket_size_(num_buckets, 0),
      pending_(num_buckets, 0),
      final_(bucket_of_.size(), false),
      modules_done_(bucket_of_.size(), false),
      writes_at_start_(bucket_of_.size(), 0),
      writes_when_taken_(bucket_of_.size(), -1),
      expected_writes_(bucket_of_.size(), 0),
      subtree_(SubtreeParameterIndices(root)) {
  OP_CHECK(bucket_of_.size() == params_.size(), "buckets", bucket_of_.size(),
           " bucket indices for ", params_.size(), " parameters");
  for (size_t i = 0; i < bucket_of_.size(); ++i) {
    const int b = bucket_of_[i];
    OP_CHECK(b >= -1 && b < num_buckets, "buckets", "bucket ", b, " out of [0, ", num_buckets,
             ") (or -1: none)");
    if (b < 0) continue;
    ++bucket_size_[b];
    bucket_params_[b].push_back(static_cast<int>(i));
  }
  for (auto& [module, indices] : subtree_) calls_[module] = {0, 0};
}

void BucketReadiness::OnPreForward(nn::Module& module) {
  if (&module == &root_) {
    for (auto& [m, calls] : calls_) calls = {0, 0};
    forward_phase_ = true;
  }
  if (forward_phase_) ++calls_[&module].first;
}

void BucketReadiness::EndForward() { forward_phase_ = false; }

void BucketReadiness::StartBackward() {
  std::fill(final_.begin(), final_.end(), false);
  std::fill(modules_done_.begin(), modules_done_.end(), false);
  std::fill(writes_when_taken_.begin(), writes_when_taken_.end(), -1);
  for (size_t i = 0; i < params_.size(); ++i) writes_at_start_[i] = params_[i].second->grad_writes;
  pending_ = bucket_size_;
  next_ = 0;
}

int64_t BucketReadiness::Writes(int param) const {
  return params_[param].second->grad_writes - writes_at_start_[param];
}

void BucketReadiness::OnPostBackward(nn::Module& module) {
  std::pair<int, int>& calls = calls_[&module];
  if (++calls.second >= calls.first) {
    auto it = subtree_.find(&module);
    if (it != subtree_.end()) {
      for (int i : it->second) modules_done_[i] = true;
    }
  }
  // Also parameters whose modules finished earlier and that another module
  // has written since.
  MarkWrittenFinal();
}

void BucketReadiness::MarkWrittenFinal() {
  if (!learned_) return;  // the first synced backward: final at its end
  // The buckets not taken yet (a parameter in none decides nothing).
  for (size_t b = next_; b < bucket_params_.size(); ++b) {
    for (int p : bucket_params_[b]) {
      if (!final_[p] && modules_done_[p] && Writes(p) >= expected_writes_[p]) MarkFinal(p);
    }
  }
}

void BucketReadiness::EndBackward() {
  for (size_t i = 0; i < expected_writes_.size(); ++i) {
    expected_writes_[i] = std::max(expected_writes_[i], Writes(static_cast<int>(i)));
  }
  learned_ = true;
  MarkAllFinal();
}

void BucketReadiness::MarkAllFinal() {
  for (size_t i = 0; i < final_.size(); ++i) MarkFinal(static_cast<int>(i));
}

void BucketReadiness::MarkFinal(int param) {
  if (final_[param]) return;
  final_[param] = true;
  if (bucket_of_[param] >= 0) --pending_[bucket_of_[param]];
}

int BucketReadiness::TakeNextReady() {
  if (next_ >= static_cast<int>(pending_.size()) || pending_[next_] > 0) return -1;
  for (int p : bucket_params_[next_]) writes_when_taken_[p] = Writes(p);
  return next_++;
}

AgreedReductions BucketReadiness::AgreeOnReductions(ProcessGroup& pg,
                                                    const absl::Status& collectives, bool partial,
                                                    const char* op, const char* collective,
                                                    std::vector<float>* written) const {
  // The flag this rank reports: 0 OK, 1 a late write, 2 its collectives
  // failed, 3 its backward stopped partway (a late-write check means nothing
  // for a partial backward, which wrote less).
  constexpr float kLate = 1, kFailed = 2, kPartial = 3;
  float flag = 0;
  absl::Status mine = collectives;
  if (!collectives.ok()) {
    flag = kFailed;
  } else if (partial) {
    flag = kPartial;
    mine = absl::FailedPreconditionError(absl::StrCat(
        "[", op, "] this rank's backward stopped partway (it threw before the root module's "
        "backward ended), so its gradients are partial and no rank should step on their "
        "average; call ZeroGrad on every rank to skip the batch"));
  } else {
    mine = CheckNoLateWrites(op, collective);
    if (!mine.ok()) flag = kLate;
  }
  if (pg.size() == 1) return {mine, flag == kPartial};
  // An all-reduce (max) of one flag per rank (an all-reduce like the step's
  // own, no all-gather where DDP has none). On a broken group it fails at once.
  const int64_t extra = written == nullptr ? 0 : static_cast<int64_t>(written->size());
  tensor::Tensor flags = tensor::Tensor::Zeros({pg.size() + extra});  // (N + written,)
  flags.data<float>()[pg.rank()] = flag;
  for (int64_t i = 0; i < extra; ++i) flags.data<float>()[pg.size() + i] = (*written)[i];
  const absl::Status exchanged = pg.AllReduceSync(flags, ReduceOp::kMax);
  if (!exchanged.ok()) return {flag == kPartial || mine.ok() ? exchanged : mine, false};
  for (int64_t i = 0; i < extra; ++i) (*written)[i] = flags.data<float>()[pg.size() + i];
  std::vector<int> late, failed, stopped;
  for (int r = 0; r < pg.size(); ++r) {
    const float f = flags.data<float>()[r];
    if (f == kLate) late.push_back(r);
    if (f == kFailed) failed.push_back(r);
    if (f == kPartial) stopped.push_back(r);
  }
  const bool only_partial = !stopped.empty() && late.empty() && failed.empty();
  // This rank's own error; a partial backward's only when no rank failed
  // otherwise (that failure, named below, is the one that matters).
  if (!mine.ok() && (flag != kPartial || only_partial)) return {mine, only_partial};
  // "rank 1 (see its error)", "ranks 1, 3 (see their errors)".
  const auto ranks = [](const std::vector<int>& rs) {
    const bool one = rs.size() == 1;
    return absl::StrCat(one ? "rank " : "ranks ", absl::StrJoin(rs, ", "),
                        one ? " (see its error)" : " (see their errors)");
  };
  if (!failed.empty()) {
    return {absl::AbortedError(absl::StrCat("[", op, "] this step's ", collective,
                                            "s failed on ", ranks(failed),
                                            ", so no rank should step")),
            false};
  }
  if (!late.empty()) {
    return {absl::FailedPreconditionError(absl::StrCat(
                "[", op, "] ", ranks(late), " wrote a gradient after its bucket's ", collective,
                " went out, so every rank's reduced gradients are wrong and no rank should "
                "step. Use each parameter equally often on every rank")),
            false};
  }
  if (stopped.empty()) return {absl::OkStatus(), false};
  return {absl::FailedPreconditionError(absl::StrCat(
              "[", op, "] the backward stopped partway on ", ranks(stopped),
              ", so the reduced gradients are not this batch's and no rank should step; "
              "call ZeroGrad on every rank to skip the batch")),
          only_partial};
}

void BucketReadiness::GiveBack(int bucket) {
  OP_CHECK(next_ > 0 && bucket == next_ - 1, "grad_buckets", "bucket ", bucket,
           " given back is not the last one taken (", next_ - 1, ")");
  for (int p : bucket_params_[bucket]) writes_when_taken_[p] = -1;
  --next_;
}

absl::Status BucketReadiness::CheckNoLateWrites(const char* op, const char* collective) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const int p = static_cast<int>(i);
    if (writes_when_taken_[p] < 0 || Writes(p) == writes_when_taken_[p]) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "[", op, "] the gradient of '", params_[p].first, "' was written after its bucket's ",
        collective, " went out (", Writes(p), " writes this backward, ", writes_when_taken_[p],
        " when the bucket went out): it was used more often than in the synced backwards "
        "before, which set when its gradient is final, and every rank's gradient of it is "
        "wrong. Use each parameter equally often every step"));
  }
  return absl::OkStatus();
}

tensor::Tensor LowPrecisionCopies::Make(int bucket, const tensor::Tensor& src,
                                        tensor::Dtype dtype) {
  while (max_inflight_ > 0 && inflight() >= max_inflight_) WaitOldest();
  tensor::Tensor copy;
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kCommunication);
    copy = src.To(dtype);
  }
  out_.push_back({bucket, copy, nullptr});
  peak_ = std::max(peak_, inflight());
  return copy;
}

void LowPrecisionCopies::Issued(int bucket, WorkPtr work) {
  OP_CHECK(!out_.empty() && out_.back().bucket == bucket && out_.back().work == nullptr,
           "grad_buckets", "bucket ", bucket, " was issued without its copy made last");
  out_.back().work = std::move(work);
}

void LowPrecisionCopies::Abandon(int bucket) {
  if (!out_.empty() && out_.back().bucket == bucket && out_.back().work == nullptr) {
    out_.pop_back();
  }
}

void IssueOrGiveBack(BucketReadiness& readiness, LowPrecisionCopies* copies, int bucket,
                     const WorkPtr& work, const std::function<void()>& issue) {
  try {
    issue();
  } catch (...) {
    if (work == nullptr) {  // not issued: no copy left to unpack, the bucket ready again
      if (copies != nullptr) copies->Abandon(bucket);
      readiness.GiveBack(bucket);
    }
    throw;
  }
}

void LowPrecisionCopies::WaitOldest() {
  Out& o = out_.front();
  OP_CHECK(o.work != nullptr, "grad_buckets", "bucket ", o.bucket,
           "'s copy was neither issued nor abandoned");
  absl::Status s = o.work->Wait();
  if (s.ok()) unpack_(o.bucket, o.copy);
  status_.Update(s);
  out_.pop_front();
}

void LowPrecisionCopies::UnpackCompleted() {
  for (auto it = out_.begin(); it != out_.end();) {
    if (it->work == nullptr || !it->work->IsCompleted()) {
      ++it;
      continue;
    }
    absl::Status s = it->work->Wait();
    if (s.ok()) unpack_(it->bucket, it->copy);
    status_.Update(s);
    it = out_.erase(it);
  }
}

absl::Status LowPrecisionCopies::Finish() {
  while (!out_.empty()) WaitOldest();
  absl::Status s = status_;
  status_ = absl::OkStatus();
  last_peak_ = peak_;
  peak_ = 0;
  return s;
}

void ComputeCopies::OnRootPreBackward() const {
  OP_CHECK(!forward_only_, op_,
           "backward between BeginForwardOnly and EndForwardOnly (forward-only work); call "
           "EndForwardOnly before training");
}

}  // namespace internal
}  // namespace dist
