// LaunchOrder: tickets in issue order, passed in any order, a turn that
// advances over the passed ones.
#include "dist/nccl_launch_order.h"

namespace dist {
namespace nccl {

int64_t LaunchOrder::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_++;
}

bool LaunchOrder::IsTurn(int64_t ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ticket <= turn_;
}

void LaunchOrder::WaitForTurn(int64_t ticket) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ticket <= turn_; });
}

void LaunchOrder::Pass(int64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ticket < turn_ || ticket >= taken_) return;  // not a pending ticket
    passed_ahead_.insert(ticket);
    while (!passed_ahead_.empty() && *passed_ahead_.begin() == turn_) {
      passed_ahead_.erase(passed_ahead_.begin());
      ++turn_;
    }
  }
  cv_.notify_all();
}

int64_t LaunchOrder::taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

}  // namespace nccl
}  // namespace dist
