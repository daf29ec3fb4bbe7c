// The binaries' command-line checks and --help configuration
// (command_line.h).
#include "models/common/command_line.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace train {
namespace {

// Edits (insertions, deletions, substitutions) from a to b.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean --x?)" for the known flag closest to `name`, or "" when
// none is close.
std::string DidYouMean(absl::string_view name) {
  const std::string underscored = absl::StrReplaceAll(name, {{"-", "_"}});
  if (underscored != name && absl::FindCommandLineFlag(underscored) != nullptr) {
    return absl::StrCat(" (did you mean --", underscored, "?)");
  }
  std::string best;
  size_t best_distance = std::max<size_t>(2, underscored.size() / 3) + 1;
  for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    const size_t d = EditDistance(underscored, flag_name);
    if (d < best_distance || (d == best_distance && !best.empty() && flag_name < best)) {
      if (d < best_distance) best_distance = d;
      best = std::string(flag_name);
    }
  }
  return best.empty() ? "" : absl::StrCat(" (did you mean --", best, "?)");
}

// Abseil's usage flags, which ParseCommandLine handles without registering
// them as flags; the last two take a value.
bool IsUsageFlag(absl::string_view name, bool* takes_value) {
  *takes_value = name == "helpon" || name == "helpmatch";
  for (const char* usage : {"help", "helpfull", "helpshort", "helppackage", "version",
                            "only_check_args", "helpon", "helpmatch"}) {
    if (name == usage) return true;
  }
  return false;
}

bool LooksBoolean(absl::string_view value) {
  for (const char* b : {"true", "false", "yes", "no", "1", "0", "t", "f", "y", "n"}) {
    if (absl::EqualsIgnoreCase(value, b)) return true;
  }
  return false;
}

}  // namespace

absl::Status CheckCommandLine(int argc, char** argv, int max_positional) {
  std::vector<std::string> positional;
  std::string after_bool;  // the boolean flag (without '=') the last argument was
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {
      for (int j = i + 1; j < argc; ++j) positional.emplace_back(argv[j]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      if (!after_bool.empty() && LooksBoolean(arg)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", after_bool, " ", arg, ": a boolean flag takes its value after '=' (--",
            after_bool, "=", arg, "); as written --", after_bool, " is true and '", arg,
            "' an argument"));
      }
      positional.emplace_back(arg);
      after_bool.clear();
      continue;
    }
    after_bool.clear();
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const absl::string_view name = body.substr(0, eq);
    if (bool takes_value = false; IsUsageFlag(name, &takes_value)) {
      if (takes_value && eq == absl::string_view::npos) ++i;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && eq == absl::string_view::npos) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --noflag
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, DidYouMean(name)));
    }
    if (eq != absl::string_view::npos) {
      std::string error;
      if (!flag->ParseFrom(body.substr(eq + 1), &error)) {
        return absl::InvalidArgumentError(absl::StrCat("--", body, ": ", error));
      }
      continue;
    }
    if (flag->IsOfType<bool>()) {
      after_bool = std::string(name);
      continue;
    }
    // "--name value": Abseil takes the next argument as the value.
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(argv[i + 1], &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " ", argv[i + 1], ": ", error));
    }
    ++i;
  }
  if (static_cast<int>(positional.size()) > max_positional) {
    const std::string& extra = positional[max_positional];
    return absl::InvalidArgumentError(
        max_positional == 0
            ? absl::StrCat("unexpected argument '", extra,
                           "': this program takes flags only (--name=value)")
            : absl::StrCat("unexpected argument '", extra, "': this program takes at most ",
                           max_positional, " arguments besides its flags"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ParseCommandLineOrExit(int argc, char** argv, absl::string_view usage,
                                                int max_positional) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  // Every flag of the project (Abseil's own are under absl/): the train
  // binaries' shared flags live in models/common/*_flags.cc.
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  absl::SetFlagsUsageConfig(config);
  if (absl::Status s = CheckCommandLine(argc, argv, max_positional); !s.ok()) {
    const absl::string_view program = argv[0];
    const size_t slash = program.rfind('/');
    std::fprintf(stderr, "%s: error: %s\n",
                 std::string(slash == absl::string_view::npos ? program
                                                             : program.substr(slash + 1))
                     .c_str(),
                 std::string(s.message()).c_str());
    std::exit(2);
  }
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  // Under `bazel run` the program starts in its runfiles tree: relative paths
  // in its flags and arguments mean the directory bazel was run from.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && *dir != 0) {
    if (::chdir(dir) != 0) {
      std::fprintf(stderr, "warning: cannot change to BUILD_WORKING_DIRECTORY %s: %s\n", dir,
                   std::strerror(errno));
    }
  }
  return std::vector<std::string>(rest.begin() + 1, rest.end());
}

}  // namespace train
