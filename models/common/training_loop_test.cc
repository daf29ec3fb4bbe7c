// RunTrainingLoop's order of work, with a Trainer and a loader that record
// what the loop asks of them: each step's checkpoint (every
// --checkpoint_every steps, and the last) comes after the step's report and
// before its evaluation and sample, so an evaluation or sample that fails
// (a sample running out of memory) loses nothing the run trained.
#include "models/common/training_loop.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "models/common/step_report.h"
#include "nn/linear.h"
#include "optim/sgd.h"

namespace train {
namespace {

struct FakeBatch {};

// Batches of nothing; its position is the step Next() returns next.
class FakeLoader {
 public:
  FakeBatch Next() {
    ++step_;
    return {};
  }
  data::LoaderState state() const { return {step_, "fake"}; }
  absl::Status Restore(const data::LoaderState& saved) {
    step_ = saved.step;
    return absl::OkStatus();
  }

 private:
  int64_t step_ = 0;
};

// Records "step N", "eval", "sample", "save N"; the evaluation or the sample
// after step `fail_after` fails.
class RecordingTrainer : public Trainer {
 public:
  explicit RecordingTrainer(std::vector<std::string>& events)
      : events_(events), sgd_(optim::SGD::Create(optim::SgdOptions()).value()) {}
  optim::Optimizer& optimizer() override { return *sgd_; }
  absl::Status PrepareToTrain(const std::string&, const std::string&, bool, bool) override {
    return absl::OkStatus();
  }
  absl::StatusOr<Resumed> Resume(const std::string&, const std::string&,
                                 const std::string&) override {
    return absl::UnimplementedError("no resume here");
  }
  double AccumulateGradients(int64_t K,
                             const std::function<double(int64_t m)>& micro_step) override {
    double sum = 0;
    for (int64_t m = 0; m < K; ++m) sum += micro_step(m);
    return sum / K;
  }
  absl::StatusOr<StepResult> FinishTrainingStep(double local_loss, double, int64_t step, double,
                                                LossScaling&, bool) override {
    step_done_ = step + 1;
    events_.push_back(absl::StrCat("step ", step_done_));
    StepResult r;
    r.loss = local_loss;
    return r;
  }
  absl::StatusOr<double> Evaluate(const std::function<double()>& local_loss) override {
    events_.push_back("eval");
    if (fail_eval_after == step_done_) return absl::InternalError("the evaluation failed");
    return local_loss();
  }
  absl::Status PrintSample(const SampleSchedule&, bool,
                           const std::function<absl::StatusOr<std::string>()>& draw) override {
    events_.push_back("sample");
    if (fail_sample_after == step_done_) {
      return absl::ResourceExhaustedError("out of memory drawing the sample");
    }
    return draw().status();
  }
  absl::Status SaveCheckpoint(const std::string&, const TrainState& state) override {
    events_.push_back(absl::StrCat("save ", state.step));
    return absl::OkStatus();
  }

  int64_t fail_eval_after = -1;
  int64_t fail_sample_after = -1;

 private:
  std::vector<std::string>& events_;
  std::unique_ptr<optim::Optimizer> sgd_;
  int64_t step_done_ = 0;
};

// Runs `steps` steps with a checkpoint every 2, an evaluation and a sample
// after every step; returns the loop's status and fills `events`.
absl::Status RunSteps(int64_t steps, RecordingTrainer& trainer) {
  nn::Linear model(2, 2);
  FakeLoader loader;
  tensor::MemoryLedger ledger;
  std::unique_ptr<MetricsWriter> metrics = MetricsWriter::Open("").value();
  optim::ConstantLr schedule(0.1);
  SampleSchedule sampling;
  sampling.every = 1;
  const LossScaling scaling = LossScaling::FromFlags("none", std::nullopt, false).value();
  TrainingLoopSettings s;
  s.steps = steps;
  s.checkpoint_every = 2;
  s.checkpoint_dir = "/nonexistent/the/fake/trainer/saves/nothing";
  s.eval.every = 1;
  s.ledger = &ledger;
  s.schedule = &schedule;
  s.metrics = metrics.get();
  s.sample_schedule = &sampling;
  s.scaling = &scaling;
  TrainingLoopParts<FakeLoader> parts;
  parts.model = &model;
  parts.trainer = &trainer;
  parts.loader = &loader;
  parts.to_device = [](FakeBatch&) {};
  parts.forward_backward = [](const FakeBatch&, int64_t, double) { return 1.0; };
  parts.eval_loss = [] { return 2.0; };
  parts.draw = [](int64_t step_done) -> absl::StatusOr<std::string> {
    return absl::StrCat("sample after ", step_done);
  };
  return RunTrainingLoop(s, parts);
}

TEST(TrainingLoopTest, TheStepsCheckpointComesBeforeItsEvaluationAndSample) {
  std::vector<std::string> events;
  RecordingTrainer trainer(events);
  ASSERT_TRUE(RunSteps(3, trainer).ok());
  EXPECT_EQ(absl::StrJoin(events, ", "),
            "step 1, eval, sample, step 2, save 2, eval, sample, step 3, save 3, eval, sample");
}

// A sample that runs out of memory after the last step, or an evaluation
// that fails: the run fails with that error, its last checkpoint saved.
TEST(TrainingLoopTest, AFailureAfterTheLastStepKeepsItsCheckpoint) {
  for (bool sample : {true, false}) {
    SCOPED_TRACE(sample ? "sample" : "evaluation");
    std::vector<std::string> events;
    RecordingTrainer trainer(events);
    (sample ? trainer.fail_sample_after : trainer.fail_eval_after) = 3;
    const absl::Status s = RunSteps(3, trainer);
    EXPECT_EQ(s.code(), sample ? absl::StatusCode::kResourceExhausted
                               : absl::StatusCode::kInternal)
        << s;
    EXPECT_EQ(absl::StrJoin(events, ", "),
              absl::StrCat("step 1, eval, sample, step 2, save 2, eval, sample, step 3, save 3, ",
                           sample ? "eval, sample" : "eval"));
  }
}

}  // namespace
}  // namespace train
