// Deciding --resume before a run (resume_plan.cc): --resume=auto's choice,
// the resumes that would replace another run's or later checkpoints, and the
// launch a restarted job belongs to.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/common/train_support.h"
#include "models/common/train_support_testing.h"

namespace train {
namespace {

// --resume=auto: the folder's latest checkpoint when there is one, else a
// fresh start; a fresh start into a folder of checkpoints is refused.
TEST(ResolveAutoResumeTest, LatestWhenThereIsOneElseAFreshStartThatReplacesNothing) {
  const std::string dir = ::testing::TempDir() + "/auto_resume";
  std::filesystem::remove_all(dir);
  EXPECT_EQ(*ResolveAutoResume("auto", dir), "");  // missing
  EXPECT_TRUE(CheckFreshCheckpointDir(dir).ok());
  std::filesystem::create_directories(dir);
  EXPECT_EQ(*ResolveAutoResume("auto", dir), "");  // empty
  EXPECT_TRUE(CheckFreshCheckpointDir(dir).ok());
  EXPECT_EQ(*ResolveAutoResume("latest", dir), "latest");  // others as they are
  EXPECT_EQ(ResolveAutoResume("auto", "").status().code(), absl::StatusCode::kInvalidArgument);

  TrainState state;
  testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);
  EXPECT_EQ(*ResolveAutoResume("auto", dir), "latest");
  const absl::Status fresh = CheckFreshCheckpointDir(dir);
  EXPECT_EQ(fresh.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.message(),
            absl::StrCat("--checkpoint_dir=", dir, " holds an earlier run's checkpoints "
                         "(latest: step_000001), which this run's saves would replace: continue "
                         "that run with --resume=latest (--resume=auto resumes when there is a "
                         "checkpoint and starts fresh when there is none, as a restarted job "
                         "wants), or give this run a new --checkpoint_dir"));
  // Killed between the first step folder and `latest`: that step.
  std::filesystem::remove(dir + "/latest");
  EXPECT_TRUE(absl::StrContains(CheckFreshCheckpointDir(dir).message(),
                                absl::StrCat("(step folders step_000001), which this run's saves "
                                             "would replace: continue that run with --resume=",
                                             dir, "/step_000001")));
  EXPECT_EQ(*ResolveAutoResume("auto", dir), dir + "/step_000001");
  // A save interrupted with its copy set aside: how to put it back, not a
  // fresh start over it.
  std::filesystem::rename(dir + "/step_000001", dir + "/step_000001.old-7");
  { std::ofstream(dir + "/latest") << "step_000001\n"; }
  const absl::StatusOr<std::string> interrupted = ResolveAutoResume("auto", dir);
  ASSERT_FALSE(interrupted.ok());
  EXPECT_TRUE(absl::StrContains(interrupted.status().message(), "put it back with `mv"))
      << interrupted.status();
  EXPECT_TRUE(absl::StrContains(CheckFreshCheckpointDir(dir).message(), "put it back with `mv"));
  std::filesystem::rename(dir + "/step_000001.old-7", dir + "/step_000001");
  // A `latest` naming a step that is gone, nothing else: a fresh start.
  std::filesystem::remove_all(dir + "/step_000001");
  { std::ofstream(dir + "/latest") << "step_000001\n"; }
  EXPECT_EQ(*ResolveAutoResume("auto", dir), "");
  EXPECT_TRUE(CheckFreshCheckpointDir(dir).ok());
}

// A --resume given (not auto) is found before the run starts: one that names
// no checkpoint fails the plan with ResolveCheckpoint's error.
TEST(PlanResumeTest, AGivenResumeMustNameACheckpoint) {
  const std::string dir = ::testing::TempDir() + "/plan_resume";
  std::filesystem::remove_all(dir);
  const absl::StatusOr<ResumePlan> none = PlanResume("latest", dir, {});
  EXPECT_EQ(none.status(), absl::NotFoundError("no checkpoint to resume: '" + dir +
                                               "/latest' is missing"));
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_EQ(PlanResume(dir + "/step_000001", "", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  TrainState state;
  testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);
  absl::StatusOr<ResumePlan> plan = PlanResume("latest", dir, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->resume, "latest");
  EXPECT_FALSE(plan->auto_fresh);
  plan = PlanResume(dir + "/step_000001", "", {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->resume, dir + "/step_000001");
}

// A --resume given may not let this run's saves replace another run's
// checkpoints: going back to an earlier step of --checkpoint_dir is refused
// while later step folders are there; a checkpoint of another folder is
// refused when --checkpoint_dir holds checkpoints (as a fresh start is);
// continuing the latest step replaces nothing of another run. A restarted
// job continues its own latest checkpoint instead of the --resume given.
TEST(PlanResumeTest, AResumeThatWouldReplaceAnotherRunsCheckpointsIsRefused) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/plan_replace";
  const std::string other = ::testing::TempDir() + "/plan_other";
  fs::remove_all(dir);
  fs::remove_all(other);
  TrainState state;
  testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);  // step_000001
  testing::SaveAfterOneStep(testing::SmallConfig(), other, state);
  for (const char* step : {"step_000002", "step_000004", "step_000005"}) {
    fs::copy(dir + "/step_000001", dir + "/" + step);
  }
  ASSERT_TRUE(SetLatestCheckpoint(dir, 4).ok());
  // Back to step 2: steps 4 and 5 are later (5 is this run's interrupted
  // save after latest, but going back would strand it too).
  absl::StatusOr<ResumePlan> plan = PlanResume(dir + "/step_000002", dir, {});
  EXPECT_EQ(plan.status(),
            absl::InvalidArgumentError(absl::StrCat(
                "--resume=", dir, "/step_000002 goes back to step 2 of --checkpoint_dir=", dir,
                ", which holds later checkpoints (step_000004, step_000005) that this run's "
                "saves, or a later --resume=latest, would replace: resume the newest (--resume=",
                dir, "/step_000005), or move them aside first (mv -T ", dir, "/step_000004 ", dir,
                "/step_000004.before-resume; mv -T ", dir, "/step_000005 ", dir,
                "/step_000005.before-resume), or give this run a new --checkpoint_dir")));
  // A newest kept without its optimizer state (model only) is said as such,
  // and not offered as the resume (it is refused).
  fs::copy(dir + "/step_000005", dir + "/step_000006");
  fs::remove(dir + "/step_000006/optimizer.safetensors");
  plan = PlanResume(dir + "/step_000002", dir, {});
  EXPECT_NE(plan.status().message().find("holds later checkpoints (step_000004, step_000005, "
                                         "step_000006 (model only))"),
            std::string::npos)
      << plan.status();
  EXPECT_EQ(plan.status().message().find("resume the newest"), std::string::npos)
      << plan.status();
  fs::remove_all(dir + "/step_000006");
  // The step `latest` names (also as "latest" or as the folder) behind a
  // later step folder (a save interrupted before `latest`, or a `latest` set
  // back): refused too, naming it; auto takes the newest.
  for (const std::string& given : {dir + "/step_000004", std::string("latest"), dir}) {
    plan = PlanResume(given, dir, {});
    EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                  absl::StrCat(" goes back to step 4 of --checkpoint_dir=", dir,
                                               " (the step its latest names), which holds later "
                                               "checkpoints (step_000005) ")))
        << given << ": " << plan.status();
  }
  plan = PlanResume("auto", dir, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->resume, dir + "/step_000005");
  // A fresh start is refused pointing at what auto takes.
  EXPECT_TRUE(absl::StrContains(PlanResume("", dir, {}).status().message(),
                                absl::StrCat("continue that run with --resume=", dir,
                                             "/step_000005 (--resume=auto")))
      << PlanResume("", dir, {}).status();
  // A later "step_N" that holds no checkpoint one can read (here a file; an
  // empty folder holds nothing and counts for nothing): auto does not pass
  // over it, nor does a --resume given.
  fs::create_directories(dir + "/step_000007");
  std::ofstream(dir + "/step_000006") << "not a folder";
  plan = PlanResume("auto", dir, {});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.status().message(),
            absl::StrCat("--resume=auto: ", dir, " holds step_000006, later than its newest "
                         "checkpoint one can read (step_000005), which this run's saves would "
                         "replace or fail on: ", dir, "/step_000006 is not a folder; repair them, "
                         "or move them aside (mv -T ", dir, "/step_000006 ", dir,
                         "/step_000006.unusable)"));
  // Nor does a fresh start, and a folder of unreadable step folders alone
  // (no checkpoint one can read at all) is refused by auto and a fresh start.
  const std::string bare = ::testing::TempDir() + "/plan_unusable_only";
  fs::remove_all(bare);
  fs::create_directories(bare);
  std::ofstream(bare + "/step_000003") << "not a folder";
  plan = PlanResume("auto", bare, {});
  EXPECT_EQ(plan.status().message(),
            absl::StrCat("--resume=auto: ", bare, " holds step_000003, later than any checkpoint "
                         "one can read (there is none), which this run's saves would replace or "
                         "fail on: ", bare, "/step_000003 is not a folder; repair them, or move "
                         "them aside (mv -T ", bare, "/step_000003 ", bare,
                         "/step_000003.unusable)"));
  EXPECT_EQ(PlanResume("", bare, {}).status().message(),
            absl::StrCat("--checkpoint_dir=", bare, " holds step folders with no checkpoint one "
                         "can read (step_000003), which this run's saves would replace or fail "
                         "on: repair or move them aside, or give this run a new "
                         "--checkpoint_dir"));
  plan = PlanResume(dir + "/step_000005", dir, {});
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "which holds later step folders holding no checkpoint one can "
                                "read (step_000006) that this run's saves"))
      << plan.status();
  EXPECT_TRUE(absl::StrContains(PlanResume("", dir, {}).status().message(),
                                "which this run's saves would replace, and later step folders "
                                "with no checkpoint one can read (step_000006): repair or move "
                                "those aside before resuming it"))
      << PlanResume("", dir, {}).status();
  fs::remove_all(dir + "/step_000006");
  EXPECT_TRUE(PlanResume(dir + "/step_000005", dir, {}).ok());
  fs::remove_all(dir + "/step_000007");
  fs::remove_all(dir + "/step_000005");
  EXPECT_TRUE(PlanResume(dir + "/step_000004", dir, {}).ok());
  EXPECT_TRUE(PlanResume("latest", dir, {}).ok());
  EXPECT_TRUE(PlanResume(dir, dir, {}).ok());
  // Another folder's checkpoint into a folder of checkpoints: refused as a
  // fresh start is; into a new folder, or saving nothing: accepted.
  plan = PlanResume(other + "/step_000001", dir, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StartsWith(
      plan.status().message(),
      absl::StrCat("--resume=", other, "/step_000001 is a checkpoint of another folder: "
                   "--checkpoint_dir=", dir, " holds an earlier run's checkpoints (latest: "
                   "step_000004)")))
      << plan.status();
  EXPECT_TRUE(PlanResume(other + "/step_000001", dir + "_new", {}).ok());
  EXPECT_TRUE(PlanResume(dir + "/step_000002", "", {}).ok());
  // A restart of the job whose earlier attempt locked the folder (the lock
  // names its launch): its own latest checkpoint, said in the note when it
  // is not the one --resume names.
  std::ofstream(dir + "/.lock") << "pid 1 on host h for launch 42-7\n";
  EXPECT_EQ(LockedForLaunch(dir), "42-7");
  const JobAttempt restarted{1, "42-7"};
  for (const std::string& given : {other + "/step_000001", dir + "/step_000002"}) {
    plan = PlanResume(given, dir, restarted);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->resume, "latest");
    EXPECT_EQ(plan->note, absl::StrCat("restart 1 of this job: continuing ", dir,
                                       "'s latest checkpoint, not --resume=", given,
                                       " (where its first attempt started)"));
  }
  plan = PlanResume(dir + "/step_000004", dir, restarted);  // the same checkpoint: no note
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->note, "");
  // Not this launch's folder (another launch locked it, even of a run of the
  // same id; the first attempt; no launch known), or a lock that names none:
  // the checks, and refusal, saying what a restart wants.
  for (const JobAttempt& a : {JobAttempt{1, "43-9"}, JobAttempt{0, "42-7"}, JobAttempt{1, ""}}) {
    const absl::Status s = PlanResume(other + "/step_000001", dir, a).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << a.restart << " " << a.launch;
    EXPECT_EQ(absl::StrContains(s.message(), "--resume=auto continues what its earlier"),
              a.restart > 0)
        << s;
  }
  std::ofstream(dir + "/.lock") << "pid 1 on host h\n";
  EXPECT_EQ(LockedForLaunch(dir), "");
  EXPECT_EQ(PlanResume(other + "/step_000001", dir, JobAttempt{1, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  plan = PlanResume(other + "/step_000001", dir + "_empty", restarted);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->resume, other + "/step_000001");
  EXPECT_EQ(plan->note, "");
}

// The launch a restart knows its own checkpoints by: //tools:launch's
// LAUNCH_ID, else torchrun's agent folder for the run (from its error file).
TEST(JobAttemptTest, TheLaunchFromTheLaunchersVariables) {
  for (const char* v : {"RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "LAUNCH_ID",
                        "TORCHELASTIC_ERROR_FILE"}) {
    ::unsetenv(v);
  }
  EXPECT_EQ(JobAttemptFromEnvironment().restart, 0);
  EXPECT_EQ(JobAttemptFromEnvironment().launch, "");
  ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  ::setenv("TORCHELASTIC_ERROR_FILE", "/tmp/torchelastic_a1/none_b2/attempt_2/0/error.json", 1);
  EXPECT_EQ(JobAttemptFromEnvironment().restart, 2);
  EXPECT_EQ(JobAttemptFromEnvironment().launch, "/tmp/torchelastic_a1/none_b2");
  ::setenv("RESTART_COUNT", "", 1);  // empty: unset
  ::setenv("LAUNCH_ID", "42-7", 1);
  EXPECT_EQ(JobAttemptFromEnvironment().restart, 2);
  EXPECT_EQ(JobAttemptFromEnvironment().launch, "42-7");
  for (const char* v : {"RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "LAUNCH_ID",
                        "TORCHELASTIC_ERROR_FILE"}) {
    ::unsetenv(v);
  }
}

}  // namespace
}  // namespace train
