// The NCCL settings the nccl engine chooses (nccl_env.h).
#include "dist/nccl_env.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

namespace dist {
namespace nccl {
namespace {

// Whether the file at `path` (if any) has a line setting `var`.
bool FileSets(const std::string& path, const std::string& var) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = absl::StripAsciiWhitespace(line);
    if (rest.empty() || rest.front() == '#') continue;
    const size_t eq = rest.find('=');
    if (eq == absl::string_view::npos) continue;
    if (absl::StripAsciiWhitespace(rest.substr(0, eq)) == var) return true;
  }
  return false;
}

}  // namespace

bool SetInNcclConfFiles(const std::string& var, const GetEnv& getenv) {
  // As NCCL: NCCL_CONF_FILE when set, else the user's file and the system's.
  if (const char* file = getenv("NCCL_CONF_FILE"); file != nullptr && file[0] != '\0') {
    return FileSets(file, var);
  }
  if (const char* home = getenv("HOME"); home != nullptr && home[0] != '\0') {
    if (FileSets(std::string(home) + "/.nccl.conf", var)) return true;
  }
  return FileSets("/etc/nccl.conf", var);
}

void ChooseNcclEnvironment() {
  static const bool chosen = [] {
    const GetEnv getenv = [](const char* name) -> const char* { return std::getenv(name); };
    if (std::getenv("NCCL_RUNTIME_CONNECT") == nullptr &&
        !SetInNcclConfFiles("NCCL_RUNTIME_CONNECT", getenv)) {
      setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    }
    return true;
  }();
  (void)chosen;
}

}  // namespace nccl
}  // namespace dist
