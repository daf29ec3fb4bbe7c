// CheckCommandLine: unknown flags with the closest known one, values a flag
// cannot take, stray arguments and "--bool_flag false", each named, also
// inside a --flagfile.
#include "models/common/command_line.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, steps, 10, "steps");
ABSL_FLAG(bool, activation_checkpointing, false, "a boolean");
ABSL_FLAG(int, nproc_per_node, 1, "processes per node");
ABSL_FLAG(std::string, strategy, "full_shard", "a string");
ABSL_FLAG(int, grad_accum_steps, 1, "micro-batches");
ABSL_FLAG(double, grad_clip, 1.0, "clipping");
ABSL_FLAG(int, batch_size, 8, "rows");

namespace train {
namespace {

using ::testing::HasSubstr;

absl::Status Check(std::vector<std::string> args, int max_positional = 0) {
  args.insert(args.begin(), "program");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return CheckCommandLine(static_cast<int>(argv.size()), argv.data(), max_positional);
}

TEST(CheckCommandLineTest, ACorrectCommandLinePasses) {
  EXPECT_TRUE(Check({"--steps=3", "--activation_checkpointing", "--strategy", "ddp"}).ok());
  EXPECT_TRUE(Check({"--noactivation_checkpointing", "-steps=2"}).ok());
  EXPECT_TRUE(Check({"--activation_checkpointing=false", "--steps", "4"}).ok());
  EXPECT_TRUE(Check({"--steps=3", "a", "b"}, 2).ok());
  EXPECT_TRUE(Check({"--", "--not-a-flag"}, 1).ok());
  EXPECT_TRUE(Check({"--help"}).ok());  // Abseil's usage flags: it prints the help
  EXPECT_TRUE(Check({"--helpon=command_line_test", "--stpes", "extra"}).ok());
  EXPECT_TRUE(Check({"--undefok=from_a_newer_version", "--from_a_newer_version=1"}).ok());
  EXPECT_TRUE(Check({"--steps", "-1"}).ok());  // a negative value after a space
}

TEST(CheckCommandLineTest, AnUnknownFlagNamesTheClosestKnownOne) {
  absl::Status s = Check({"--stpes=3"});
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "unknown flag --stpes (did you mean --steps?)");
  EXPECT_EQ(Check({"--nproc-per-node=2"}).message(),
            "unknown flag --nproc-per-node (did you mean --nproc_per_node?)");
  EXPECT_EQ(Check({"--zzzzzzzzzzzzzzzzzzzzzz"}).message(), "unknown flag --zzzzzzzzzzzzzzzzzzzzzz");
  // Other tools' names (nanoGPT, DeepSpeed), and the start of a flag's name.
  EXPECT_EQ(Check({"--gradient_accumulation_steps=4"}).message(),
            "unknown flag --gradient_accumulation_steps (did you mean --grad_accum_steps?)");
  EXPECT_EQ(Check({"--gradient-clipping=1"}).message(),
            "unknown flag --gradient-clipping (did you mean --grad_clip?)");
  EXPECT_EQ(Check({"--max_iters=4"}).message(), "unknown flag --max_iters (did you mean --steps?)");
  EXPECT_EQ(Check({"--grad_accum=4"}).message(),
            "unknown flag --grad_accum (did you mean --grad_accum_steps?)");
  // A name whose flag this binary lacks suggests nothing from the table.
  EXPECT_EQ(Check({"--eval_iters=4"}).message(), "unknown flag --eval_iters");
  // ... nor a guess by spelling (--block_size is 3 edits from --batch_size).
  EXPECT_EQ(Check({"--block_size=64"}).message(), "unknown flag --block_size");
  // A non-boolean flag has no --no form; the --no form takes no value.
  EXPECT_EQ(Check({"--nosteps"}).message(),
            "--nosteps: --steps is not a boolean flag (no --no form)");
  EXPECT_EQ(Check({"--noactivation_checkpointing=true"}).message(),
            "--noactivation_checkpointing=true: the --no form of a boolean flag takes no value "
            "(--activation_checkpointing=false)");
}

TEST(CheckCommandLineTest, AValueTheFlagCannotTakeNamesTheFlag) {
  absl::Status s = Check({"--steps=abc"});
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--steps=abc: "));
  EXPECT_THAT(std::string(Check({"--steps", "x1"}).message()), HasSubstr("--steps x1: "));
  EXPECT_EQ(Check({"--steps"}).message(), "--steps needs a value");
  // The next argument is a flag: Abseil would take it as the value.
  EXPECT_EQ(Check({"--strategy", "--steps=3"}).message(),
            "--strategy needs a value, and the next argument is the flag --steps=3 (write "
            "--strategy=VALUE)");
}

TEST(CheckCommandLineTest, ABooleanFlagsValueAfterASpaceIsRefused) {
  EXPECT_EQ(Check({"--activation_checkpointing", "false", "--steps=1"}).message(),
            "--activation_checkpointing false: a boolean flag takes its value after '=' "
            "(--activation_checkpointing=false); as written --activation_checkpointing is true "
            "and 'false' an argument");
  // Also where the program takes arguments, and for the --no form.
  EXPECT_FALSE(Check({"--activation_checkpointing", "0"}, 1).ok());
  EXPECT_THAT(std::string(Check({"--noactivation_checkpointing", "false"}).message()),
              HasSubstr("as written --noactivation_checkpointing is false and 'false' an "
                        "argument"));
}

// A --flagfile's lines are checked as the command line's (errors name the
// file); a file that cannot be read, a line that is not a flag, or a
// flagfile naming itself is refused. Comments and blank lines are skipped,
// and a nested --flagfile is read too.
TEST(CheckCommandLineTest, AFlagfilesFlagsAreCheckedToo) {
  const std::string dir = ::testing::TempDir();
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string good = write("good.flags", "# a run\n\n  --steps=3  \n--strategy=ddp\n");
  EXPECT_TRUE(Check({"--flagfile=" + good, "--batch_size=2"}).ok());
  EXPECT_TRUE(Check({"--flagfile", good}).ok());
  const std::string typo = write("typo.flags", "--steps=3\n--stpes=4\n");
  EXPECT_EQ(Check({"--flagfile=" + typo}).message(),
            "unknown flag --stpes (did you mean --steps?) (in --flagfile=" + typo + ")");
  const std::string bad_value = write("value.flags", "--steps=many\n");
  EXPECT_THAT(Check({"--batch_size=2", "--flagfile=" + good + "," + bad_value}).message(),
              HasSubstr("--steps=many: "));
  EXPECT_THAT(Check({"--flagfile=" + bad_value}).message(),
              HasSubstr("(in --flagfile=" + bad_value + ")"));
  const std::string nested = write("nested.flags", "--flagfile=" + typo + "\n");
  EXPECT_THAT(Check({"--flagfile=" + nested}).message(),
              HasSubstr("unknown flag --stpes (did you mean --steps?) (in --flagfile=" + typo));
  const std::string words = write("words.flags", "--steps=3\nsteps 4\n");
  EXPECT_EQ(Check({"--flagfile=" + words}).message(),
            "--flagfile=" + words + " line 2: 'steps 4' is not a flag (a flagfile holds one "
            "--name=value a line; '#' starts a comment)");
  EXPECT_EQ(Check({"--flagfile=" + dir + "/none.flags"}).message(),
            "--flagfile=" + dir + "/none.flags: cannot read it (No such file or directory)");
  const std::string self = write("self.flags", "--flagfile=" + good + "\n--flagfile=" + dir +
                                                    "/self.flags\n");
  EXPECT_THAT(Check({"--flagfile=" + self}).message(),
              HasSubstr("/self.flags: it names itself (through the flagfiles it names)"));
  EXPECT_EQ(Check({"--flagfile"}).message(),
            "--flagfile needs a value (a file of flags, one a line)");
  // A flag's value never comes from the next file or the command line (as
  // Abseil reads each file apart).
  const std::string last = write("last.flags", "--batch_size=2\n--steps\n");
  EXPECT_EQ(Check({"--flagfile=" + last, "5"}).message(),
            "--steps needs a value (in --flagfile=" + last + ")");
  EXPECT_EQ(Check({"--flagfile=" + good + ",," + good}).message(),
            "--flagfile=" + good + ",," + good + ": an empty file name in the list");
  const std::string crlf = write("crlf.flags", "--steps=3\r\n");
  EXPECT_THAT(Check({"--flagfile=" + crlf}).message(),
              HasSubstr("line 1 ends with a carriage return"));
  // Leading spaces go; trailing ones stay part of the value, as for Abseil.
  const std::string trailing = write("trailing.flags", "  --steps=3 \n");
  EXPECT_TRUE(Check({"--flagfile=" + trailing}).ok());
  // Not a regular file (a pipe, a device): left to Abseil unread.
  EXPECT_TRUE(Check({"--flagfile=/dev/null"}).ok());
  // --flagfile taken as another flag's value is refused as before.
  EXPECT_THAT(Check({"--strategy", "--flagfile=" + good}).message(),
              HasSubstr("--strategy needs a value, and the next argument is the flag"));
}

TEST(CheckCommandLineTest, StrayArgumentsAreRefused) {
  EXPECT_EQ(Check({"--steps=3", "extra"}).message(),
            "unexpected argument 'extra': this program takes flags only (--name=value)");
  EXPECT_EQ(Check({"a", "b", "c"}, 2).message(),
            "unexpected argument 'c': this program takes at most 2 arguments besides its flags");
  EXPECT_FALSE(Check({"--", "x"}).ok());
}

TEST(SplitListFlagTest, EntriesWithoutSpacesAndEmptyOnesRefused) {
  EXPECT_EQ(*SplitListFlag("presets", "nano, gpt2 ,t5-tiny"),
            (std::vector<std::string>{"nano", "gpt2", "t5-tiny"}));
  EXPECT_EQ(*SplitListFlag("presets", "nano"), (std::vector<std::string>{"nano"}));
  EXPECT_TRUE(SplitListFlag("presets", "")->empty());
  EXPECT_TRUE(SplitListFlag("presets", "  ")->empty());
  for (const char* bad : {",a", "a,,b", "a,", "a, ,b", ","}) {
    absl::StatusOr<std::vector<std::string>> entries = SplitListFlag("input", bad);
    ASSERT_FALSE(entries.ok()) << bad;
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(entries.status().message(),
              absl::StrCat("--input='", bad, "' has an empty entry (entries are comma-separated)"));
  }
}

}  // namespace
}  // namespace train
