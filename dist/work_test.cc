// Tests of dist::Work / CompletionWork.
#include "dist/work.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dist {
namespace {

TEST(WorkTest, DoneIsCompleted) {
  WorkPtr ok = Work::Done(absl::OkStatus());
  EXPECT_TRUE(ok->IsCompleted());
  EXPECT_TRUE(ok->Wait().ok());
  WorkPtr failed = Work::Done(absl::InternalError("x"));
  EXPECT_EQ(failed->Wait(), absl::InternalError("x"));
}

TEST(WorkTest, WaitBlocksUntilCompletedFromAnotherThread) {
  auto work = std::make_shared<CompletionWork>();
  EXPECT_FALSE(work->IsCompleted());
  std::thread completer([work] {
    absl::SleepFor(absl::Milliseconds(50));
    work->Complete(absl::DeadlineExceededError("late"));
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ(work->Wait(), absl::DeadlineExceededError("late"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(40));
  EXPECT_TRUE(work->IsCompleted());
  completer.join();
}

TEST(WorkTest, FirstCompletionWins) {
  CompletionWork work;
  work.Complete(absl::OkStatus());
  work.Complete(absl::InternalError("ignored"));
  EXPECT_TRUE(work.Wait().ok());
  EXPECT_TRUE(work.Wait().ok());
}

}  // namespace
}  // namespace dist
