// --resume decided before a train binary does anything else
// (train_support.h: PlanResume, ResolveAutoResume, CheckFreshCheckpointDir,
// the launch a job's attempt belongs to): what a --checkpoint_dir holds,
// what --resume=auto takes, and which resumes would replace checkpoints.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/common/checkpoint_dir.h"
#include "models/common/train_support.h"

namespace train {

namespace {

// What a --checkpoint_dir holds, as --resume=auto and a fresh start see it.
struct CheckpointDirContents {
  std::string latest;          // what `latest` names; "" without one
  bool latest_holds = false;   // it names a checkpoint
  bool latest_aside = false;   // it names a step whose save was interrupted with its copy
                               // set aside (InterruptedSaveNote: how to put it back)
  std::vector<std::string> steps;  // step folders holding a checkpoint, newest first
  // "step_N" entries holding no checkpoint one can read (not a folder, a
  // folder that cannot be read, one that lost its index): not empty, so
  // perhaps of value; newest first.
  std::vector<std::string> unusable;
};

CheckpointDirContents ReadCheckpointDir(const std::string& checkpoint_dir) {
  namespace fs = std::filesystem;
  CheckpointDirContents c;
  c.latest = LatestStepName(checkpoint_dir);
  if (!c.latest.empty()) {
    const std::string latest_dir = (fs::path(checkpoint_dir) / c.latest).string();
    c.latest_holds = HoldsCheckpoint(latest_dir);
    c.latest_aside = !c.latest_holds && !InterruptedSaveNote(latest_dir).empty();
  }
  // One listing for both lists: (step, name), sorted newest first.
  std::vector<std::pair<int64_t, std::string>> steps, unusable;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoint_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = StepOfName(name);
    if (step < 0) continue;
    if (HoldsCheckpoint(it->path().string())) {
      steps.emplace_back(step, name);
      continue;
    }
    std::error_code inner;
    if (it->is_directory(inner) && fs::is_empty(it->path(), inner) && !inner) continue;
    unusable.emplace_back(step, name);
  }
  for (auto [list, names] : {std::pair{&steps, &c.steps}, std::pair{&unusable, &c.unusable}}) {
    std::sort(list->rbegin(), list->rend());
    for (const auto& [step, name] : *list) names->push_back(name);
  }
  return c;
}

// The newest checkpoint of `c` one can read: `latest`'s (also when it names
// no step_N folder) unless a later step folder holds one.
struct Newest {
  std::string name;        // c.latest or c.steps.front(); "" when there is none
  bool is_latest = false;  // it is what `latest` names
  int64_t after = -1;      // the step whose later folders count as newer
};
Newest NewestCheckpoint(const CheckpointDirContents& c) {
  const int64_t latest_step = c.latest_holds ? StepOfName(c.latest) : -1;
  const int64_t newest = c.steps.empty() ? -1 : StepOfName(c.steps.front());
  Newest n;
  n.after = std::max(latest_step, newest);
  if (c.latest_holds && (latest_step < 0 || latest_step >= newest)) {
    n.name = c.latest;
    n.is_latest = true;
  } else if (newest >= 0) {
    n.name = c.steps.front();
  }
  return n;
}

// The folders of `c` after step `step` that hold no checkpoint one can read
// (CheckpointDirContents::unusable), oldest first.
std::vector<std::string> UnusableAfter(const CheckpointDirContents& c, int64_t step) {
  std::vector<std::string> after;
  for (const std::string& name : c.unusable) {
    if (StepOfName(name) > step) after.insert(after.begin(), name);
  }
  return after;
}

// What is wrong with step folder `path`, which holds no checkpoint one can
// read: for an error that names it.
std::string WhyUnusable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return absl::StrCat(path, " is not a folder");
  if (const std::string lost = ShardsWithoutIndex(path); !lost.empty()) return lost;
  fs::directory_iterator it(path, ec);
  if (ec) return absl::StrCat(path, " cannot be read: ", ec.message());
  return absl::StrCat(path, " holds neither model.safetensors nor index.json");
}

// ResolveAutoResume's choice for auto, from the folder's contents.
absl::StatusOr<std::string> AutoResume(const std::string& checkpoint_dir,
                                       const CheckpointDirContents& c) {
  namespace fs = std::filesystem;
  // The newest checkpoint: `latest`'s, or a later step folder's (a save
  // interrupted before `latest` was pointed at it, or a `latest` set back);
  // a save of `latest`'s step that was interrupted and can be put back is
  // refused, saying how; without either, the newest step folder (a run
  // killed between its first save's folder and `latest`, or a `latest`
  // naming a step that is gone); else a fresh start.
  if (c.latest_aside) return ResolveCheckpoint("latest", checkpoint_dir).status();
  const Newest newest = NewestCheckpoint(c);
  // A later step folder holding no checkpoint one can read is not passed
  // over: this run's saves would replace it.
  const std::vector<std::string> unusable = UnusableAfter(c, newest.after);
  if (!unusable.empty()) {
    const std::string readable =
        newest.name.empty()
            ? std::string("any checkpoint one can read (there is none)")
            : absl::StrCat("its newest checkpoint one can read (", newest.name, ")");
    std::vector<std::string> why, moves;
    for (const std::string& name : unusable) {
      const std::string path = (fs::path(checkpoint_dir) / name).string();
      why.push_back(WhyUnusable(path));
      moves.push_back(absl::StrCat("mv -T ", path, " ", path, ".unusable"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume=auto: ", checkpoint_dir, " holds ", absl::StrJoin(unusable, ", "),
        ", later than ", readable, ", which this run's saves would replace or fail on: ",
        absl::StrJoin(why, "; "), "; repair them, or move them aside (",
        absl::StrJoin(moves, "; "), ")"));
  }
  if (newest.is_latest) return "latest";
  if (!newest.name.empty()) return (fs::path(checkpoint_dir) / newest.name).string();
  return "";
}

// CheckFreshCheckpointDir's verdict, from the folder's contents.
absl::Status FreshCheckpointDir(const std::string& checkpoint_dir,
                                const CheckpointDirContents& c) {
  if (c.latest_aside) {
    return ResolveCheckpoint("latest", checkpoint_dir).status();  // put it back first
  }
  // A dangling latest holds nothing.
  if (!c.latest_holds && c.steps.empty() && c.unusable.empty()) return absl::OkStatus();
  if (!c.latest_holds && c.steps.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_dir=", checkpoint_dir, " holds step folders with no checkpoint one can "
        "read (", absl::StrJoin(c.unusable, ", "), "), which this run's saves would replace or "
        "fail on: repair or move them aside, or give this run a new --checkpoint_dir"));
  }
  // What --resume=auto would continue: `latest`, or a later step folder;
  // nothing while a later step folder holds no checkpoint one can read.
  const Newest newest = NewestCheckpoint(c);
  const std::vector<std::string> unusable = UnusableAfter(c, newest.after);
  const std::string held = absl::StrCat(
      "--checkpoint_dir=", checkpoint_dir, " holds an earlier run's checkpoints (",
      c.latest_holds ? absl::StrCat("latest: ", c.latest)
                     : absl::StrCat("step folders ", absl::StrJoin(c.steps, ", ")),
      "), which this run's saves would replace");
  if (!unusable.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        held, ", and later step folders with no checkpoint one can read (",
        absl::StrJoin(unusable, ", "), "): repair or move those aside before resuming it, or "
        "give this run a new --checkpoint_dir"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      held, ": continue that run with --resume=",
      newest.is_latest ? "latest" : (std::filesystem::path(checkpoint_dir) / newest.name).string(),
      " (--resume=auto resumes when there is a checkpoint and starts fresh when there is none, "
      "as a restarted job wants), or give this run a new --checkpoint_dir"));
}

}  // namespace

absl::StatusOr<std::string> ResolveAutoResume(const std::string& resume,
                                              const std::string& checkpoint_dir) {
  if (resume != "auto") return resume;
  if (checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--resume=auto needs --checkpoint_dir (it resumes that folder's latest checkpoint when "
        "there is one)");
  }
  return AutoResume(checkpoint_dir, ReadCheckpointDir(checkpoint_dir));
}

namespace {

// A --resume given (not auto), resolved to `step_dir`, against what
// checkpoint_dir holds (c): this run's saves must not replace another run's
// checkpoints there. A checkpoint of another folder starts this run's own
// checkpoints in checkpoint_dir, as a fresh start does (FreshCheckpointDir).
// One of checkpoint_dir's own steps (the one `latest` names too) is refused
// while any later step folder is there, holding a checkpoint or none one can
// read, so that checkpoint_dir keeps one history and nothing newer is
// replaced (a later step folder with a checkpoint: a save interrupted before
// `latest` was pointed at it, or a `latest` set back; --resume=auto takes
// it).
absl::Status CheckResumeReplacesNothing(const std::string& resume, const std::string& step_dir,
                                        const std::string& checkpoint_dir,
                                        const CheckpointDirContents& c) {
  namespace fs = std::filesystem;
  const auto [folder, parent] = FolderAndParent(step_dir);
  const std::string name = folder.filename().string();
  const int64_t resumed = StepOfName(name);
  std::error_code ec;
  const bool own = fs::equivalent(parent, checkpoint_dir, ec) && !ec && resumed >= 0;
  if (!own) {
    absl::Status fresh = FreshCheckpointDir(checkpoint_dir, c);
    if (fresh.ok()) return fresh;
    return absl::Status(fresh.code(),
                        absl::StrCat("--resume=", resume, " is a checkpoint of another folder: ",
                                     fresh.message()));
  }
  std::vector<std::string> later;  // oldest first
  for (const std::string& other : c.steps) {  // newest first
    if (StepOfName(other) > resumed) later.insert(later.begin(), other);
  }
  const std::vector<std::string> unusable = UnusableAfter(c, resumed);
  if (later.empty() && unusable.empty()) return absl::OkStatus();
  std::vector<std::string> moves;
  std::vector<std::string> all = later;
  all.insert(all.end(), unusable.begin(), unusable.end());
  for (const std::string& l : all) {
    const std::string path = (fs::path(checkpoint_dir) / l).string();
    moves.push_back(absl::StrCat("mv -T ", path, " ", path, ".before-resume"));
  }
  std::string held;
  if (!later.empty()) {
    std::vector<std::string> said;  // a model-only one said as such
    for (const std::string& l : later) said.push_back(SaidStepFolder(checkpoint_dir, l));
    absl::StrAppend(&held, "later checkpoints (", absl::StrJoin(said, ", "), ")");
  }
  if (!unusable.empty()) {
    absl::StrAppend(&held, later.empty() ? "" : " and ", "later step folders holding no "
                    "checkpoint one can read (", absl::StrJoin(unusable, ", "), ")");
  }
  // `latest` itself behind later step folders: it was set back, or a save
  // was interrupted before pointing it at its folder. (Not a model-only
  // newest: it does not resume.)
  const std::string newest =
      later.empty() || !UnusableAfter(c, StepOfName(later.back())).empty() ||
              IsModelOnly((fs::path(checkpoint_dir) / later.back()).string())
          ? ""
          : (fs::path(checkpoint_dir) / later.back()).string();
  return absl::InvalidArgumentError(absl::StrCat(
      "--resume=", resume, " goes back to step ", resumed, " of --checkpoint_dir=",
      checkpoint_dir, name == c.latest ? " (the step its latest names)" : "", ", which holds ",
      held, " that this run's saves, or a later --resume=latest, would replace: ",
      newest.empty() ? "" : absl::StrCat("resume the newest (--resume=", newest, "), or "),
      "move them aside first (", absl::StrJoin(moves, "; "),
      "), or give this run a new --checkpoint_dir"));
}

}  // namespace

absl::StatusOr<ResumePlan> PlanResume(const std::string& resume_flag,
                                      const std::string& checkpoint_dir,
                                      const JobAttempt& attempt) {
  ResumePlan plan;
  const bool automatic = resume_flag == "auto";
  // What checkpoint_dir holds, read once for every decision below.
  std::optional<CheckpointDirContents> contents;
  if (!checkpoint_dir.empty()) contents = ReadCheckpointDir(checkpoint_dir);
  if (!automatic && !resume_flag.empty()) {
    if (attempt.restart > 0 && contents.has_value() && !attempt.launch.empty() &&
        LockedForLaunch(checkpoint_dir) == attempt.launch) {
      // A restarted job continues what its earlier attempts saved: one of
      // them passed the checks below and locked the folder (the lock names
      // the launch), so its checkpoints are this job's.
      const std::string restarted = absl::StrCat("restart ", attempt.restart, " of this job");
      absl::StatusOr<std::string> own = AutoResume(checkpoint_dir, *contents);
      if (!own.ok()) {
        return absl::Status(own.status().code(),
                            absl::StrCat(restarted, ": continuing ", checkpoint_dir,
                                         "'s latest checkpoint: ", own.status().message()));
      }
      if (!own->empty()) {
        plan.resume = *own;
        // Said when it is not the checkpoint --resume names.
        const absl::StatusOr<std::string> given = ResolveCheckpoint(resume_flag, checkpoint_dir);
        const absl::StatusOr<std::string> taken = ResolveCheckpoint(*own, checkpoint_dir);
        std::error_code ec;
        if (!given.ok() || !taken.ok() || !std::filesystem::equivalent(*given, *taken, ec)) {
          plan.note = absl::StrCat(restarted, ": continuing ", checkpoint_dir,
                                   "'s latest checkpoint, not --resume=", resume_flag,
                                   " (where its first attempt started)");
        }
        return plan;
      }
    }
    // Found now, before the run reads data, builds the model or makes and
    // locks checkpoint_dir; loaded by the run (which resolves it again).
    absl::StatusOr<std::string> step_dir = ResolveCheckpoint(resume_flag, checkpoint_dir);
    if (!step_dir.ok()) return step_dir.status();
    if (contents.has_value()) {
      absl::Status replaces =
          CheckResumeReplacesNothing(resume_flag, *step_dir, checkpoint_dir, *contents);
      if (!replaces.ok()) {
        if (attempt.restart == 0) return replaces;
        return absl::Status(replaces.code(),
                            absl::StrCat(replaces.message(), " (restart ", attempt.restart,
                                         " of a job: --resume=auto continues what its earlier "
                                         "attempts saved)"));
      }
    }
    plan.resume = resume_flag;
    return plan;
  }
  if (!contents.has_value()) {
    if (automatic) return ResolveAutoResume(resume_flag, checkpoint_dir).status();  // its error
    return plan;  // a fresh start that saves nothing
  }
  if (automatic) {
    absl::StatusOr<std::string> resume = AutoResume(checkpoint_dir, *contents);
    if (!resume.ok()) return resume.status();
    plan.resume = *std::move(resume);
  }
  if (plan.resume.empty()) {
    absl::Status fresh = FreshCheckpointDir(checkpoint_dir, *contents);
    if (!fresh.ok()) return fresh;
    plan.auto_fresh = automatic;
  }
  return plan;
}

namespace {
// The variable's value; "" when unset or empty.
std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}
}  // namespace

JobAttempt JobAttemptFromEnvironment() {
  JobAttempt attempt;
  std::string count = Env("RESTART_COUNT");
  if (count.empty()) count = Env("TORCHELASTIC_RESTART_COUNT");
  if (!absl::SimpleAtoi(count, &attempt.restart) || attempt.restart < 0) attempt.restart = 0;
  attempt.launch = Env("LAUNCH_ID");
  const std::string error_file = Env("TORCHELASTIC_ERROR_FILE");
  if (attempt.launch.empty() && !error_file.empty()) {
    // torchrun's <log dir>/<run>_<random>/attempt_<n>/<local rank>/error.json:
    // the agent's folder for the run, the same for its restarts.
    attempt.launch = std::filesystem::path(error_file).parent_path().parent_path().parent_path();
  }
  return attempt;
}

std::string LockedForLaunch(const std::string& checkpoint_dir) {
  std::ifstream f(checkpoint_dir + "/.lock");
  std::string holder;
  std::getline(f, holder);
  const size_t at = holder.find(" for launch ");
  return at == std::string::npos ? "" : holder.substr(at + 12);
}

void PrintAutoFreshStart(const std::string& checkpoint_dir) {
  std::printf("--resume=auto: no checkpoint in %s yet: starting from step 0\n",
              checkpoint_dir.c_str());
}

absl::Status CheckFreshCheckpointDir(const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty()) return absl::OkStatus();
  return FreshCheckpointDir(checkpoint_dir, ReadCheckpointDir(checkpoint_dir));
}

}  // namespace train
