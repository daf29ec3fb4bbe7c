// ReadProcStat / ProcessExited / ProcessStartTime: this process runs and
// started moments ago; a child that exited and was not reaped is a zombie,
// and once reaped is gone; a command name with spaces and ')' parses.
#include "dist/proc_stat.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dist {
namespace {

TEST(ProcStat, ThisProcessRunsAndStartedMomentsAgo) {
  const std::optional<ProcStat> self = ReadProcStat(0);
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->state, 'R');  // reading its own stat
  EXPECT_GT(self->start_ticks, 0);
  const std::optional<ProcStat> by_pid = ReadProcStat(::getpid());
  ASSERT_TRUE(by_pid.has_value());
  EXPECT_EQ(by_pid->start_ticks, self->start_ticks);
  EXPECT_FALSE(ProcessExited(::getpid()));
  const std::optional<absl::Time> started = ProcessStartTime(0);
  ASSERT_TRUE(started.has_value());
  EXPECT_LE(*started, absl::Now() + absl::Seconds(2));  // btime is whole seconds
  EXPECT_GT(*started, absl::Now() - absl::Minutes(10));
}

TEST(ProcStat, AChildThatExitedIsAZombieThenGone) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_NAME, "a b) (c", 0, 0, 0);  // a name that looks like the fields' end
    usleep(300000);
    _exit(0);
  }
  std::optional<ProcStat> running;
  for (int i = 0; i < 100; ++i) {  // (it sleeps 300 ms)
    running = ReadProcStat(child);
    ASSERT_TRUE(running.has_value());
    if (running->state == 'S') break;
    usleep(2000);
  }
  EXPECT_EQ(running->state, 'S');  // asleep, with its odd name parsed
  EXPECT_FALSE(ProcessExited(child));
  const std::optional<absl::Time> started = ProcessStartTime(child);
  ASSERT_TRUE(started.has_value());
  EXPECT_GE(*started, *ProcessStartTime(0) - absl::Seconds(1));
  for (int i = 0; i < 200 && !ProcessExited(child); ++i) usleep(10000);
  const std::optional<ProcStat> zombie = ReadProcStat(child);
  ASSERT_TRUE(zombie.has_value());
  EXPECT_EQ(zombie->state, 'Z');
  EXPECT_TRUE(ProcessExited(child));
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_FALSE(ReadProcStat(child).has_value());
  EXPECT_TRUE(ProcessExited(child));
  EXPECT_FALSE(ProcessStartTime(child).has_value());
}

}  // namespace
}  // namespace dist
