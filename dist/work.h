// dist::Work: the handle of an asynchronous collective. Wait() blocks until it
// finished and returns its result; IsCompleted() polls. Engines complete work
// through CompletionWork (a one-shot, thread-safe status cell).
#ifndef DIST_WORK_H_
#define DIST_WORK_H_

#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/status/status.h"

namespace dist {

class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the collective has finished (successfully or not) and returns
  // its result. Never hangs forever: every collective has a timeout. May be
  // called any number of times, from any thread.
  virtual absl::Status Wait() = 0;
  // True once the collective has finished; Wait() then returns at once.
  virtual bool IsCompleted() const = 0;

  // A work that is already finished with `status`.
  static std::shared_ptr<Work> Done(absl::Status status);
};

using WorkPtr = std::shared_ptr<Work>;

// Work completed by whoever runs the collective (an engine's worker thread).
class CompletionWork final : public Work {
 public:
  CompletionWork() = default;
  CompletionWork(const CompletionWork&) = delete;
  CompletionWork& operator=(const CompletionWork&) = delete;

  absl::Status Wait() override;
  bool IsCompleted() const override;
  // Finishes the work with `status` and wakes every waiter. Only the first
  // call counts; later ones are ignored.
  void Complete(absl::Status status);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

}  // namespace dist

#endif  // DIST_WORK_H_
