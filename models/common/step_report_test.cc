// The step line, the JSON-lines metrics (resume drops the steps run again,
// loss scaling's fields) and the refusal of a gradient norm that is not finite.
#include "models/common/step_report.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/memory_ledger.h"

namespace train {
namespace {

// Resuming after step 2 drops the records of steps 3 and 4 that the stopped
// run wrote; other lines stay, and writing goes on at the end.
TEST(MetricsWriterTest, DropAfterRemovesTheStepsRunAgain) {
  const std::string path = ::testing::TempDir() + "/metrics_drop.jsonl";
  {
    std::ofstream f(path);
    f << "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":2,\"eval_loss\":4.5}\n"
      << "{\"note\":\"kept\"}\n{\"step\":3,\"loss\":3}\n{\"step\":4,\"eval_loss\":3.5}\n";
  }
  absl::StatusOr<std::unique_ptr<MetricsWriter>> w = MetricsWriter::Open(path);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->DropAfter(2).ok());
  ASSERT_TRUE((*w)->WriteEval(3, 2.5, 1.0).ok());
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "{\"step\":1,\"loss\":5}");
  EXPECT_EQ(lines[2], "{\"step\":2,\"eval_loss\":4.5}");
  EXPECT_EQ(lines[3], "{\"note\":\"kept\"}");
  EXPECT_EQ(lines[4].rfind("{\"step\":3,\"eval_loss\":2.5", 0), 0u) << lines[4];
  // An empty path writes and drops nothing.
  EXPECT_TRUE(MetricsWriter::Open("").value()->DropAfter(0).ok());
}

TEST(CheckGradNormTest, ANormThatIsNotFiniteNamesTheStep) {
  EXPECT_TRUE(CheckGradNorm(0.0, 3).ok());
  EXPECT_TRUE(CheckGradNorm(1e30, 3).ok());
  for (double norm : {std::numeric_limits<double>::infinity(),
                      std::numeric_limits<double>::quiet_NaN()}) {
    const absl::Status s = CheckGradNorm(norm, 7);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(s.message(), absl::StrCat("the gradient norm is ", norm,
                                        " at step 7 (the loss was finite); the step was not "
                                        "applied; lower --lr or check the data"));
  }
}

// Report(step_done, result, lr, ms) writes what Report(StepMetrics) does.
TEST(StepReporterTest, ReportsAStepResult) {
  const std::string path = ::testing::TempDir() + "/report_step_result.jsonl";
  std::filesystem::remove(path);
  std::unique_ptr<MetricsWriter> metrics = MetricsWriter::Open(path).value();
  tensor::MemoryLedger ledger;
  StepReporter reporter(ledger, *metrics, 0, 2, 10, 1000);
  StepResult result;
  result.loss = 2.5;
  result.grad_norm = 0.75;
  ASSERT_TRUE(reporter.Report(1, result, 1e-3, 500).ok());
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line.rfind("{\"step\":1,\"loss\":2.500000,\"lr\":0.001,\"ms\":500.000,"
                       "\"tokens_per_s\":2000.0,\"grad_norm\":0.75,\"memory\":",
                       0),
            0)
      << line;
  // Under loss scaling: the step's scale, and whether it was skipped.
  result.skipped = true;
  ASSERT_TRUE(reporter.Report(2, result, 1e-3, 500, 65536).ok());
  result.skipped = false;
  ASSERT_TRUE(reporter.Report(3, result, 1e-3, 500, 32768).ok());
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_NE(line.find("\"grad_norm\":0.75,\"loss_scale\":65536,\"skipped\":true,\"memory\":"),
            std::string::npos)
      << line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_NE(line.find("\"grad_norm\":0.75,\"loss_scale\":32768,\"memory\":"), std::string::npos)
      << line;
}

}  // namespace
}  // namespace train
