// RunTrainMain, the train binaries' main: the exit code of each outcome, the
// error line on stderr, and after running out of memory (an OutOfMemoryError
// thrown, or a ResourceExhausted error a rank returned) the flags that lower
// what a rank needs; nothing more after other errors.
#include "models/common/train_setup.h"

#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/allocator.h"

namespace train {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// RunTrainMain(train)'s exit code, and what it printed on stderr into *err.
int RunMain(const std::function<absl::Status()>& train, std::string* err) {
  ::testing::internal::CaptureStderr();
  const int code = RunTrainMain(train);
  *err = ::testing::internal::GetCapturedStderr();
  return code;
}

TEST(RunTrainMainTest, ExitCodesAndTheErrorLine) {
  std::string err;
  EXPECT_EQ(RunMain([] { return absl::OkStatus(); }, &err), 0);
  EXPECT_EQ(err, "");
  EXPECT_EQ(RunMain([] { return absl::InvalidArgumentError("--steps: must be > 0"); }, &err), 2);
  EXPECT_EQ(err, "train: error: --steps: must be > 0\n");
  EXPECT_EQ(RunMain([]() -> absl::Status { throw std::runtime_error("disk gone"); }, &err), 1);
  EXPECT_EQ(err, "train: error: disk gone\n");
  // A checkpoint that does not fit on its disk is not out of memory: no hint.
  EXPECT_EQ(RunMain([] { return absl::ResourceExhaustedError("No space left on device"); }, &err),
            1);
  EXPECT_EQ(err, "train: error: No space left on device\n");
}

TEST(RunTrainMainTest, OutOfMemoryNamesTheFlagsThatLowerARanksMemory) {
  const std::string oom =
      "[memory] out of memory on cuda:0: 1.50 GiB of activations asked for; cuda:0 has ...";
  std::string err;
  // Thrown in one process; returned by a rank of a data-parallel run.
  EXPECT_EQ(RunMain([&]() -> absl::Status { throw tensor::OutOfMemoryError(oom); }, &err), 1);
  EXPECT_THAT(err, HasSubstr("train: error: " + oom + "\n"));
  EXPECT_THAT(err, HasSubstr("--batch_size"));
  EXPECT_THAT(err, HasSubstr("--activation_checkpointing"));
  EXPECT_THAT(err, HasSubstr("--strategy=full_shard"));
  EXPECT_EQ(RunMain([&] { return absl::ResourceExhaustedError("rank 1: " + oom); }, &err), 1);
  EXPECT_THAT(err, HasSubstr("train: error: rank 1: " + oom + "\n"));
  EXPECT_THAT(err, HasSubstr("--cpu_offload"));
  EXPECT_EQ(RunMain([]() -> absl::Status { throw std::bad_alloc(); }, &err), 1);
  EXPECT_THAT(err, Not(HasSubstr("--batch_size"))) << "std::bad_alloc says no more than that";
}

}  // namespace
}  // namespace train
