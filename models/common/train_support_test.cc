// Single-process checkpoints load without holding the files: the model is
// read into its parameters and the optimizer state becomes the buffers read,
// so a rank's load peaks at the optimizer state (not model + 2 x state), and
// the loaded run equals the saved one.
#include "models/common/train_support.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/common/train_support_testing.h"
#include "models/data/loader_state.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/state_dict.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/memory_ledger.h"
#include "tensor/safetensors.h"
#include "tensor/testing.h"

namespace train {
namespace {

// Every parameter of `a` and `b` holds the same values, bit for bit.
void ExpectSameParameters(mingpt::GPT& a, mingpt::GPT& b) {
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(tensor::testing::AllClose(pa[i].second->value, pb[i].second->value, 0, 0))
        << pa[i].first;
  }
}

TEST(LoadCheckpointTest, ReadsIntoTheModelAndAdoptsTheStateRead) {
  TrainState state;
  state.loader_state = "x";
  testing::SavedRun saved =
      testing::SaveAfterOneStep(testing::SmallConfig(), ::testing::TempDir() + "/load_checkpoint", state);

  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  mingpt::GPT model(testing::SmallConfig());
  model.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  const tensor::Device cpu = tensor::Device::Cpu();
  const int64_t before = ledger.Total(cpu).current;
  ledger.ResetPeaks();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(saved.step_dir, model, *fresh);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  EXPECT_EQ(loaded->loader_state, "x");
  const int64_t state_bytes = fresh->StateBytes();
  EXPECT_EQ(state_bytes, 8 * model.NumParameters());
  // The state read, plus the step counts (one i64 tensor per parameter).
  EXPECT_LE(ledger.Total(cpu).peak - before, state_bytes + 8 * 64 + 4096);
  EXPECT_EQ(ledger.Stats(cpu, tensor::MemoryCategory::kOptimizerState).current, state_bytes);

  // One more step of each equals.
  testing::StepBoth(saved, model, *fresh);
  ExpectSameParameters(*saved.model, model);
}

// A step folder whose optimizer.safetensors was removed (the model kept
// alone) does not resume with a fresh optimizer: it is refused naming
// --init_from, and the model is left as it was.
TEST(LoadCheckpointTest, TheModelAloneIsRefusedNamingInitFrom) {
  testing::SavedRun saved =
      testing::SaveAfterOneStep(testing::SmallConfig(), ::testing::TempDir() + "/load_model_only", TrainState{});
  ASSERT_TRUE(std::filesystem::remove(saved.step_dir + "/optimizer.safetensors"));
  mingpt::GPT model(testing::SmallConfig()), untouched(testing::SmallConfig());
  model.Materialize(2);
  untouched.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(saved.step_dir, model, *fresh);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(loaded.status().message().find(
                "holds the model alone (model.safetensors, no optimizer.safetensors: removed on "
                "purpose, or a copy cut short: if so, copy it again): it cannot be resumed"),
            std::string::npos)
      << loaded.status();
  EXPECT_NE(loaded.status().message().find("--init_from=" + saved.step_dir +
                                           " and a new --checkpoint_dir"),
            std::string::npos);
  ExpectSameParameters(untouched, model);
}

// Resuming with another optimizer (or SGD without momentum where the run had
// it) names both, before anything is read into the model.
TEST(LoadCheckpointTest, AnotherOptimizersStateIsNamedAndNothingIsRead) {
  testing::SavedRun saved = testing::SaveAfterOneStep(
      testing::SmallConfig(), ::testing::TempDir() + "/load_other_optimizer", TrainState{});
  mingpt::GPT model(testing::SmallConfig()), untouched(testing::SmallConfig());
  model.Materialize(2);
  untouched.Materialize(2);
  optim::SgdOptions o;
  for (double momentum : {0.9, 0.0}) {
    o.momentum = momentum;
    auto sgd = optim::SGD::Create(o).value();
    absl::StatusOr<TrainState> loaded = LoadCheckpoint(saved.step_dir, model, *sgd);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(loaded.status().message().find(absl::StrCat(
                  "the checkpoint's optimizer state is adamw (exp_avg, exp_avg_sq) but this "
                  "run's optimizer is sgd (",
                  momentum > 0 ? "momentum_buffer" : "", ")")),
              std::string::npos)
        << loaded.status();
    EXPECT_EQ(sgd->StateBytes(), 0);
  }
  ExpectSameParameters(untouched, model);
}

// Optimizer state whose entries fail their checks (a bf16 buffer) is found
// before the weights are read: the model stays as it was.
TEST(LoadCheckpointTest, BadOptimizerStateLeavesTheModelAsItWas) {
  namespace fs = std::filesystem;
  testing::SavedRun saved = testing::SaveAfterOneStep(
      testing::SmallConfig(), ::testing::TempDir() + "/load_bad_state", TrainState{});
  // The same checkpoint with one exp_avg entry in bf16.
  const std::string bad_dir = ::testing::TempDir() + "/load_bad_state_bf16";
  fs::remove_all(bad_dir);
  fs::create_directories(bad_dir);
  tensor::NamedTensors state = saved.optimizer->StateTensors();
  for (auto& [name, t] : state) {
    if (absl::EndsWith(name, ".exp_avg")) {
      t = t.To(tensor::Dtype::kBF16);
      break;
    }
  }
  TrainState train_state;
  train_state.step = 1;
  ASSERT_TRUE(WriteCheckpointFiles(bad_dir, nn::StateDict(*saved.model), state,
                                   saved.optimizer->name(), train_state)
                  .ok());
  mingpt::GPT model(testing::SmallConfig()), untouched(testing::SmallConfig());
  model.Materialize(2);
  untouched.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(bad_dir, model, *fresh);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("is bf16 on cpu, expected f32 on cpu"),
            std::string::npos)
      << loaded.status();
  EXPECT_EQ(fresh->StateBytes(), 0);
  ExpectSameParameters(untouched, model);
}

// A step folder whose two files come from different saves (the optimizer
// state copied from another step) is refused naming both checkpoint ids,
// before anything is loaded; files without ids (written before them) load.
TEST(LoadCheckpointTest, FilesOfDifferentSavesAreRefused) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/load_two_saves";
  testing::SavedRun saved = testing::SaveAfterOneStep(testing::SmallConfig(), dir, TrainState{});
  TrainState two;
  two.step = 2;
  ASSERT_TRUE(SaveCheckpoint(dir, *saved.model, *saved.optimizer, two).ok());
  const std::string step2 = dir + "/" + CheckpointStepName(2);
  fs::copy_file(saved.step_dir + "/optimizer.safetensors", step2 + "/optimizer.safetensors",
                fs::copy_options::overwrite_existing);
  mingpt::GPT model(testing::SmallConfig()), untouched(testing::SmallConfig());
  model.Materialize(2);
  untouched.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(step2, model, *fresh);
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_TRUE(absl::StartsWith(loaded.status().message(),
                               absl::StrCat("checkpoint ", step2, ": model.safetensors and "
                                            "optimizer.safetensors are of different saves "
                                            "(checkpoint ids ")))
      << loaded.status();
  EXPECT_EQ(fresh->StateBytes(), 0);
  ExpectSameParameters(untouched, model);
  // The same two files without their ids, as saves before the ids wrote them: loaded.
  const std::string old = dir + "/old";
  fs::create_directories(old);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string path = step2 + "/" + file;
    absl::StatusOr<tensor::SafetensorsHeader> h = tensor::ReadSafetensorsHeader(path);
    ASSERT_TRUE(h.ok()) << h.status();
    tensor::NamedTensors entries;
    for (const tensor::SafetensorsEntry& e : h->entries) {
      entries.emplace_back(e.name, tensor::ReadSafetensorsEntry(path, *h, e).value());
    }
    std::map<std::string, std::string> metadata = h->metadata;
    metadata.erase(kCheckpointIdKey);
    ASSERT_TRUE(tensor::WriteSafetensors(old + "/" + file, entries, metadata).ok());
  }
  loaded = LoadCheckpoint(old, model, *fresh);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

// --resume=latest in one process: the saved step's state and loader
// position, the weights loaded; a corrupt file and another model's
// checkpoint are errors naming what was wrong.
TEST(ResumeCheckpointTest, LoadsTheLatestStepAndNamesWhatIsWrong) {
  const std::string dir = ::testing::TempDir() + "/resume_checkpoint";
  data::LoaderState position;
  position.step = 3;
  position.config = "rows";
  TrainState state;
  state.loader_state = position.ToString();
  state.extra["config"] = "tiny";
  testing::SavedRun saved = testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);

  mingpt::GPT model(testing::SmallConfig());
  model.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  absl::StatusOr<Resumed> resumed = ResumeCheckpoint("latest", dir, model, *fresh, "tiny");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state.step, 1);
  EXPECT_EQ(resumed->loader.step, 3);
  EXPECT_EQ(resumed->loader.config, "rows");
  ExpectSameParameters(*saved.model, model);

  absl::StatusOr<Resumed> other = ResumeCheckpoint("latest", dir, model, *fresh, "another");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("is of model tiny, not another"), std::string::npos)
      << other.status();

  // The folder renamed to another step's name: refused (this run would save
  // that step over it), naming the name it should have.
  const std::string renamed = dir + "/step_000008";
  std::filesystem::rename(saved.step_dir, renamed);
  // (Elsewhere than the run's --checkpoint_dir, its saves go elsewhere: resumed.)
  EXPECT_TRUE(ResumeCheckpoint(renamed, "", model, *fresh, "tiny").ok());
  absl::StatusOr<Resumed> misnamed = ResumeCheckpoint(renamed, dir, model, *fresh, "tiny");
  EXPECT_EQ(misnamed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(
      misnamed.status().message(),
      absl::StrCat("checkpoint ", renamed, " holds step 1, but its folder is named step_000008 "
                   "(renamed, or another step's files copied in): resuming and saving step 8 "
                   "would replace it, or leave it to be taken for step 8; name it after its "
                   "step (mv -T ")))
      << misnamed.status();
  EXPECT_TRUE(absl::EndsWith(misnamed.status().message(),
                             "/resume_checkpoint/step_000001, if that name is free) and resume "
                             "that"))
      << misnamed.status();
  std::filesystem::rename(renamed, saved.step_dir);

  {  // a model file cut short
    const std::string file = saved.step_dir + "/model.safetensors";
    std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  }
  absl::StatusOr<Resumed> corrupt = ResumeCheckpoint("latest", dir, model, *fresh, "tiny");
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().message().rfind("--resume=latest: ", 0), 0) << corrupt.status();
  EXPECT_NE(corrupt.status().message().find("model.safetensors"), std::string::npos)
      << corrupt.status();
  EXPECT_NE(corrupt.status().message().find("(no other checkpoint in "), std::string::npos)
      << corrupt.status();
}

// A checkpoint of a model of other sizes is refused before any tensor is
// read, naming the fields that differ; one whose dropout or name alone
// differs is the same model and resumes.
TEST(ResumeCheckpointTest, AnotherModelIsRefusedNamingTheFieldsBeforeAnythingIsRead) {
  const std::string dir = ::testing::TempDir() + "/resume_another_model";
  TrainState state;
  state.loader_state = data::LoaderState().ToString();
  state.extra["config"] = testing::SmallConfig().ToString();
  testing::SavedRun saved = testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);

  mingpt::GPT model(testing::SmallConfig()), untouched(testing::SmallConfig());
  model.Materialize(2);
  untouched.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  mingpt::GptConfig bigger = testing::SmallConfig();
  bigger.n_layer = 3;
  bigger.n_embd = 48;
  absl::StatusOr<TrainState> loaded =
      LoadCheckpoint(saved.step_dir, model, *fresh, bigger.ToString());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(loaded.status().message(),
                                "(n_layer 2 there, 3 here; n_embd 32 there, 48 here); resume "
                                "with the model flags it was trained with"))
      << loaded.status();
  ExpectSameParameters(untouched, model);
  absl::StatusOr<Resumed> resumed = ResumeCheckpoint("latest", dir, model, *fresh,
                                                     bigger.ToString());
  EXPECT_FALSE(resumed.ok());
  ExpectSameParameters(untouched, model);

  mingpt::GptConfig other_dropout = testing::SmallConfig();
  other_dropout.dropout = 0.1f;
  other_dropout.name = "a-preset";
  resumed = ResumeCheckpoint("latest", dir, model, *fresh, other_dropout.ToString());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ExpectSameParameters(*saved.model, model);
  // What the resume changes is said (NoteRunSettingsChanges prints it).
  EXPECT_EQ(ResumedModelChanges(testing::SmallConfig().ToString(), other_dropout.ToString()),
            std::vector<std::string>{
                "the checkpoint was trained with dropout=0; continuing with dropout=0.1"});
  EXPECT_TRUE(ResumedModelChanges(testing::SmallConfig().ToString(), testing::SmallConfig().ToString()).empty());
}

// --resume of a checkpoint directory (what --checkpoint_dir names) resumes
// its latest step; a folder that is neither a step folder nor a checkpoint
// directory is refused naming the step folders it holds.
TEST(ResolveCheckpointTest, ACheckpointDirectoryResolvesToItsLatestStep) {
  const std::string dir = ::testing::TempDir() + "/resolve_directory";
  TrainState state;
  testing::SavedRun saved = testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);
  // (TempDir() ends in '/': the paths are compared normalized.)
  const std::string want = std::filesystem::path(saved.step_dir).lexically_normal().string();
  absl::StatusOr<std::string> step_dir = ResolveCheckpoint(dir, "");
  ASSERT_TRUE(step_dir.ok()) << step_dir.status();
  EXPECT_EQ(*step_dir, want);
  step_dir = ResolveCheckpoint(dir + "/", "");
  ASSERT_TRUE(step_dir.ok()) << step_dir.status();
  EXPECT_EQ(*step_dir, want);  // no "ck//step_000001"

  std::filesystem::remove(dir + "/latest");
  step_dir = ResolveCheckpoint(dir, "");
  ASSERT_FALSE(step_dir.ok());
  EXPECT_EQ(step_dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step_dir.status().message(),
            absl::StrCat("--resume=", dir, ": not a checkpoint (no model.safetensors or "
                         "index.json) nor a checkpoint directory (no 'latest' file naming a "
                         "step); it holds the step folders step_000001, newest first (resume one "
                         "with --resume=",
                         saved.step_dir, ")"));
  // A `latest` that names no step folder (empty, a folder, a path, control
  // characters) is said as such, with the step folders there.
  for (const std::string& content : {std::string(""), std::string("/elsewhere/step_000001"),
                                     std::string("step_000001\0junk", 16), std::string("..")}) {
    std::filesystem::remove_all(dir + "/latest");
    std::ofstream(dir + "/latest") << content;
    step_dir = ResolveCheckpoint("latest", dir);
    EXPECT_EQ(step_dir.status().code(), absl::StatusCode::kDataLoss) << content;
    EXPECT_EQ(step_dir.status().message(),
              absl::StrCat("--resume=latest: '", dir, "/latest' names no step folder (it is "
                           "empty, cannot be read, or holds something else than a folder name "
                           "such as step_000100); the other checkpoints in ",
                           std::filesystem::path(dir).lexically_normal().string(),
                           ", newest first: step_000001 (resume one with --resume=", want, ")"))
        << absl::CEscape(content);
  }
  std::filesystem::remove_all(dir + "/latest");
  std::filesystem::create_directories(dir + "/latest");
  EXPECT_EQ(ResolveCheckpoint("latest", dir).status().code(), absl::StatusCode::kDataLoss);
}

// A step folder whose files are missing is still taken as one: loading it
// names the missing file and the checkpoints beside it.
TEST(ResolveCheckpointTest, AStepFolderWithoutItsFilesIsLeftToTheLoad) {
  const std::string dir = ::testing::TempDir() + "/resolve_damaged";
  TrainState state;
  testing::SavedRun saved = testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);
  std::filesystem::remove(saved.step_dir + "/model.safetensors");
  absl::StatusOr<std::string> step_dir = ResolveCheckpoint(saved.step_dir, "");
  ASSERT_TRUE(step_dir.ok()) << step_dir.status();
  EXPECT_EQ(*step_dir, saved.step_dir);
  mingpt::GPT model(testing::SmallConfig());
  model.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  absl::StatusOr<Resumed> resumed = ResumeCheckpoint(saved.step_dir, "", model, *fresh, "");
  ASSERT_FALSE(resumed.ok());
  EXPECT_TRUE(absl::StrContains(resumed.status().message(), "model.safetensors"))
      << resumed.status();
  EXPECT_TRUE(absl::StrContains(resumed.status().message(), "(no other checkpoint in "))
      << resumed.status();
}

// Resuming an earlier step of --checkpoint_dir points `latest` at it (a
// --resume=latest before this run's first save continues it, not the run it
// branched off); another folder, or the step latest names, changes nothing.
TEST(PointLatestAtResumedTest, AnEarlierStepOfTheDirectoryBecomesLatest) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/point_latest";
  const std::string other = ::testing::TempDir() + "/point_latest_other";
  for (const std::string& d : {dir + "/step_000100", dir + "/step_000200", other + "/step_000100"}) {
    fs::create_directories(d);
  }
  const auto latest = [&] {
    std::ifstream f(dir + "/latest");
    std::string name;
    f >> name;
    return name;
  };
  const auto point = [&](const std::string& checkpoint_dir, const std::string& step_dir,
                         int64_t step) {
    Resumed resumed;
    resumed.state.step = step;
    resumed.step_dir = step_dir;
    ::testing::internal::CaptureStdout();
    PointLatestAtResumed(checkpoint_dir, resumed);
    return ::testing::internal::GetCapturedStdout();
  };
  ASSERT_TRUE(SetLatestCheckpoint(dir, 200).ok());
  EXPECT_EQ(point(dir, dir + "/step_000200", 200), "");    // the latest itself
  EXPECT_EQ(point(dir, other + "/step_000100", 100), "");  // another directory's
  EXPECT_EQ(point("", dir + "/step_000100", 100), "");     // no --checkpoint_dir
  EXPECT_EQ(latest(), "step_000200");
  EXPECT_EQ(point(dir, dir + "/step_000100/", 100),
            dir + "/latest now names step_000100, the step this run continues (it named "
                  "step_000200, which stays on disk)\n");
  EXPECT_EQ(latest(), "step_000100");
  EXPECT_TRUE(fs::exists(dir + "/step_000200"));
  EXPECT_EQ(point(dir, dir + "/step_000100", 100), "");
  // After a resume with nothing left to train (--steps at the resumed step):
  // `latest` moves forward to a newer step resumed (auto took a step folder
  // after it), never back.
  const auto after = [&](const std::string& step_dir, int64_t step) {
    Resumed resumed;
    resumed.state.step = step;
    resumed.step_dir = step_dir;
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    AfterResume(dir, resumed, /*steps=*/step);
    ::testing::internal::GetCapturedStderr();
    return ::testing::internal::GetCapturedStdout();
  };
  after(dir + "/step_000200", 200);
  EXPECT_EQ(latest(), "step_000200");
  after(dir + "/step_000100", 100);
  EXPECT_EQ(latest(), "step_000200");
  // ... and off a step that is gone.
  ASSERT_TRUE(SetLatestCheckpoint(dir, 300).ok());
  after(dir + "/step_000200", 200);
  EXPECT_EQ(latest(), "step_000200");
}

// A damaged checkpoint's error names the others beside it, newest first, and
// how to resume the newest; other failures only get the --resume prefix.
TEST(ResumeFailureTest, NamesTheOtherCheckpointsWhenTheFilesAreDamaged) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "resume_failure";
  fs::remove_all(dir);
  const auto touch = [](const fs::path& file) {
    fs::create_directories(file.parent_path());
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr) << file;
    std::fclose(f);
  };
  touch(dir / "step_000002" / "model.safetensors");  // one process / DDP
  touch(dir / "step_000002" / "optimizer.safetensors");
  touch(dir / "step_000010" / "index.json");         // sharded
  touch(dir / "step_000004" / "model.safetensors");  // the damaged one
  touch(dir / "step_000006" / "notes.txt");          // not a checkpoint
  touch(dir / "step_x" / "model.safetensors");       // not a step
  const std::string failed = (dir / "step_000004").string();
  const absl::Status damaged = absl::DataLossError("'m' is not a valid safetensors file");

  absl::Status s = ResumeFailure(damaged, "latest", failed);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            absl::StrCat("--resume=latest: 'm' is not a valid safetensors file; the other "
                         "checkpoints in ",
                         dir.string(), ", newest first: step_000010, step_000002 (resume one with "
                         "--resume=",
                         (dir / "step_000010").string(), ")"));
  // A trailing slash names the same folder.
  EXPECT_EQ(ResumeFailure(damaged, "x", failed + "/").message().find("step_000004"),
            std::string::npos);

  s = ResumeFailure(absl::InvalidArgumentError("shape differs"), "latest", failed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--resume=latest: shape differs");
  // A file missing (a shard not visible on this node; a file that cannot be
  // opened) names them too.
  for (const absl::Status& missing :
       {absl::NotFoundError("no shard file"), absl::UnavailableError("cannot open")}) {
    s = ResumeFailure(missing, "latest", failed);
    EXPECT_EQ(s.code(), missing.code());
    EXPECT_NE(s.message().find("newest first: step_000010, step_000002"), std::string::npos)
        << s.message();
  }
  // A model-only folder (no optimizer.safetensors) is listed as such; the
  // resume suggested is the newest with its optimizer state.
  touch(dir / "step_000012" / "model.safetensors");
  s = ResumeFailure(damaged, "latest", failed);
  EXPECT_NE(s.message().find(absl::StrCat("newest first: step_000012 (model only), step_000010, "
                                          "step_000002 (resume one with --resume=",
                                          (dir / "step_000010").string(), ")")),
            std::string::npos)
      << s.message();
  // Not resuming (a tool reading the directory): no resume suggested.
  EXPECT_EQ(OtherCheckpointsNote(failed, /*resuming=*/false),
            absl::StrCat("; the other checkpoints in ", dir.string(), ", newest first: "
                         "step_000012 (model only), step_000010, step_000002"));
}

// `latest` naming a folder that is gone: DataLoss naming it and the other
// checkpoints; when a save was interrupted between moving the previous copy
// aside and renaming the new one into place (a filesystem without
// RENAME_EXCHANGE), the error names that copy and how to put it back.
TEST(ResolveCheckpointTest, AMissingFolderNamesTheCopyAnInterruptedSaveLeft) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "resolve_missing";
  fs::remove_all(dir);
  fs::create_directories(dir / "step_000002");
  std::ofstream(dir / "step_000002" / "model.safetensors") << "x";
  ASSERT_TRUE(SetLatestCheckpoint(dir.string(), 4).ok());
  absl::StatusOr<std::string> r = ResolveCheckpoint("latest", dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("latest names step_000004, which is missing; the other "
                                      "checkpoints in"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("step_000002"), std::string::npos) << r.status();

  const fs::path aside = dir / "step_000004.old-123";
  fs::create_directories(aside);
  std::ofstream(aside / "index.json") << "{}";
  for (const std::string& resume : {std::string("latest"), (dir / "step_000004").string()}) {
    r = ResolveCheckpoint(resume, dir.string());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(absl::StrCat(
                  "a save of it was interrupted after moving the previous copy aside: ",
                  aside.string(), " holds it; put it back with `mv ", aside.string(), " ",
                  (dir / "step_000004").string(), "`")),
              std::string::npos)
        << r.status();
  }
  fs::rename(aside, dir / "step_000004");
  r = ResolveCheckpoint("latest", dir.string());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (dir / "step_000004").string());
}

// What saves killed midway left is named with its size (temporaries, a
// copy moved aside once its step folder is back), never removed; a copy
// moved aside whose step folder is missing is the checkpoint, not a leftover.
TEST(PrepareCheckpointDirTest, NamesWhatInterruptedSavesLeft) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "leftovers";
  fs::remove_all(dir);
  fs::create_directories(dir / "step_000002");
  fs::create_directories(dir / "step_000004.tmp-99");
  std::ofstream(dir / "step_000004.tmp-99" / "model.safetensors") << std::string(2 * 1048576, 'x');
  fs::create_directories(dir / "step_000002.old-7");
  fs::create_directories(dir / "step_000006.old-8");  // step_000006 is missing: the survivor
  fs::create_directories(dir / "notes.tmp-1");         // not a step's
  EXPECT_EQ(LeftoversOfInterruptedSaves(dir.string()),
            dir.string() + " holds folders interrupted saves left, which nothing reads: "
                           "step_000002.old-7 (0.0 MiB), step_000004.tmp-99 (2.0 MiB); remove "
                           "them (rm -r) once no other run saves into it");
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(PrepareCheckpointDir(dir.string()).ok());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("train: warning: --checkpoint_dir: "),
            std::string::npos);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(PrepareCheckpointDir(dir.string(), /*report_leftovers=*/false).ok());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_TRUE(fs::exists(dir / "step_000004.tmp-99" / "model.safetensors"));
  EXPECT_EQ(LeftoversOfInterruptedSaves((dir / "step_000002").string()), "");
}

// A sharded checkpoint given to the single-process load says what it is and
// how to resume it, instead of a missing model.safetensors.
TEST(LoadCheckpointTest, AShardedCheckpointSaysHowToResumeIt) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "load_sharded" / "step_000003";
  fs::create_directories(dir);
  std::ofstream(dir / "index.json") << "{}";
  mingpt::GPT model(testing::SmallConfig());
  model.Materialize(3);
  auto opt = optim::AdamW::Create({}).value();
  absl::StatusOr<TrainState> state = LoadCheckpoint(dir.string(), model, *opt);
  ASSERT_FALSE(state.ok());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("is sharded (index.json: saved by FSDP or ZeRO-1); "
                                          "resume it with an FSDP strategy"),
            std::string::npos)
      << state.status();
  EXPECT_NE(state.status().message().find("checkpoint consolidate"), std::string::npos);
}

// Saving a step again replaces its folder as a whole (another run's files,
// a sharded checkpoint's index, go with it) and leaves no temporary folder; a
// folder holding something else is refused, untouched.
TEST(SaveCheckpointTest, ASavedStepReplacesTheFolderAsAWhole) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/save_replaces";
  fs::remove_all(dir);
  mingpt::GPT model(testing::SmallConfig());
  model.Materialize(3);
  auto opt = optim::AdamW::Create({}).value();
  TrainState state;
  state.step = 5;
  state.loader_state = "first";
  ASSERT_TRUE(SaveCheckpoint(dir, model, *opt, state).ok());
  const std::string step_dir = dir + "/step_000005";
  { std::ofstream(step_dir + "/index.json") << "{}"; }  // as a sharded save left it
  state.loader_state = "second";
  ASSERT_TRUE(SaveCheckpoint(dir, model, *opt, state).ok());
  EXPECT_FALSE(fs::exists(step_dir + "/index.json"));
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(step_dir, model, *opt);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->loader_state, "second");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_000005"}));

  { std::ofstream(step_dir + "/notes.txt") << "mine"; }
  absl::Status refused = SaveCheckpoint(dir, model, *opt, state);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("it holds 'notes.txt'"), std::string::npos) << refused;
  EXPECT_TRUE(fs::exists(step_dir + "/notes.txt"));
  EXPECT_TRUE(fs::exists(step_dir + "/model.safetensors"));
  // A user's copy named after a checkpoint file is not one (a writer's
  // "model.safetensors.tmp.<pid>" is).
  fs::remove(step_dir + "/notes.txt");
  { std::ofstream(step_dir + "/model.safetensors.bak") << "mine"; }
  refused = SaveCheckpoint(dir, model, *opt, state);
  EXPECT_NE(refused.message().find("it holds 'model.safetensors.bak'"), std::string::npos)
      << refused;
  EXPECT_TRUE(fs::exists(step_dir + "/model.safetensors.bak"));
  fs::remove(step_dir + "/model.safetensors.bak");
  { std::ofstream(step_dir + "/optimizer.safetensors.tmp.77") << "half"; }
  EXPECT_TRUE(SaveCheckpoint(dir, model, *opt, state).ok());
}

TEST(InitFromLineTest, SaysWhenOnlyTheConfigurationIsTaken) {
  EXPECT_EQ(InitFromLine("Hugging Face T5 /m", false), "init_from: Hugging Face T5 /m");
  EXPECT_EQ(InitFromLine("checkpoint /c (step 3)", true),
            "init_from: checkpoint /c (step 3) (its configuration; --resume loads the weights)");
}

TEST(CheckpointDueTest, EveryNStepsBeforeTheLast) {
  EXPECT_FALSE(CheckpointDue(0, 10, 100));  // 0: only the last step's
  EXPECT_TRUE(CheckpointDue(10, 10, 100));
  EXPECT_FALSE(CheckpointDue(10, 11, 100));
  EXPECT_FALSE(CheckpointDue(10, 100, 100));  // the last step's is saved as the last
}

}  // namespace
}  // namespace train
