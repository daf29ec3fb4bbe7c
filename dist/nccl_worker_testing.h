// Stand-ins for NCCL calls in the tests of the nccl engine's call thread
// (dist/nccl_worker.h), which run without a GPU: calls whose steps the test
// gives, a loopback "collective" that finishes once every rank started it,
// and a bounded wait for a Work.
#ifndef DIST_NCCL_WORKER_TESTING_H_
#define DIST_NCCL_WORKER_TESTING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist/nccl_worker.h"
#include "dist/work.h"

namespace dist {
namespace nccl {
namespace testing {

// A call whose steps are given by the test.
class FakeCall final : public PendingCall {
 public:
  std::function<absl::Status()> start = [] { return absl::OkStatus(); };
  std::function<absl::StatusOr<bool>()> enqueued = [] { return true; };
  std::function<absl::StatusOr<bool>()> finished = [] { return true; };
  bool needs_idle = false;

  absl::Status Start() override { return start(); }
  absl::StatusOr<bool> Enqueued() override { return enqueued(); }
  absl::StatusOr<bool> Finished() override { return finished(); }
  bool NeedsIdle() const override { return needs_idle; }
};

// Calls numbered per rank that finish, as a collective would, once every rank
// has started the call with the same number.
class Loopback {
 public:
  explicit Loopback(int size) : size_(size) {}
  std::shared_ptr<FakeCall> Call(int64_t number);

 private:
  const int size_;
  std::mutex mu_;
  std::map<int64_t, int> started_;
};

// Whether `work` completes within `limit` (polled: a test must not hang on it).
bool CompletesWithin(const WorkPtr& work, absl::Duration limit);

}  // namespace testing
}  // namespace nccl
}  // namespace dist

#endif  // DIST_NCCL_WORKER_TESTING_H_
