// The nccl worker tests' stand-ins: the loopback collective and the bounded
// wait.
#include "dist/nccl_worker_testing.h"

#include "absl/time/clock.h"

namespace dist {
namespace nccl {
namespace testing {

std::shared_ptr<FakeCall> Loopback::Call(int64_t number) {
  auto call = std::make_shared<FakeCall>();
  call->start = [this, number] {
    std::lock_guard<std::mutex> lock(mu_);
    ++started_[number];
    return absl::OkStatus();
  };
  call->finished = [this, number]() -> absl::StatusOr<bool> {
    std::lock_guard<std::mutex> lock(mu_);
    return started_[number] == size_;
  };
  return call;
}

bool CompletesWithin(const WorkPtr& work, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (!work->IsCompleted()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace testing
}  // namespace nccl
}  // namespace dist
