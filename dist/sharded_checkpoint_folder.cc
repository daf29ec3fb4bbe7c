// The checkpoint folder on disk (see sharded_checkpoint_folder.h).
#include "dist/sharded_checkpoint_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "dist/sharded_checkpoint_index.h"

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
    if (!IsCheckpointFile(name)) {
      stray = name;
      break;
    }
  }
  ::closedir(d);
  if (!stray.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to replace '", dir, "': it holds '", stray,
        "', which is not part of a sharded checkpoint (save into a new or empty folder)"));
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
  if (::rename(tmp.c_str(), dir.c_str()) == 0) return absl::OkStatus();
  if (errno != EEXIST && errno != ENOTEMPTY) {
    return ErrnoStatus("cannot rename a checkpoint onto", dir);
  }
  // `dir` holds an older checkpoint: swap the two folders, then drop the old one.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    RemoveTree(tmp);
    return absl::OkStatus();
  }
  // No RENAME_EXCHANGE here: two renames (a crash between them leaves the old
  // checkpoint in "<dir>.old-<id>" and no `dir`).
  const std::string old = absl::StrCat(dir, ".old-", id);
  if (::rename(dir.c_str(), old.c_str()) != 0) return ErrnoStatus("cannot move aside", dir);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    absl::Status s = ErrnoStatus("cannot rename a checkpoint onto", dir);
    ::rename(old.c_str(), dir.c_str());
    return s;
  }
  RemoveTree(old);
  return absl::OkStatus();
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string StripTrailingSlashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace dist::sharded
