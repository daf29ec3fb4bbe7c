// Runfiles lookup: environment variables, argv[0], /proc/self/exe, then the
// workspace and current directories.
#include "models/data/runfiles.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace data {
namespace {

std::mutex& ProgramPathMutex() {
  static std::mutex m;
  return m;
}

std::string& ProgramPath() {
  static std::string* path = new std::string;
  return *path;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsReadableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), R_OK) == 0;
}

std::string EnvOrEmpty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return std::string();
  return std::string(buf, static_cast<size_t>(n));
}

// Subdirectories of `dir` (the workspaces of a runfiles tree), sorted.
std::vector<std::string> Subdirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (IsDir(dir + "/" + name)) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void SetProgramPath(absl::string_view argv0) {
  std::lock_guard<std::mutex> lock(ProgramPathMutex());
  ProgramPath() = std::string(argv0);
}

std::vector<std::string> RunfilesDirs() {
  std::vector<std::string> candidates = {EnvOrEmpty("RUNFILES_DIR"), EnvOrEmpty("TEST_SRCDIR")};
  {
    std::lock_guard<std::mutex> lock(ProgramPathMutex());
    if (!ProgramPath().empty()) candidates.push_back(ProgramPath() + ".runfiles");
  }
  const std::string exe = SelfExe();
  if (!exe.empty()) candidates.push_back(exe + ".runfiles");
  std::vector<std::string> dirs;
  for (const std::string& c : candidates) {
    if (c.empty() || !IsDir(c)) continue;
    if (std::find(dirs.begin(), dirs.end(), c) == dirs.end()) dirs.push_back(c);
  }
  return dirs;
}

absl::StatusOr<std::string> ResolveRunfile(absl::string_view path) {
  const std::string rel(path);
  if (rel.empty()) return absl::InvalidArgumentError("[runfiles] empty path");
  if (rel[0] == '/') {
    if (IsReadableFile(rel)) return rel;
    return absl::NotFoundError(absl::StrCat("[runfiles] no readable file ", rel));
  }
  std::vector<std::string> tried;
  auto try_path = [&](const std::string& p) {
    tried.push_back(p);
    return IsReadableFile(p);
  };
  for (const std::string& dir : RunfilesDirs()) {
    const std::string main = absl::StrCat(dir, "/", kWorkspaceName, "/", rel);
    if (try_path(main)) return main;
    // Used from another workspace, this repository has the name given there.
    for (const std::string& ws : Subdirs(dir)) {
      if (ws == kWorkspaceName) continue;
      const std::string p = absl::StrCat(dir, "/", ws, "/", rel);
      if (try_path(p)) return p;
    }
  }
  const std::string workspace = EnvOrEmpty("BUILD_WORKSPACE_DIRECTORY");
  if (!workspace.empty()) {
    const std::string p = absl::StrCat(workspace, "/", rel);
    if (try_path(p)) return p;
  }
  if (try_path(rel)) return rel;
  return absl::NotFoundError(
      absl::StrCat("[runfiles] cannot find ", rel, "; tried: ", absl::StrJoin(tried, ", ")));
}

}  // namespace data
