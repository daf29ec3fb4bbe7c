// The layout of a train checkpoint directory (checkpoint_dir.h).
#include "models/common/checkpoint_dir.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <system_error>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/durable_file.h"

namespace train {

std::string CheckpointStepName(int64_t step) { return absl::StrFormat("step_%06d", step); }

absl::Status MakeCheckpointDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create directory '", dir, "': ", ec.message()));
  }
  return absl::OkStatus();
}

std::string LeftoversOfInterruptedSaves(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t dot = name.find('.');
    int64_t step = 0;
    if (!absl::StartsWith(name, "step_") || dot == std::string::npos ||
        !absl::SimpleAtoi(name.substr(5, dot - 5), &step) || !it->is_directory(ec)) {
      continue;
    }
    const std::string rest = name.substr(dot);
    const bool tmp = absl::StartsWith(rest, ".tmp-");
    // A copy moved aside is a leftover only once its step folder is back.
    const bool old = absl::StartsWith(rest, ".old-") &&
                     fs::is_directory(fs::path(dir) / name.substr(0, dot), ec);
    if (!tmp && !old) continue;
    int64_t bytes = 0;
    for (fs::recursive_directory_iterator f(it->path(), ec), f_end; !ec && f != f_end;
         f.increment(ec)) {
      if (f->is_regular_file(ec)) bytes += static_cast<int64_t>(f->file_size(ec));
    }
    found.push_back(absl::StrCat(name, " (", absl::StrFormat("%.1f", bytes / 1048576.0), " MiB)"));
  }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end());
  return absl::StrCat(dir, " holds folders interrupted saves left, which nothing reads: ",
                      absl::StrJoin(found, ", "),
                      "; remove them (rm -r) once no other run saves into it");
}

absl::Status PrepareCheckpointDir(const std::string& dir, bool report_leftovers) {
  absl::Status s = MakeCheckpointDir(dir);
  if (s.ok()) {
    const std::string probe =
        absl::StrCat(dir, "/.write_check.", ::getpid(), ".",
                     std::hash<std::thread::id>()(std::this_thread::get_id()));
    std::FILE* f = std::fopen(probe.c_str(), "w");
    if (f == nullptr) {
      s = absl::UnavailableError(
          absl::StrCat("cannot create files in '", dir, "': ", std::strerror(errno)));
    } else {
      std::fclose(f);
      std::remove(probe.c_str());
    }
  }
  if (s.ok()) {
    const std::string leftovers = report_leftovers ? LeftoversOfInterruptedSaves(dir) : "";
    if (!leftovers.empty()) {
      std::fprintf(stderr, "train: warning: --checkpoint_dir: %s\n", leftovers.c_str());
    }
    return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("--checkpoint_dir: ", s.message()));
}

absl::Status SetLatestCheckpoint(const std::string& dir, int64_t step) {
  return tensor::WriteFileDurably(dir + "/latest", CheckpointStepName(step) + "\n");
}

std::string LatestStepName(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  std::string name;
  f >> name;
  // One folder name in `dir`: printable, no '/', not "." or "..".
  const bool folder = !name.empty() && name != "." && name != ".." &&
                      std::all_of(name.begin(), name.end(), [](char c) {
                        return c > ' ' && c < 127 && c != '/';
                      });
  return folder ? name : "";
}

int64_t StepOfName(const std::string& name) {
  int64_t step = -1;
  if (!absl::StartsWith(name, "step_") || name.size() == 5 ||
      name.find_first_not_of("0123456789", 5) != std::string::npos ||
      !absl::SimpleAtoi(name.substr(5), &step)) {
    return -1;
  }
  return step;
}

bool IsShardedCheckpoint(const std::string& step_dir) {
  return ::access((step_dir + "/index.json").c_str(), F_OK) == 0;
}

std::string ShardsWithoutIndex(const std::string& step_dir) {
  std::error_code exists;
  if (IsShardedCheckpoint(step_dir) ||
      std::filesystem::exists(step_dir + "/model.safetensors", exists)) {
    return "";  // sharded, or single-process (a stray shard file beside it)
  }
  std::vector<std::string> shards;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(step_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (absl::StartsWith(name, "shard_") && absl::EndsWith(name, ".safetensors")) {
      shards.push_back(name);
    }
  }
  if (shards.empty()) return "";
  std::sort(shards.begin(), shards.end());
  return absl::StrCat("checkpoint ", step_dir, " holds the shard files of a sharded checkpoint (",
                      absl::StrJoin(shards, ", "), ") but no index.json, which says what they "
                      "hold: the folder is incomplete (a copy or a save cut short); resume "
                      "another step folder, or copy the whole folder again");
}

bool HoldsCheckpoint(const std::string& step_dir) {
  std::error_code ec;
  return IsShardedCheckpoint(step_dir) ||
         std::filesystem::exists(step_dir + "/model.safetensors", ec);
}

bool IsModelOnly(const std::string& step_dir) {
  return !IsShardedCheckpoint(step_dir) &&
         ::access((step_dir + "/model.safetensors").c_str(), F_OK) == 0 &&
         ::access((step_dir + "/optimizer.safetensors").c_str(), F_OK) != 0 && errno == ENOENT;
}

absl::Status CheckNotModelOnly(const std::string& step_dir, const std::string& action) {
  if (!IsModelOnly(step_dir)) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "checkpoint ", step_dir, " holds the model alone (model.safetensors, no "
      "optimizer.safetensors: removed on purpose, or a copy cut short: if so, copy it again): "
      "it ", action,
      ", which needs the optimizer state; to start a run from its weights (the optimizer begins "
      "anew), give --init_from=", step_dir, " and a new --checkpoint_dir"));
}

std::string SaidStepFolder(const std::filesystem::path& dir, const std::string& name) {
  return IsModelOnly((dir / name).string()) ? name + " (model only)" : name;
}

std::pair<std::filesystem::path, std::filesystem::path> FolderAndParent(
    const std::string& step_dir) {
  namespace fs = std::filesystem;
  fs::path folder = fs::path(step_dir).lexically_normal();
  if (!folder.has_filename()) folder = folder.parent_path();  // "dir/step_000004/"
  return {folder, folder.has_parent_path() ? folder.parent_path() : fs::path(".")};
}

std::vector<std::string> StepFoldersIn(const std::filesystem::path& dir,
                                       const std::string& except) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> found;  // (step, folder name)
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = StepOfName(name);
    if (name == except || step < 0) continue;
    if (HoldsCheckpoint(it->path().string())) found.emplace_back(step, name);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> names;
  for (const auto& [step, name] : found) names.push_back(name);
  return names;
}

std::string OtherCheckpointsNote(const std::string& step_dir, bool resuming) {
  const auto [failed, dir] = FolderAndParent(step_dir);
  const std::vector<std::string> others = StepFoldersIn(dir, failed.filename().string());
  if (others.empty()) return absl::StrCat(" (no other checkpoint in ", dir.string(), ")");
  std::vector<std::string> said;
  std::string resumable;  // the newest that holds its optimizer state
  for (const std::string& name : others) {
    said.push_back(SaidStepFolder(dir, name));
    const bool model_only = said.back() != name;  // said with " (model only)"
    if (!model_only && resumable.empty()) resumable = name;
  }
  return absl::StrCat(
      "; the other checkpoints in ", dir.string(), ", newest first: ", absl::StrJoin(said, ", "),
      resuming && !resumable.empty()
          ? absl::StrCat(" (resume one with --resume=", (dir / resumable).string(), ")")
          : "");
}

std::string InterruptedSaveNote(const std::string& step_dir) {
  namespace fs = std::filesystem;
  const auto [folder, dir] = FolderAndParent(step_dir);
  const std::string prefix = folder.filename().string() + ".old-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, prefix) || !HoldsCheckpoint(it->path().string())) continue;
    return absl::StrCat(
        "; a save of it was interrupted after moving the previous copy aside: ",
        it->path().string(), " holds it; put it back with `mv ", it->path().string(), " ",
        folder.string(), "`");
  }
  return "";
}

}  // namespace train
