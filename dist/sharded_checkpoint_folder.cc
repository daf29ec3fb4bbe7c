// The checkpoint folder on disk (see sharded_checkpoint_folder.h).
#include "dist/sharded_checkpoint_folder.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/sharded_checkpoint_index.h"
#include "tensor/durable_file.h"

namespace dist::sharded {

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

absl::Status CheckReplaceable(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus("cannot stat", dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("refusing to replace '", dir, "': it exists and is not a folder"));
  }
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus("cannot list", dir);
  std::string stray;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    // A sharded checkpoint's files, or a single-process one's (a step saved
    // again under another strategy after resuming from an earlier step).
    // (tensor::DurableFileWriter's temporaries are "<file>.tmp.<pid>"; a
    // "model.safetensors.bak" of the user's is not theirs.)
    bool single_process = false;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      single_process = single_process || name == file ||
                       absl::StartsWith(name, absl::StrCat(file, ".tmp."));
    }
    if (!IsCheckpointFile(name) && !single_process) {
      stray = name;
      break;
    }
  }
  ::closedir(d);
  if (!stray.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to replace '", dir, "': it holds '", stray,
        "', which is not part of a checkpoint (save into a new or empty folder)"));
  }
  return absl::OkStatus();
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

absl::Status Publish(const std::string& tmp, const std::string& dir, const std::string& id) {
  absl::Status replaceable = CheckReplaceable(dir);
  if (!replaceable.ok()) return replaceable;
  return tensor::ReplaceFolderDurably(tmp, dir, id);
}

std::string StripTrailingSlashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace dist::sharded
