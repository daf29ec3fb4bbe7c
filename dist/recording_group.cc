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

WorkPtr ForwardCall(ProcessGroup& inner, const CollectiveCall& call) {
  CollectiveOptions options = CollectiveOptions::WithTimeout(call.timeout);
  options.ready_stream = call.ready_stream;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      return inner.AllReduce(call.input, call.op, options);
    case CollectiveKind::kReduceScatter:
      return inner.ReduceScatter(call.input, call.output, call.op, options);
    case CollectiveKind::kAllGather:
      return inner.AllGather(call.input, call.output, options);
    case CollectiveKind::kBroadcast:
      return inner.Broadcast(call.input, call.root, options);
    case CollectiveKind::kBarrier:
      return inner.Barrier(options);
  }
  return Work::Done(absl::InternalError("ForwardCall: an unknown collective kind"));
}

WorkPtr RecordingGroup::Issue(std::shared_ptr<CollectiveCall> call) {
  const std::string what = DescribeCall(*call);
  log_->Add(absl::StrCat(name_, " issue ", what));
  return std::make_shared<RecordingWork>(ForwardCall(inner_, *call), log_,
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
