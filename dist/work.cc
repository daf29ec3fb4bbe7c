// dist::Work and CompletionWork.
#include "dist/work.h"

#include <utility>

namespace dist {

std::shared_ptr<Work> Work::Done(absl::Status status) {
  auto work = std::make_shared<CompletionWork>();
  work->Complete(std::move(status));
  return work;
}

absl::Status CompletionWork::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  // A deep copy: absl::Status shares its message by reference counting inside
  // libabsl_status, which ThreadSanitizer cannot see (Debian's Abseil is not
  // instrumented); a private copy per waiter keeps the threads independent.
  absl::Status copy(status_.code(), status_.message());
  status_.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { copy.SetPayload(url, payload); });
  return copy;
}

bool CompletionWork::IsCompleted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void CompletionWork::Complete(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    status_ = std::move(status);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace dist
