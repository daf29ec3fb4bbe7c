// The command line of the project's binaries: Abseil's flags, with the checks
// Abseil's ParseCommandLine leaves out, so that a mistyped command line
// stops with a message naming what was wrong (exit status 2) instead of
// running with something else than the user meant:
//   - an unknown flag names the closest known one ("--stpes": did you mean
//     --steps?), dashed spellings included (--batch-size);
//   - a value a flag cannot take names the flag (Abseil exits 1 there), and a
//     flag given where a value should be ("--checkpoint_dir --resume=latest",
//     which Abseil takes as the folder "--resume=latest") is refused;
//   - a positional argument the program does not take is refused; the
//     common mistake "--bool_flag false" (a boolean flag takes its value
//     after '=': that sets it true and leaves "false" over) says so.
//   - a --flagfile's lines are checked as if they were on the command line
//     (an error says which file), and a file that cannot be read or a line
//     that is not a flag is refused (Abseil exits 1 there).
// Abseil's own flags (--flagfile, --undefok, ...) are otherwise left to it,
// and a usage flag (--help, -h, ...) skips the checks. --help lists every
// flag of the project the binary links (the shared ones of models/common
// too), not only those of the file named like it. Under `bazel run` (BUILD_WORKING_DIRECTORY set) the program
// changes to the directory bazel was run from, so that relative paths mean
// what they say.
#ifndef MODELS_COMMON_COMMAND_LINE_H_
#define MODELS_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace train {

// The checks above on argv[1..argc), without parsing: InvalidArgument naming
// the first problem. `max_positional`: how many positional arguments the
// program takes (after the flags, or anywhere; all of those after "--").
absl::Status CheckCommandLine(int argc, char** argv, int max_positional);

// Sets the usage message and the --help configuration, changes to
// BUILD_WORKING_DIRECTORY when set, runs CheckCommandLine (on a problem:
// "<program>: error: <what>" on stderr and exit status 2), then Abseil's
// ParseCommandLine (which handles --help and --flagfile). Returns the
// positional arguments.
std::vector<std::string> ParseCommandLineOrExit(int argc, char** argv, absl::string_view usage,
                                                int max_positional = 0);

// The entries of list flag --`name`'s comma-separated `value`, each without
// its surrounding spaces; none for a value of spaces only. InvalidArgument
// "--<name>='<value>' has an empty entry (entries are comma-separated)" for
// ",a", "a,,b" or "a,": every binary refuses them alike (nn's --freeze
// patterns too), where some used to skip them and others to name ''.
absl::StatusOr<std::vector<std::string>> SplitListFlag(absl::string_view name,
                                                       absl::string_view value);

}  // namespace train

#endif  // MODELS_COMMON_COMMAND_LINE_H_
