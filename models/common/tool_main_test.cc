// RunToolMain: exit codes, the error line, and the out-of-memory hint only
// after running out of memory (thrown or returned).
#include "models/common/tool_main.h"

#include <functional>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tensor/allocator.h"

namespace train {
namespace {

int RunSample(const std::function<absl::Status()>& run, std::string* err) {
  ::testing::internal::CaptureStderr();
  const int code = RunToolMain("sample", run, "ask for fewer --max_new_tokens");
  *err = ::testing::internal::GetCapturedStderr();
  return code;
}

TEST(RunToolMainTest, ExitCodesErrorLinesAndTheOutOfMemoryHint) {
  std::string err;
  EXPECT_EQ(RunSample([] { return absl::OkStatus(); }, &err), 0);
  EXPECT_EQ(err, "");
  EXPECT_EQ(
      RunSample([] { return absl::InvalidArgumentError("--top_k=-1: must be >= 0"); }, &err), 2);
  EXPECT_EQ(err, "sample: error: --top_k=-1: must be >= 0\n");
  EXPECT_EQ(RunSample([]() -> absl::Status { throw std::runtime_error("disk gone"); }, &err), 1);
  EXPECT_EQ(err, "sample: error: disk gone\n");
  EXPECT_EQ(
      RunSample([] { return absl::ResourceExhaustedError("No space left on device"); }, &err), 1);
  EXPECT_EQ(err, "sample: error: No space left on device\n");
  EXPECT_EQ(RunSample([]() -> absl::Status {
              throw tensor::OutOfMemoryError("[memory] out of memory on cpu: 4 TiB asked for");
            }, &err), 1);
  EXPECT_EQ(err,
            "sample: error: [memory] out of memory on cpu: 4 TiB asked for\n"
            "sample: ask for fewer --max_new_tokens\n");
}

}  // namespace
}  // namespace train
