// FinishOneProcessStep does what the train binaries' plain loop did inline:
// masters back, unscale, clip, step, drop the gradients; a non-finite loss is an
// error and an inf gradient skips the step.
#include "models/common/one_process_step.h"

#include <cmath>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/common/loss_scaling.h"
#include "models/common/train_support.h"
#include "models/common/train_support_testing.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/mixed_precision.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/param_ref.h"
#include "precision/policy.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace train {
namespace {

mingpt::GptConfig Config() {
  mingpt::GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 16;
  c.block_size = 8;
  c.dropout = 0;
  return c;
}

std::unique_ptr<optim::Optimizer> MakeAdamW() {
  optim::AdamWOptions o;
  o.lr = 1e-2;
  return optim::AdamW::Create(o).value();
}

LossScaling Scaling(const std::string& spec) {
  const std::optional<double> init =
      spec == "dynamic" ? std::optional<double>(1024) : std::nullopt;
  return LossScaling::FromFlags(spec, init, false).value();
}

void ExpectSameValues(mingpt::GPT& a, mingpt::GPT& b) {
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(tensor::testing::AllClose(pa[i].second->value, pb[i].second->value, 0, 0))
        << pa[i].first;
  }
}

// The step drops the gradients (ZeroGrad(set_to_none=true)): none is held
// between steps, and the next backward writes each one anew.
void ExpectNoGrads(mingpt::GPT& model) {
  for (const auto& [name, p] : model.NamedParameters()) {
    EXPECT_FALSE(p->grad.defined()) << name;
  }
}

// The step written out as the loops did before (gradients zeroed in place),
// and through the function: the same parameters, loss and norm, the
// gradients dropped.
TEST(FinishOneProcessStepTest, EqualsTheStepWrittenOut) {
  const testing::TinyBatch batch = testing::MakeTinyBatch();
  mingpt::GPT expected(Config()), model(Config());
  expected.Materialize(1);
  model.Materialize(1);
  auto expected_opt = MakeAdamW(), opt = MakeAdamW();
  const double grad_clip = 0.05;  // small enough to clip

  const double expected_loss = expected.ForwardBackward(batch.idx, batch.tgt);
  std::vector<optim::ParamRef> refs = optim::FromModule(expected);
  const double expected_norm = optim::ClipGradNorm(refs, grad_clip);
  ASSERT_GT(expected_norm, grad_clip);
  expected_opt->Step(refs);
  expected.ZeroGrad();

  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Fp32());
  LossScaling scaling = Scaling("none");
  mixed.CastForCompute();
  const double loss = model.ForwardBackward(batch.idx, batch.tgt);
  absl::StatusOr<StepResult> done =
      FinishOneProcessStep(model, mixed, *opt, loss, scaling.scale(), 0, grad_clip, scaling);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->loss, expected_loss);
  EXPECT_EQ(done->grad_norm, expected_norm);
  ExpectSameValues(model, expected);
  ExpectNoGrads(model);
}

// Mixed precision: the parameters are the fp32 masters again afterwards,
// also when the loss was not finite (an error naming the step).
TEST(FinishOneProcessStepTest, RestoresMastersAndRefusesANonFiniteLoss) {
  mingpt::GPT model(Config());
  model.Materialize(1);
  auto opt = MakeAdamW();
  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Bf16());
  LossScaling scaling = Scaling("none");
  mixed.CastForCompute();
  ASSERT_EQ(model.NamedParameters()[0].second->value.dtype(), tensor::Dtype::kBF16);
  absl::StatusOr<StepResult> done = FinishOneProcessStep(
      model, mixed, *opt, std::numeric_limits<double>::quiet_NaN(), 1.0, 6, 1.0, scaling);
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kInternal);
  // The step counted from 1, as the step lines say it (index 6: step 7).
  EXPECT_NE(done.status().message().find("loss is nan at step 7"), std::string::npos)
      << done.status();
  for (const auto& [name, p] : model.NamedParameters()) {
    EXPECT_EQ(p->value.dtype(), tensor::Dtype::kF32) << name;
  }
}

// bf16 mixed precision over steps: the optimizer writes the next step's
// compute copies (the kept buffers, no cast), and training goes exactly as
// with a cast of every master at each step (RestoreMasters, a plain Step).
TEST(FinishOneProcessStepTest, TheOptimizerWritesTheNextComputeCopies) {
  const testing::TinyBatch batch = testing::MakeTinyBatch();
  mingpt::GPT expected(Config()), model(Config());
  expected.Materialize(1);
  model.Materialize(1);
  auto expected_opt = MakeAdamW(), opt = MakeAdamW();
  nn::MixedPrecision expected_mixed(expected, precision::MixedPrecisionPolicy::Bf16());
  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Bf16());
  LossScaling scaling = Scaling("none");
  std::vector<tensor::Tensor> last_copies;
  for (int step = 0; step < 3; ++step) {
    expected_mixed.CastForCompute();
    const double expected_loss = expected.ForwardBackward(batch.idx, batch.tgt);
    expected_mixed.RestoreMasters();
    expected_opt->Step(optim::FromModule(expected));
    expected.ZeroGrad();

    mixed.CastForCompute();
    std::vector<tensor::Tensor> copies;
    for (const auto& [name, p] : model.NamedParameters()) copies.push_back(p->value);
    if (step > 0) {  // the buffers the last step kept and its optimizer wrote
      for (size_t i = 0; i < copies.size(); ++i) {
        EXPECT_TRUE(copies[i].SharesStorageWith(last_copies[i])) << "step " << step << " #" << i;
      }
    }
    const double loss = model.ForwardBackward(batch.idx, batch.tgt);
    absl::StatusOr<StepResult> done =
        FinishOneProcessStep(model, mixed, *opt, loss, scaling.scale(), step, 0, scaling);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->loss, expected_loss) << "step " << step;
    ExpectSameValues(model, expected);
    last_copies = copies;
  }
  // The copies written by the last step are the masters' casts.
  mixed.CastForCompute();
  expected_mixed.CastForCompute();
  ExpectSameValues(model, expected);
}

// Two micro-batches a step: the first backward writes the dropped gradients
// anew, the second adds to them, as both adding to zeroed buffers did (the
// same bits), step after step.
TEST(FinishOneProcessStepTest, DroppedGradientsAreWrittenThenAccumulated) {
  const testing::TinyBatch batch = testing::MakeTinyBatch();
  mingpt::GPT expected(Config()), model(Config());
  expected.Materialize(1);
  model.Materialize(1);
  auto expected_opt = MakeAdamW(), opt = MakeAdamW();
  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Fp32());
  LossScaling scaling = Scaling("none");
  expected.ZeroGrad();  // buffers of zeros, kept
  for (int step = 0; step < 3; ++step) {
    expected.ForwardBackward(batch.idx, batch.tgt, 0.5);
    expected.ForwardBackward(batch.tgt, batch.idx, 0.5);
    expected_opt->Step(optim::FromModule(expected));
    expected.ZeroGrad();

    mixed.CastForCompute();
    const double loss = 0.5 * (model.ForwardBackward(batch.idx, batch.tgt, 0.5) +
                               model.ForwardBackward(batch.tgt, batch.idx, 0.5));
    absl::StatusOr<StepResult> done =
        FinishOneProcessStep(model, mixed, *opt, loss, scaling.scale(), step, 0, scaling);
    ASSERT_TRUE(done.ok()) << done.status();
    ExpectSameValues(model, expected);
    ExpectNoGrads(model);
  }
}

// A step (the 0-based `step`) whose backward at `scaling`'s scale was finite
// but left an inf in a gradient: FinishOneProcessStep's result. In either
// outcome the parameters are not updated and the gradients are dropped.
absl::StatusOr<StepResult> StepWithAnInfGradient(LossScaling& scaling, int64_t step) {
  const testing::TinyBatch batch = testing::MakeTinyBatch();
  mingpt::GPT model(Config()), untouched(Config());
  model.Materialize(1);
  untouched.Materialize(1);
  auto opt = MakeAdamW();
  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Fp32());
  const double scale = scaling.scale();
  mixed.CastForCompute();
  const double loss = model.ForwardBackward(batch.idx, batch.tgt, scale);
  EXPECT_TRUE(std::isfinite(loss));
  model.NamedParameters()[1].second->grad.data<float>()[2] = std::numeric_limits<float>::infinity();
  absl::StatusOr<StepResult> done =
      FinishOneProcessStep(model, mixed, *opt, loss, scale, step, 1.0, scaling);
  ExpectSameValues(model, untouched);
  ExpectNoGrads(model);
  return done;
}

// Under loss scaling: the step is skipped (norm 0), the dynamic scale halved.
TEST(FinishOneProcessStepTest, AnInfGradientSkipsTheStep) {
  LossScaling scaling = Scaling("dynamic");
  const double scale = scaling.scale();
  absl::StatusOr<StepResult> done = StepWithAnInfGradient(scaling, 0);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->grad_norm, 0.0);
  EXPECT_EQ(scaling.skipped_steps(), 1);
  EXPECT_EQ(scaling.scale(), scale / 2);
}

// Without loss scaling (fp32, bf16) nothing checks the gradients before the
// clip: the norm is inf, which stops the run before the optimizer step, so
// the weights (and what a checkpoint would save) stay finite.
TEST(FinishOneProcessStepTest, AnInfGradientNormWithoutLossScalingStopsBeforeTheStep) {
  LossScaling scaling = Scaling("none");
  absl::StatusOr<StepResult> done = StepWithAnInfGradient(scaling, 4);
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(done.status().message().find("the gradient norm is inf at step 5"), std::string::npos)
      << done.status();
}

// A sample whose forward throws (an id out of the vocabulary) leaves the
// model training as before: in training mode, the fp32 masters as its
// parameters.
// (OneProcessModel::PrintSample's PrintSampleInOneProcess.)
TEST(OneProcessModelTest, AFailedSampleLeavesTheModelTraining) {
  mingpt::GPT model(Config());
  model.Materialize(1);
  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Bf16());
  const std::vector<int64_t> ids = {0, 1, Config().vocab_size};
  const tensor::Tensor bad = tensor::Tensor::FromData<int64_t>(ids, {1, 3});  // (1, 3)
  bool drawn = false;
  EXPECT_THROW(PrintSampleInOneProcess(model, mixed,
                                       [&]() -> absl::StatusOr<std::string> {
                                         EXPECT_FALSE(model.is_training());
                                         drawn = true;
                                         model.LastLogits(bad);
                                         return std::string("never");
                                       }),
               std::exception);
  EXPECT_TRUE(drawn);
  EXPECT_TRUE(model.is_training());
  for (const auto& [name, p] : model.NamedParameters()) {
    EXPECT_EQ(p->value.dtype(), tensor::Dtype::kF32) << name;
  }
}

// A fresh start is planned before the data and the model are made, the
// folder locked only then: a run that saved into it meanwhile is refused
// under the lock, not replaced. A resume is prepared as before.
TEST(OneProcessModelTest, AFreshStartIsCheckedAgainUnderTheLock) {
  const std::string dir = ::testing::TempDir() + "/saved_meanwhile";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(CheckFreshCheckpointDir(dir).ok());  // the plan: a fresh start
  TrainState state;
  testing::SaveAfterOneStep(testing::SmallConfig(), dir, state);  // another run, meanwhile
  mingpt::GPT model(Config());
  model.Materialize(1);
  std::unique_ptr<optim::Optimizer> opt = MakeAdamW();
  {
    OneProcessModel fresh(model, *opt, precision::MixedPrecisionPolicy::Fp32());
    const absl::Status s = fresh.PrepareToTrain(dir, "", /*auto_fresh=*/false, /*logs=*/false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("holds an earlier run's checkpoints (latest: step_000001)"),
              std::string::npos)
        << s;
  }
  OneProcessModel resuming(model, *opt, precision::MixedPrecisionPolicy::Fp32());
  EXPECT_TRUE(resuming.PrepareToTrain(dir, "latest", false, false).ok());
}

}  // namespace
}  // namespace train
