// Checkpoints for the train binaries: saving a step, and resuming one (the
// checkpoint directory's layout: checkpoint_dir.cc; deciding --resume before
// the run: resume_plan.cc; step lines and metrics: step_report.cc).
#include "models/common/train_support.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dist/sharded_checkpoint_folder.h"
#include "dist/sharded_checkpoint_index.h"
#include "nn/state_dict.h"
#include "tensor/durable_file.h"
#include "tensor/memory_ledger.h"
#include "tensor/safetensors.h"

namespace train {
namespace {

// Where a TrainState goes in a string map: model.safetensors' metadata, or a
// sharded checkpoint's `extra` map.
struct StateKeys {
  const char* step;
  const char* loader;
  const char* extra_prefix;  // + each TrainState::extra key
};
constexpr StateKeys kFileKeys = {"fsdp.step", "fsdp.loader_state", "fsdp.extra."};
constexpr StateKeys kShardedKeys = {"step", "loader_state", "extra."};

std::map<std::string, std::string> StateToMap(const TrainState& state, const StateKeys& keys) {
  std::map<std::string, std::string> m = {{keys.step, absl::StrCat(state.step)},
                                          {keys.loader, state.loader_state}};
  for (const auto& [k, v] : state.extra) m[keys.extra_prefix + k] = v;
  return m;
}

// False when the step is missing or not an integer (the callers name what).
bool StateFromMap(const std::map<std::string, std::string>& m, const StateKeys& keys,
                  TrainState* state) {
  auto step = m.find(keys.step);
  if (step == m.end() || !absl::SimpleAtoi(step->second, &state->step)) return false;
  auto loader = m.find(keys.loader);
  if (loader != m.end()) state->loader_state = loader->second;
  for (const auto& [k, v] : m) {
    absl::string_view key = k;
    if (absl::ConsumePrefix(&key, keys.extra_prefix)) state->extra[std::string(key)] = v;
  }
  return true;
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("cannot create directory '", path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir, nn::Module& model,
                            const optim::Optimizer& optimizer, const TrainState& state) {
  absl::Status s = WriteCheckpointStep(dir, model, optimizer, state);
  if (!s.ok()) return s;
  return SetLatestCheckpoint(dir, state.step);
}

absl::Status WriteCheckpointStep(const std::string& dir, nn::Module& model,
                                 const optim::Optimizer& optimizer, const TrainState& state) {
  absl::Status s = MakeDir(dir);
  if (!s.ok()) return s;
  const std::string step_dir = absl::StrCat(dir, "/", CheckpointStepName(state.step));
  s = dist::sharded::CheckReplaceable(step_dir);  // a checkpoint's files only, either format
  if (!s.ok()) return s;
  // Both files go into a temporary folder that then replaces the step's as a
  // whole: a crash leaves the old checkpoint or the new one, never one file
  // of each (a step saved again after resuming from an earlier one).
  const std::string tag = absl::StrCat(::getpid());
  const std::string tmp = absl::StrCat(step_dir, ".tmp-", tag);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);  // a crashed save's
  s = MakeDir(tmp);
  if (s.ok()) {
    std::vector<std::string> buffer_names;
    for (auto& [name, b] : model.NamedBuffers()) buffer_names.push_back(name);
    s = WriteCheckpointFiles(tmp, nn::StateDict(model), optimizer.StateTensors(),
                             optimizer.name(), state, buffer_names);
  }
  if (s.ok()) s = tensor::ReplaceFolderDurably(tmp, step_dir, tag);
  if (!s.ok()) std::filesystem::remove_all(tmp, ec);
  return s;
}

absl::Status WriteCheckpointFiles(const std::string& step_dir, const tensor::NamedTensors& model,
                                  const tensor::NamedTensors& optimizer_state,
                                  const std::string& optimizer_name, const TrainState& state,
                                  const std::vector<std::string>& buffer_names) {
  const std::string id = NewSaveId();
  std::map<std::string, std::string> metadata = CheckpointModelMetadata(state, id);
  if (!buffer_names.empty()) metadata[kBufferNamesKey] = absl::StrJoin(buffer_names, ",");
  absl::Status s =
      tensor::WriteSafetensors(step_dir + "/model.safetensors", model, metadata);
  if (!s.ok()) return s;
  return tensor::WriteSafetensors(step_dir + "/optimizer.safetensors", optimizer_state,
                                  CheckpointOptimizerMetadata(optimizer_name, id));
}

std::map<std::string, std::string> CheckpointModelMetadata(const TrainState& state,
                                                           const std::string& checkpoint_id) {
  std::map<std::string, std::string> metadata = StateToMap(state, kFileKeys);
  metadata[kCheckpointIdKey] = checkpoint_id;
  return metadata;
}

std::map<std::string, std::string> CheckpointOptimizerMetadata(const std::string& optimizer_name,
                                                               const std::string& checkpoint_id) {
  return {{"optimizer", optimizer_name}, {kCheckpointIdKey, checkpoint_id}};
}

std::string NewSaveId() { return dist::sharded::NewCheckpointId(); }

absl::Status CheckSameSave(const std::string& step_dir,
                           const std::map<std::string, std::string>& model_metadata,
                           const std::map<std::string, std::string>& optimizer_metadata) {
  const auto model_id = model_metadata.find(kCheckpointIdKey);
  const auto optimizer_id = optimizer_metadata.find(kCheckpointIdKey);
  const bool model_has = model_id != model_metadata.end();
  const bool optimizer_has = optimizer_id != optimizer_metadata.end();
  if (!model_has && !optimizer_has) return absl::OkStatus();  // written before the ids
  if (model_has && optimizer_has && model_id->second == optimizer_id->second) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(
      "checkpoint ", step_dir, ": model.safetensors and optimizer.safetensors are of different "
      "saves (checkpoint ids ", model_has ? model_id->second : "none", " and ",
      optimizer_has ? optimizer_id->second : "none",
      "): one was copied from another step or run, and resuming would pair one's weights with "
      "the other's optimizer state"));
}

namespace {

// The step folder <dir>/latest names, which must exist; errors name `latest`
// ("--resume=latest: " first when `resuming`) and the checkpoints beside it.
absl::StatusOr<std::string> LatestStepFolder(const std::string& dir, bool resuming) {
  const absl::string_view prefix = resuming ? "--resume=latest: " : "";
  std::error_code ec;
  const std::string name = LatestStepName(dir);
  if (name.empty()) {
    const std::string latest = dir + "/latest";
    if (!std::filesystem::exists(latest, ec)) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint to resume: '", latest, "' is missing"));
    }
    return absl::DataLossError(absl::StrCat(
        prefix, "'", latest, "' names no step folder (it is empty, cannot be read, or holds "
        "something else than a folder name such as step_000100)",
        OtherCheckpointsNote(latest, resuming)));
  }
  const std::string step_dir = absl::StrCat(dir, "/", name);
  if (!std::filesystem::is_directory(step_dir, ec)) {
    const std::string interrupted = InterruptedSaveNote(step_dir);
    return absl::DataLossError(absl::StrCat(
        prefix, dir, "/latest names ", name, ", which is missing",
        interrupted.empty() ? OtherCheckpointsNote(step_dir, resuming) : interrupted));
  }
  return step_dir;
}

}  // namespace

absl::StatusOr<std::string> StepFolderOf(const std::string& path) {
  std::error_code ec;
  if (HoldsCheckpoint(path) || !std::filesystem::is_directory(path, ec)) return path;
  if (!std::filesystem::exists(std::filesystem::path(path) / "latest", ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a checkpoint (no model.safetensors or index.json in it) nor a checkpoint "
        "directory (no 'latest' file)"));
  }
  absl::StatusOr<std::string> latest = LatestStepFolder(path, /*resuming=*/false);
  if (!latest.ok() || HoldsCheckpoint(*latest)) return latest;
  return absl::InvalidArgumentError(absl::StrCat(*latest, " (what ", path,
                                                 "/latest names) holds no checkpoint",
                                                 OtherCheckpointsNote(*latest, false)));
}

std::map<std::string, std::string> ShardedCheckpointExtra(const TrainState& state) {
  return StateToMap(state, kShardedKeys);
}

absl::StatusOr<TrainState> TrainStateFromShardedExtra(
    const std::map<std::string, std::string>& extra, const std::string& step_dir) {
  TrainState state;
  if (!StateFromMap(extra, kShardedKeys, &state) || state.step < 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, " lacks the training step ('",
                                            kShardedKeys.step, "')"));
  }
  return state;
}

namespace {

// The fields of a config string "name(key=value, key=value, ...)", in order;
// nullopt when it is not one.
std::optional<std::vector<std::pair<std::string, std::string>>> ConfigFields(
    absl::string_view config) {
  const size_t open = config.find('(');
  if (open == absl::string_view::npos || config.empty() || config.back() != ')') {
    return std::nullopt;
  }
  std::vector<std::pair<std::string, std::string>> fields;
  for (absl::string_view field :
       absl::StrSplit(config.substr(open + 1, config.size() - open - 2), ", ")) {
    const size_t eq = field.find('=');
    if (eq == absl::string_view::npos) return std::nullopt;
    fields.emplace_back(std::string(field.substr(0, eq)), std::string(field.substr(eq + 1)));
  }
  return fields;
}

}  // namespace

absl::Status SaveAndSay(const std::string& checkpoint_dir, int64_t step, bool log,
                        const std::function<absl::Status()>& save) {
  const absl::Time start = absl::Now();
  absl::Status saved = save();
  if (!saved.ok() || !log) return saved;
  const std::string step_dir = absl::StrCat(checkpoint_dir, "/", CheckpointStepName(step));
  std::error_code ec;
  uintmax_t bytes = 0;
  for (std::filesystem::directory_iterator it(step_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const uintmax_t size = it->file_size(ec);
    if (!ec) bytes += size;
  }
  std::printf("saved checkpoint %s (%.1f MiB in %.2f s)\n", step_dir.c_str(),
              static_cast<double>(bytes) / 1048576.0, absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
  return saved;
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& resume,
                                              const std::string& checkpoint_dir) {
  std::error_code ec;
  if (resume != "latest") {
    if (!std::filesystem::is_directory(resume, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--resume=", resume, ": no such checkpoint folder", InterruptedSaveNote(resume)));
    }
    if (HoldsCheckpoint(resume)) return resume;
    // A checkpoint directory: its latest step.
    std::string dir = std::filesystem::path(resume).lexically_normal().string();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();  // "ck/" -> "ck"
    if (!LatestStepName(dir).empty()) {
      absl::StatusOr<std::string> latest = ResolveCheckpoint("latest", dir);
      if (latest.ok()) return latest;
      const absl::string_view why =
          absl::StripPrefix(latest.status().message(), "--resume=latest: ");
      return absl::Status(latest.status().code(),
                          absl::StrCat("--resume=", resume, " (a checkpoint directory: its latest "
                                       "step): ", why));
    }
    // No step folders in it either: a step folder whose files are missing,
    // which loading names (with the checkpoints beside it).
    const std::vector<std::string> steps = StepFoldersIn(dir);
    if (steps.empty()) return resume;
    return absl::InvalidArgumentError(absl::StrCat(
        "--resume=", resume, ": not a checkpoint (no model.safetensors or index.json) nor a "
        "checkpoint directory (no 'latest' file naming a step); it holds the step folders ",
        absl::StrJoin(steps, ", "), ", newest first (resume one with --resume=",
        (std::filesystem::path(resume) / steps.front()).string(), ")"));
  }
  if (checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--resume=latest needs --checkpoint_dir");
  }
  return LatestStepFolder(checkpoint_dir, /*resuming=*/true);
}

absl::StatusOr<TrainState> LoadCheckpoint(const std::string& step_dir, nn::Module& model,
                                          optim::Optimizer& optimizer,
                                          const std::string& config) {
  // Both files' headers and checksums (read in pieces) first; then the model
  // is read straight into its parameters and the optimizer state into the
  // buffers it keeps, so neither file is held whole besides what it fills
  // (ranks that are threads of one process each load without a copy).
  if (IsShardedCheckpoint(step_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", step_dir, " is sharded (index.json: saved by FSDP or ZeRO-1); resume it "
        "with an FSDP strategy or --strategy=zero1 (--world_size=1 is enough), or turn it into a "
        "single-process checkpoint with `checkpoint consolidate ", step_dir,
        " OUT` (//tools:checkpoint)"));
  }
  if (const std::string lost = ShardsWithoutIndex(step_dir); !lost.empty()) {
    return absl::DataLossError(lost);
  }
  if (absl::Status s = CheckNotModelOnly(step_dir, "cannot be resumed"); !s.ok()) return s;
  const std::string model_path = step_dir + "/model.safetensors";
  const std::string opt_path = step_dir + "/optimizer.safetensors";
  absl::StatusOr<tensor::SafetensorsHeader> weights = tensor::ReadSafetensorsHeader(model_path);
  if (!weights.ok()) return weights.status();
  absl::StatusOr<tensor::SafetensorsHeader> opt = tensor::ReadSafetensorsHeader(opt_path);
  if (!opt.ok()) return opt.status();
  absl::StatusOr<TrainState> state = TrainStateFromMetadata(weights->metadata, model_path);
  if (!state.ok()) return state.status();
  if (absl::Status same = CheckSameSave(step_dir, weights->metadata, opt->metadata); !same.ok()) {
    return same;
  }
  if (!config.empty()) {
    const auto saved = state->extra.find("config");
    absl::Status same = CheckSameModel(saved == state->extra.end() ? "" : saved->second,
                                       step_dir, config);
    if (!same.ok()) return same;
  }
  // Another optimizer's state (or SGD's without momentum) said as such, not
  // as a missing or unexpected tensor.
  const auto saved_name = opt->metadata.find("optimizer");
  std::set<std::string> saved_buffers;  // the state's kinds: "exp_avg", "momentum_buffer", ...
  for (const tensor::SafetensorsEntry& e : opt->entries) {
    const size_t dot = e.name.rfind('.');
    const std::string kind = dot == std::string::npos ? e.name : e.name.substr(dot + 1);
    if (kind != "step") saved_buffers.insert(kind);
  }
  const std::vector<std::string> names = optimizer.BufferNames();
  if ((saved_name != opt->metadata.end() && saved_name->second != optimizer.name()) ||
      (!opt->entries.empty() &&
       saved_buffers != std::set<std::string>(names.begin(), names.end()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        step_dir, ": the checkpoint's optimizer state is ",
        saved_name != opt->metadata.end() ? saved_name->second : "unnamed", " (",
        absl::StrJoin(saved_buffers, ", "), ") but this run's optimizer is ", optimizer.name(),
        " (", absl::StrJoin(names, ", "),
        "); resume with the run's --optimizer and --momentum, or take the weights alone "
        "with --init_from"));
  }
  absl::Status s = tensor::VerifySafetensors(model_path, *weights);
  if (s.ok()) s = tensor::VerifySafetensors(opt_path, *opt);
  if (!s.ok()) return s;
  tensor::NamedTensors state_tensors;
  {
    tensor::ScopedMemoryCategory category(tensor::MemoryCategory::kOptimizerState);
    for (const tensor::SafetensorsEntry& e : opt->entries) {
      absl::StatusOr<tensor::Tensor> t = tensor::ReadSafetensorsEntry(opt_path, *opt, e);
      if (!t.ok()) return t.status();
      state_tensors.emplace_back(e.name, *std::move(t));
    }
  }
  // The optimizer state's entries are checked before the weights are
  // written: a failed load leaves the model as it was.
  s = optimizer.CheckStateTensors(state_tensors);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(step_dir, ": ", s.message()));
  s = nn::LoadStateDictFromSafetensors(model, model_path, *weights);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(step_dir, ": ", s.message()));
  s = optimizer.AdoptStateTensors(std::move(state_tensors));
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(step_dir, ": ", s.message()));
  return *state;
}

absl::StatusOr<TrainState> TrainStateFromMetadata(const std::map<std::string, std::string>& meta,
                                                  const std::string& path) {
  TrainState state;
  if (!StateFromMap(meta, kFileKeys, &state)) {
    return absl::DataLossError(absl::StrCat("'", path, "' lacks the training step (",
                                            kFileKeys.step,
                                            "); is it a checkpoint of this framework?"));
  }
  return state;
}

namespace {

// The fields of two config strings that differ, as (key, saved, now), split
// into those a resume may change (the dropout) and the others; nullopt when
// the strings do not have the same keys in the same order.
struct ModelDifferences {
  std::vector<std::array<std::string, 3>> resumable, others;
};
std::optional<ModelDifferences> CompareModels(const std::string& saved,
                                              const std::string& config) {
  const auto saved_fields = ConfigFields(saved);
  const auto fields = ConfigFields(config);
  if (!saved_fields.has_value() || !fields.has_value() || saved_fields->size() != fields->size()) {
    return std::nullopt;
  }
  ModelDifferences d;
  for (size_t i = 0; i < fields->size(); ++i) {
    const auto& [key, value] = (*fields)[i];
    const auto& [saved_key, saved_value] = (*saved_fields)[i];
    if (key != saved_key) return std::nullopt;
    if (value == saved_value) continue;
    (key == "dropout" || key == "dropout_rate" ? d.resumable : d.others)
        .push_back({key, saved_value, value});
  }
  return d;
}

}  // namespace

absl::Status CheckSameModel(const std::string& saved, const std::string& step_dir,
                            const std::string& config) {
  if (saved == config) return absl::OkStatus();
  const std::optional<ModelDifferences> d = CompareModels(saved, config);
  if (d.has_value() && d->others.empty()) return absl::OkStatus();
  std::vector<std::string> differ;
  if (d.has_value()) {
    for (const auto& [key, there, here] : d->others) {
      differ.push_back(absl::StrCat(key, " ", there, " there, ", here, " here"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "checkpoint ", step_dir, " is of model ", saved.empty() ? "(none recorded)" : saved,
      ", not ", config, d.has_value() ? absl::StrCat(" (", absl::StrJoin(differ, "; "), ")") : "",
      "; resume with the model flags it was trained with (the preset and sizes, the data's "
      "vocabulary, or the same --init_from)"));
}

std::vector<std::string> ResumedModelChanges(const std::string& saved, const std::string& config) {
  std::vector<std::string> changes;
  const std::optional<ModelDifferences> d = CompareModels(saved, config);
  if (!d.has_value()) return changes;
  for (const auto& [key, there, here] : d->resumable) {
    changes.push_back(absl::StrCat("the checkpoint was trained with ", key, "=", there,
                                   "; continuing with ", key, "=", here));
  }
  return changes;
}

absl::StatusOr<data::LoaderState> CheckResumable(const TrainState& state,
                                                 const std::string& step_dir,
                                                 const std::string& config) {
  auto it = state.extra.find("config");
  absl::Status same =
      CheckSameModel(it == state.extra.end() ? "" : it->second, step_dir, config);
  if (!same.ok()) return same;
  return data::LoaderState::FromString(state.loader_state);
}

absl::Status CheckStepFolderName(const std::string& step_dir, int64_t step,
                                 const std::string& checkpoint_dir) {
  const auto [folder, parent] = FolderAndParent(step_dir);
  const int64_t named = StepOfName(folder.filename().string());
  std::error_code ec;
  if (named < 0 || named == step || checkpoint_dir.empty() ||
      !std::filesystem::equivalent(parent, checkpoint_dir, ec) || ec) {
    return absl::OkStatus();  // its saves go elsewhere, or to its own name
  }
  const std::string proper = (parent / CheckpointStepName(step)).string();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", step_dir, " holds step ", step, ", but its folder is named ",
      folder.filename().string(), " (renamed, or another step's files copied in): resuming and "
      "saving step ", named, " would replace it, or leave it to be taken for step ", named,
      "; name it after its step (mv -T ", step_dir, " ", proper,
      ", if that name is free) and resume that"));
}

std::string InitFromLine(absl::string_view source, bool resuming) {
  return absl::StrCat("init_from: ", source,
                      resuming ? " (its configuration; --resume loads the weights)" : "");
}

absl::Status ResumeFailure(const absl::Status& failure, const std::string& resume,
                           const std::string& step_dir) {
  std::string message = absl::StrCat("--resume=", resume, ": ", failure.message());
  // Damaged (DataLoss) or missing files (NotFound: a shard or index.json;
  // Unavailable: a file that cannot be opened).
  const absl::StatusCode code = failure.code();
  if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kNotFound &&
      code != absl::StatusCode::kUnavailable) {
    return absl::Status(code, message);
  }
  return absl::Status(code, message + OtherCheckpointsNote(step_dir));
}

void PrintResumed(const Resumed& resumed) {
  std::printf("resumed from %s at step %lld\n", resumed.step_dir.c_str(),
              static_cast<long long>(resumed.state.step));
}

void AfterResume(const std::string& checkpoint_dir, const Resumed& resumed, int64_t steps) {
  // With nothing to train, `latest` still moves forward to a newer step
  // resumed (--resume=auto took a step folder after it), never back, and off
  // a step that is gone.
  if (steps > resumed.state.step) {
    PointLatestAtResumed(checkpoint_dir, resumed);
    return;
  }
  if (!checkpoint_dir.empty()) {
    const std::string latest = LatestStepName(checkpoint_dir);
    std::error_code ec;
    const bool there =
        !latest.empty() && std::filesystem::exists(checkpoint_dir + "/" + latest, ec);
    if (!there || resumed.state.step > StepOfName(latest)) {
      PointLatestAtResumed(checkpoint_dir, resumed);
    }
  }
  std::fprintf(stderr,
               "train: note: --steps=%lld is not past the checkpoint's step %lld: nothing to "
               "train (--steps counts from the start of the run; raise it to continue)\n",
               static_cast<long long>(steps), static_cast<long long>(resumed.state.step));
}

absl::Status InResumedCheckpoint(const Resumed& resumed, const absl::Status& failure) {
  if (failure.ok()) return failure;
  return absl::Status(failure.code(),
                      absl::StrCat("checkpoint ", resumed.step_dir, ": ", failure.message()));
}

void PointLatestAtResumed(const std::string& checkpoint_dir, const Resumed& resumed) {
  if (checkpoint_dir.empty()) return;
  namespace fs = std::filesystem;
  const auto [folder, parent] = FolderAndParent(resumed.step_dir);
  const std::string name = CheckpointStepName(resumed.state.step);
  std::error_code ec;
  if (folder.filename() != name || !fs::equivalent(parent, checkpoint_dir, ec) || ec) return;
  const std::string latest = LatestStepName(checkpoint_dir);
  if (latest == name) return;
  absl::Status s = SetLatestCheckpoint(checkpoint_dir, resumed.state.step);
  if (!s.ok()) {
    std::fprintf(stderr, "train: warning: %s/latest still names %s: %s\n",
                 checkpoint_dir.c_str(), latest.c_str(), std::string(s.message()).c_str());
    return;
  }
  const std::string before =
      latest.empty() ? "there was none"
      : fs::exists(fs::path(checkpoint_dir) / latest, ec)
          ? absl::StrCat("it named ", latest, ", which stays on disk")
          : absl::StrCat("it named ", latest, ", which is gone");
  std::printf("%s/latest now names %s, the step this run continues (%s)\n",
              checkpoint_dir.c_str(), name.c_str(), before.c_str());
}

absl::StatusOr<Resumed> ResumeCheckpoint(const std::string& resume,
                                         const std::string& checkpoint_dir, nn::Module& model,
                                         optim::Optimizer& optimizer, const std::string& config) {
  absl::StatusOr<std::string> step_dir = ResolveCheckpoint(resume, checkpoint_dir);
  if (!step_dir.ok()) return step_dir.status();
  absl::StatusOr<TrainState> state = LoadCheckpoint(*step_dir, model, optimizer, config);
  if (!state.ok()) return ResumeFailure(state.status(), resume, *step_dir);
  absl::StatusOr<data::LoaderState> loader = CheckResumable(*state, *step_dir, config);
  if (!loader.ok()) return loader.status();
  absl::Status named = CheckStepFolderName(*step_dir, state->step, checkpoint_dir);
  if (!named.ok()) return named;
  return Resumed{*std::move(state), *std::move(loader), *std::move(step_dir)};
}

bool CheckpointDue(int64_t every, int64_t step_done, int64_t steps) {
  return every > 0 && step_done % every == 0 && step_done < steps;
}

void ForwardOnlyInOneProcess(nn::Module& model, nn::MixedPrecision& mixed,
                             const std::function<void()>& work) {
  model.Train(false);
  // However `work` ends (a sample out of memory), the model trains on as
  // before: the fp32 masters as its parameters, in training mode.
  absl::Cleanup back_to_training = [&] {
    mixed.RestoreMasters();
    model.Train(true);
  };
  mixed.CastForCompute();
  work();
}

absl::Status PrintSampleInOneProcess(nn::Module& model, nn::MixedPrecision& mixed,
                                     const std::function<absl::StatusOr<std::string>()>& draw) {
  absl::StatusOr<std::string> sample;
  ForwardOnlyInOneProcess(model, mixed, [&] { sample = draw(); });
  if (!sample.ok()) return sample.status();
  std::fputs(sample->c_str(), stdout);
  std::fflush(stdout);
  return absl::OkStatus();
}

double EvalInOneProcess(nn::Module& model, nn::MixedPrecision& mixed,
                        const std::function<double()>& loss) {
  double value = 0.0;
  ForwardOnlyInOneProcess(model, mixed, [&] { value = loss(); });
  return value;
}

}  // namespace train
