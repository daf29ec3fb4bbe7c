// The binaries' command-line checks and --help configuration
// (command_line.h).
#include "models/common/command_line.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

// Other tools' names for the train binaries' flags (nanoGPT, DeepSpeed,
// Hugging Face's Trainer, PyTorch FSDP), which no edit distance would find.
constexpr std::pair<const char*, const char*> kOtherToolsNames[] = {
    {"gradient_accumulation_steps", "grad_accum_steps"},
    {"max_iters", "steps"},
    {"max_steps", "steps"},
    {"learning_rate", "lr"},
    {"max_grad_norm", "grad_clip"},
    {"gradient_clipping", "grad_clip"},
    {"clip_grad", "grad_clip"},
    {"per_device_train_batch_size", "batch_size"},
    {"train_micro_batch_size_per_gpu", "batch_size"},
    {"block_size", "seq_len"},
    {"block_size", "encoder_length"},
    {"eval_interval", "eval_every"},
    {"eval_iters", "eval_batches"},
    {"out_dir", "checkpoint_dir"},
    {"output_dir", "checkpoint_dir"},
    {"zero_stage", "strategy"},
    {"sharding_strategy", "strategy"},
    {"dtype", "precision"},
    {"mixed_precision", "precision"},
    {"fp16", "precision"},
    {"bf16", "precision"},
};

// " (did you mean --x?)" for the known flag `name` most likely meant: its
// spelling with '_' for '-', another tool's name for it (none when this
// binary lacks that flag), the shortest flag it begins (4 characters or
// more), else the closest by edit distance; "" when none is close.
std::string DidYouMean(absl::string_view name) {
  const std::string underscored = absl::StrReplaceAll(name, {{"-", "_"}});
  if (underscored != name && absl::FindCommandLineFlag(underscored) != nullptr) {
    return absl::StrCat(" (did you mean --", underscored, "?)");
  }
  bool theirs_named = false;  // another tool's name, whose flag this binary may lack
  for (const auto& [theirs, ours] : kOtherToolsNames) {
    if (underscored != theirs) continue;
    theirs_named = true;
    if (absl::FindCommandLineFlag(ours) != nullptr) {
      return absl::StrCat(" (did you mean --", ours, "?)");
    }
  }
  if (theirs_named) return "";  // not a misspelling of one of ours
  std::string best;
  if (underscored.size() >= 4) {
    for (const auto& [flag_name, flag] : absl::GetAllFlags()) {
      if (flag->IsRetired() || !absl::StartsWith(flag_name, underscored)) continue;
      if (best.empty() || flag_name.size() < best.size() ||
          (flag_name.size() == best.size() && flag_name < best)) {
        best = std::string(flag_name);
      }
    }
    if (!best.empty()) return absl::StrCat(" (did you mean --", best, "?)");
  }
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
// them as flags (helpon and helpmatch take their value after '=' only).
bool IsUsageFlag(absl::string_view name) {
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

// The flag name of `arg` when it is a flag ("-x", "--x", "--x=v"): "x".
std::optional<absl::string_view> FlagName(absl::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-' || arg == "--") return std::nullopt;
  const absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
  return body.substr(0, body.find('='));
}

// Whether `name` is something Abseil takes as a flag: a registered one, a
// usage flag, or the --no form of a boolean one.
bool KnownToAbseil(absl::string_view name) {
  if (absl::FindCommandLineFlag(name) != nullptr || IsUsageFlag(name)) return true;
  if (!absl::StartsWith(name, "no")) return false;
  const absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
  return negated != nullptr && negated->IsOfType<bool>();
}

// Abseil's own flags (--flagfile, --fromenv, --undefok, ...): Abseil acts on
// them as it parses, so they are left to it, not set by the check.
bool IsAbseils(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/");
}

// The checks of CheckCommandLine on `args` (flagfiles expanded); `*at`: the
// index of the argument a returned error is about. A flag's value is the
// next argument only within its segment (segments[i]: the command line, or
// one reading of a flagfile), as Abseil takes it.
absl::Status CheckArgs(const std::vector<std::string>& args, const std::vector<int>& segments,
                       int max_positional, size_t* at) {
  const size_t argc = args.size();
  // With a usage flag Abseil prints the help and exits: nothing to check.
  // --undefok names flags Abseil lets be unknown.
  std::vector<std::string> undefok;
  for (size_t i = 0; i < argc; ++i) {
    *at = i;
    const absl::string_view arg = args[i];
    if (arg == "--") break;
    const std::optional<absl::string_view> name = FlagName(arg);
    if (!name.has_value()) continue;
    if (IsUsageFlag(*name)) return absl::OkStatus();
    if (*name == "undefok") {
      const size_t eq = arg.find('=');
      const absl::string_view list =
          eq != absl::string_view::npos ? arg.substr(eq + 1)
                                        : (i + 1 < argc && segments[i + 1] == segments[i]
                                               ? absl::string_view(args[i + 1])
                                               : "");
      for (absl::string_view u : absl::StrSplit(list, ',', absl::SkipEmpty())) {
        undefok.emplace_back(u);
      }
    }
  }
  std::vector<std::string> positional;
  std::string after_bool;  // the boolean flag (without '=') the last argument was
  size_t positional_at = 0;  // where positional[max_positional] is
  for (size_t i = 0; i < argc; ++i) {
    *at = i;
    const absl::string_view arg = args[i];
    if (arg == "--") {
      for (size_t j = i + 1; j < argc; ++j) {
        if (static_cast<int>(positional.size()) == max_positional) positional_at = j;
        positional.emplace_back(args[j]);
      }
      break;
    }
    if (!FlagName(arg).has_value()) {
      if (!after_bool.empty() && LooksBoolean(arg)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", after_bool, " ", arg, ": a boolean flag takes its value after '=' (--",
            after_bool, "=", arg, "); as written --", after_bool, " is ",
            absl::StartsWith(after_bool, "no") ? "false" : "true", " and '", arg,
            "' an argument"));
      }
      if (static_cast<int>(positional.size()) == max_positional) positional_at = i;
      positional.emplace_back(arg);
      after_bool.clear();
      continue;
    }
    after_bool.clear();
    const absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const absl::string_view name = body.substr(0, eq);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --noflag
      const absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && !negated->IsRetired()) {
        if (!negated->IsOfType<bool>()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--", name, ": --", name.substr(2), " is not a boolean flag (no --no form)"));
        }
        if (eq != absl::string_view::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", body, ": the --no form of a boolean flag takes no value (--",
                           name.substr(2), "=false)"));
        }
        after_bool = std::string(name);
        continue;
      }
    }
    if (flag == nullptr || flag->IsRetired()) {
      if (std::find(undefok.begin(), undefok.end(), name) != undefok.end()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, DidYouMean(name)));
    }
    if (eq != absl::string_view::npos) {
      std::string error;
      if (!IsAbseils(*flag) && !flag->ParseFrom(body.substr(eq + 1), &error)) {
        return absl::InvalidArgumentError(absl::StrCat("--", body, ": ", error));
      }
      continue;
    }
    if (flag->IsOfType<bool>()) {
      after_bool = std::string(name);
      continue;
    }
    // "--name value": Abseil takes the next argument as the value, even a
    // flag ("--checkpoint_dir --resume=latest" would save into a folder
    // named "--resume=latest"): refused unless it is not one (-1).
    if (i + 1 >= argc || segments[i + 1] != segments[i]) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    const absl::string_view value = args[i + 1];
    if (const std::optional<absl::string_view> next = FlagName(value);
        value == "--" || (next.has_value() && KnownToAbseil(*next))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, " needs a value, and the next argument is the flag ", value,
          " (write --", name, "=VALUE)"));
    }
    std::string error;
    if (!IsAbseils(*flag) && !flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " ", value, ": ", error));
    }
    ++i;
  }
  if (static_cast<int>(positional.size()) > max_positional) {
    *at = positional_at;
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

// The arguments `in` (of `origin`: "" for the command line, else
// "--flagfile=F"; segment `segment`), each followed, when it is a --flagfile
// (=F or "--flagfile F"; F a comma-separated list, as Abseil takes it) naming
// regular files, by the flags those hold, read as Abseil reads them: one
// argument a line, leading spaces dropped, blank lines and those starting
// with '#' skipped, each other line a flag; a --flagfile in one is expanded
// in turn, each reading a segment of its own. Other files (a pipe, /dev/stdin)
// are left to Abseil unread. Appends to `args`, `origins` and `segments`;
// arguments after "--" stay as they are. `chain`: the files being read (a
// file naming itself, directly or not, is refused). InvalidArgument for a
// file it cannot read or a line that is not a flag.
struct Expanded {
  std::vector<std::string> args, origins;
  std::vector<int> segments;
  int last_segment = 0;
};
absl::Status ExpandFlagfiles(const std::vector<std::string>& in, const std::string& origin,
                             int segment, std::vector<std::string>* chain, Expanded* out) {
  const std::string in_origin = origin.empty() ? "" : absl::StrCat(" (in ", origin, ")");
  const auto keep = [&](const std::string& arg) {
    out->args.push_back(arg);
    out->origins.push_back(origin);
    out->segments.push_back(segment);
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == "--") {
      for (size_t j = i; j < in.size(); ++j) keep(in[j]);
      break;
    }
    keep(in[i]);
    const std::optional<absl::string_view> name = FlagName(in[i]);
    if (!name.has_value() || *name != "flagfile") continue;
    std::string files;
    if (const size_t eq = in[i].find('='); eq != std::string::npos) {
      files = in[i].substr(eq + 1);
    } else if (i + 1 < in.size()) {
      files = in[++i];
      keep(files);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--flagfile needs a value (a file of flags, one a line)", in_origin));
    }
    if (files.empty()) continue;  // nothing to read, for Abseil too
    for (absl::string_view file : absl::StrSplit(files, ',')) {
      const std::string what = absl::StrCat("--flagfile=", file);
      if (file.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--flagfile=", files, ": an empty file name in the list", in_origin));
      }
      struct stat st {};
      if (::stat(std::string(file).c_str(), &st) == 0 && !S_ISREG(st.st_mode)) continue;
      std::error_code ignored;
      const std::string canonical =
          std::filesystem::weakly_canonical(std::string(file), ignored).string();
      if (std::find(chain->begin(), chain->end(), canonical) != chain->end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": it names itself (through the flagfiles it names)", in_origin));
      }
      std::ifstream stream{std::string(file)};
      if (!stream) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": cannot read it (", std::strerror(errno), ")", in_origin));
      }
      std::vector<std::string> lines;
      std::string line;
      for (int number = 1; std::getline(stream, line); ++number) {
        const absl::string_view text = absl::StripLeadingAsciiWhitespace(line);
        if (text.empty() || text[0] == '#') continue;
        if (absl::EndsWith(text, "\r")) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, " line ", number, " ends with a carriage return (Windows line ends), ",
              "which Abseil would take as part of the flag: convert the file (dos2unix)"));
        }
        if (text == "--" || !FlagName(text).has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, " line ", number, ": '", text, "' is not a flag (a flagfile holds one ",
              "--name=value a line; '#' starts a comment)"));
        }
        lines.emplace_back(text);
      }
      chain->push_back(canonical);
      absl::Status s = ExpandFlagfiles(lines, what, ++out->last_segment, chain, out);
      chain->pop_back();
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCommandLine(int argc, char** argv, int max_positional) {
  Expanded expanded;
  std::vector<std::string> chain;
  absl::Status s = ExpandFlagfiles(std::vector<std::string>(argv + 1, argv + argc), "", 0,
                                   &chain, &expanded);
  if (!s.ok()) return s;
  size_t at = 0;
  s = CheckArgs(expanded.args, expanded.segments, max_positional, &at);
  if (!s.ok() && at < expanded.origins.size() && !expanded.origins[at].empty()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (in ", expanded.origins[at], ")"));
  }
  return s;
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
  // Under `bazel run` the program starts in its runfiles tree: relative paths
  // in its flags (a --flagfile's too) and arguments mean the directory bazel
  // was run from.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && *dir != 0) {
    if (::chdir(dir) != 0) {
      std::fprintf(stderr, "warning: cannot change to BUILD_WORKING_DIRECTORY %s: %s\n", dir,
                   std::strerror(errno));
    }
  }
  static char help[] = "--help";
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "-h") == 0) argv[i] = help;  // as most programs take it
  }
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
  return std::vector<std::string>(rest.begin() + 1, rest.end());
}

absl::StatusOr<std::vector<std::string>> SplitListFlag(absl::string_view name,
                                                       absl::string_view value) {
  std::vector<std::string> entries;
  if (absl::StripAsciiWhitespace(value).empty()) return entries;
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "='", value, "' has an empty entry (entries are comma-separated)"));
    }
    entries.emplace_back(entry);
  }
  return entries;
}

}  // namespace train
