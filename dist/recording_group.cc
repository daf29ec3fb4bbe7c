// RecordingGroup (recording_group.h): forwards collectives and splits, and
// logs each collective's issue and its first wait.
#include "dist/recording_group.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dist::testing {
namespace {

// The inner work, logging its first Wait.
class RecordingWork final : public Work {
 public:
  RecordingWork(WorkPtr inner, std::shared_ptr<CollectiveLog> log, std::string line)
      : inner_(std::move(inner)), log_(std::move(log)), line_(std::move(line)) {}
  absl::Status Wait() override {
    if (!waited_.exchange(true)) log_->Add(line_);
    return inner_->Wait();
  }
  bool IsCompleted() const override { return inner_->IsCompleted(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<CollectiveLog> log_;
  const std::string line_;
  std::atomic<bool> waited_{false};
};

}  // namespace

void CollectiveLog::Add(std::string line) {
  std::lock_guard<std::mutex> lock(mu_);
  lines_.push_back(std::move(line));
}

std::vector<std::string> CollectiveLog::Lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_;
}

RecordingGroup::RecordingGroup(ProcessGroup& inner, std::shared_ptr<CollectiveLog> log,
                               std::string name)
    : ProcessGroup(inner.timeout()), inner_(inner), log_(std::move(log)), name_(std::move(name)) {}

RecordingGroup::RecordingGroup(std::unique_ptr<ProcessGroup> owned,
                               std::shared_ptr<CollectiveLog> log, std::string name)
    : ProcessGroup(owned->timeout()),
      owned_(std::move(owned)),
      inner_(*owned_),
      log_(std::move(log)),
      name_(std::move(name)) {}

WorkPtr RecordingGroup::Issue(std::shared_ptr<CollectiveCall> call) {
  const std::string what = DescribeCall(*call);
  log_->Add(absl::StrCat(name_, " issue ", what));
  CollectiveOptions options = CollectiveOptions::WithTimeout(call->timeout);
  options.ready_stream = call->ready_stream;
  WorkPtr work;
  switch (call->kind) {
    case CollectiveKind::kAllReduce:
      work = inner_.AllReduce(call->input, call->op, options);
      break;
    case CollectiveKind::kReduceScatter:
      work = inner_.ReduceScatter(call->input, call->output, call->op, options);
      break;
    case CollectiveKind::kAllGather:
      work = inner_.AllGather(call->input, call->output, options);
      break;
    case CollectiveKind::kBroadcast:
      work = inner_.Broadcast(call->input, call->root, options);
      break;
    case CollectiveKind::kBarrier:
      work = inner_.Barrier(options);
      break;
  }
  return std::make_shared<RecordingWork>(std::move(work), log_,
                                         absl::StrCat(name_, " wait ", what));
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> RecordingGroup::DoSplit(int color, int key,
                                                                      absl::Duration timeout) {
  const std::string name = absl::StrCat(name_, "/split", ++splits_);
  absl::StatusOr<std::unique_ptr<ProcessGroup>> split =
      inner_.Split(color, key, CollectiveOptions::WithTimeout(timeout));
  if (!split.ok() || *split == nullptr) return split;
  return std::unique_ptr<ProcessGroup>(
      std::make_unique<RecordingGroup>(*std::move(split), log_, name));
}

}  // namespace dist::testing
