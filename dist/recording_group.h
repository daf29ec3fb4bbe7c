// RecordingGroup (tests): a ProcessGroup that forwards every collective, and
// every Split, to the group it wraps, and logs when each collective is
// issued and when it is waited for, so that a test can read the order of a
// rank's communication (e.g. that a collective stays in flight while the
// next one is issued). It is not the engine's class: what looks for an
// engine's group by type (the nccl engine's SetNcclComputeStream) does not
// find it, and its messages name ranks as the base class does.
#ifndef DIST_RECORDING_GROUP_H_
#define DIST_RECORDING_GROUP_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/process_group.h"

namespace dist::testing {

// One rank's log, shared by its group and the groups split from it:
// "<group> issue <call>", "<group> wait <call>" (DescribeCall's words), with
// the root group named "world" and a split "<parent>/split<n>" (n counts the
// parent's splits from 1).
class CollectiveLog {
 public:
  void Add(std::string line);
  std::vector<std::string> Lines() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Issues `call` on `inner` as its own collective (the call's kind, tensors,
// op, root, timeout and ready stream): for groups that wrap another.
WorkPtr ForwardCall(ProcessGroup& inner, const CollectiveCall& call);

class RecordingGroup final : public ProcessGroup {
 public:
  // Wraps `inner` (which outlives this group).
  RecordingGroup(ProcessGroup& inner, std::shared_ptr<CollectiveLog> log,
                 std::string name = "world");
  // Wraps a group of its own (a split's).
  RecordingGroup(std::unique_ptr<ProcessGroup> owned, std::shared_ptr<CollectiveLog> log,
                 std::string name);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::string_view backend() const override { return inner_.backend(); }

 protected:
  WorkPtr Issue(std::shared_ptr<CollectiveCall> call) override;
  absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int color, int key,
                                                        absl::Duration timeout) override;

 private:
  std::unique_ptr<ProcessGroup> owned_;
  ProcessGroup& inner_;
  std::shared_ptr<CollectiveLog> log_;
  const std::string name_;
  int splits_ = 0;
};

}  // namespace dist::testing

#endif  // DIST_RECORDING_GROUP_H_
