// Finding data files shipped with the repository (Bazel `data` dependencies)
// from a binary or test, in the Bazel runfiles layout:
//   $RUNFILES_DIR/<workspace>/<path>, $TEST_SRCDIR/<workspace>/<path>,
//   <argv0>.runfiles/<workspace>/<path>, /proc/self/exe.runfiles/<workspace>/<path>,
// where <workspace> is "fsdp" (this repository) or, when it is used from
// another workspace, whatever name that workspace gave it; then
// $BUILD_WORKSPACE_DIRECTORY/<path> (set by `bazel run`) and <path> relative to
// the current directory.
#ifndef MODELS_DATA_RUNFILES_H_
#define MODELS_DATA_RUNFILES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace data {

// This repository's workspace name (WORKSPACE: workspace(name = "fsdp")).
inline constexpr char kWorkspaceName[] = "fsdp";

// Remembers argv[0] so <argv0>.runfiles is searched too (optional: the
// running executable's own path is always tried).
void SetProgramPath(absl::string_view argv0);

// The runfiles directories to search, in order (those that exist).
std::vector<std::string> RunfilesDirs();

// The path of a readable file for `path`, a path relative to the workspace
// root ("models/data/text/newton_opticks.txt"). An absolute `path` is returned
// as is when the file exists. NotFound lists every place that was tried.
absl::StatusOr<std::string> ResolveRunfile(absl::string_view path);

}  // namespace data

#endif  // MODELS_DATA_RUNFILES_H_
