// --loss_scale: the modes, their errors, skipping and backing off, and the
// checkpointed state.
#include "models/common/loss_scaling.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace train {
namespace {

TEST(LossScalingTest, ModesAndTheirDefaults) {
  LossScaling none = *LossScaling::FromFlags("auto", std::nullopt, /*needs_scaling=*/false);
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(none.scale(), 1.0);
  EXPECT_EQ(none.Describe(), "none");
  LossScaling fp16 = *LossScaling::FromFlags("auto", 65536, /*needs_scaling=*/true);
  EXPECT_TRUE(fp16.enabled());
  EXPECT_EQ(fp16.scale(), 65536.0);
  EXPECT_EQ(fp16.Describe(), "dynamic (now 65536)");
  LossScaling fixed = *LossScaling::FromFlags("1024", std::nullopt, false);
  EXPECT_EQ(fixed.scale(), 1024.0);
  EXPECT_EQ(fixed.Describe(), "fixed 1024");
}

TEST(LossScalingTest, BadFlagsAreNamed) {
  auto error = [](const std::string& spec, std::optional<double> init, bool fp16) {
    return std::string(LossScaling::FromFlags(spec, init, fp16).status().message());
  };
  EXPECT_NE(error("lots", 1, false).find("--loss_scale='lots' is not auto, none, dynamic"),
            std::string::npos);
  EXPECT_NE(error("-2", 1, false).find("--loss_scale='-2'"), std::string::npos);
  EXPECT_NE(error("inf", 1, false).find("--loss_scale='inf'"), std::string::npos);
  EXPECT_NE(error("1e39", std::nullopt, false).find("--loss_scale='1e39' is above 2^64"),
            std::string::npos);
  EXPECT_NE(error("dynamic", 1e300, false).find("--init_loss_scale=1e+300 is above 2^150"),
            std::string::npos);
  // fp16 (needs_scaling): its gradients overflow at 2^16, so the bound is 2^64.
  EXPECT_NE(error("dynamic", 1e30, true).find("--init_loss_scale=1e+30 is above 2^64"),
            std::string::npos);
  EXPECT_EQ(error("dynamic", 1e30, false), "");  // bf16 / fp32: within fp32's range
  // Too small: 1/scale overflows fp32 when the gradients are unscaled.
  EXPECT_NE(error("1e-39", std::nullopt, false).find("--loss_scale='1e-39' is below 2^-64"),
            std::string::npos);
  EXPECT_NE(error("dynamic", 1e-300, false).find("--init_loss_scale=1e-300 is below 2^-64"),
            std::string::npos);
  EXPECT_EQ(error("0.5", std::nullopt, false), "");
  EXPECT_NE(error("dynamic", 0, false).find("--init_loss_scale=0 must be a positive"),
            std::string::npos);
  EXPECT_NE(error("none", 1, true).find("--loss_scale=none with --precision=fp16"),
            std::string::npos);
  // --init_loss_scale is dynamic's: refused where it would be ignored.
  EXPECT_EQ(error("auto", 1024, false),
            "--init_loss_scale=1024 is the first scale of --loss_scale=dynamic, and "
            "--loss_scale=auto means none without fp16: add --loss_scale=dynamic or drop "
            "--init_loss_scale");
  EXPECT_NE(error("128", 1024, false).find("--loss_scale=128 is not dynamic"), std::string::npos);
  EXPECT_NE(error("none", 1024, false).find("--init_loss_scale=1024"), std::string::npos);
  EXPECT_TRUE(LossScaling::FromFlags("auto", 1024, /*needs_scaling=*/true).ok());
  EXPECT_EQ(LossScaling::FromFlags("dynamic", std::nullopt, false)->scale(), 65536.0);
}

TEST(LossScalingTest, NonFiniteStepsAreSkippedAndTheDynamicScaleBacksOff) {
  LossScaling d = *LossScaling::FromFlags("dynamic", 1024, false);
  EXPECT_FALSE(d.Update(true));
  EXPECT_EQ(d.scale(), 512.0);
  EXPECT_TRUE(d.Update(false));
  EXPECT_EQ(d.scale(), 512.0);
  EXPECT_EQ(d.skipped_steps(), 1);
  LossScaling f = *LossScaling::FromFlags("8", std::nullopt, false);
  EXPECT_FALSE(f.Update(true));
  EXPECT_EQ(f.scale(), 8.0);  // a fixed scale stays
  EXPECT_TRUE(f.Update(false));
  EXPECT_EQ(f.skipped_steps(), 1);
}

TEST(LossScalingTest, FinishStepUnscalesUpdatesAndPassesErrorsOn) {
  LossScaling none = *LossScaling::FromFlags("none", std::nullopt, false);
  bool called = false;
  auto unscale = [&](double) -> absl::StatusOr<bool> {
    called = true;
    return false;
  };
  EXPECT_TRUE(*none.FinishStep(1.0, 1, false, unscale));
  EXPECT_FALSE(called) << "nothing to unscale without scaling";
  LossScaling d = *LossScaling::FromFlags("dynamic", 8, false);
  double seen = 0;
  absl::StatusOr<bool> apply = d.FinishStep(8.0, 1, false, [&](double inv) -> absl::StatusOr<bool> {
    seen = inv;
    return true;  // inf/nan found
  });
  EXPECT_EQ(seen, 0.125);
  EXPECT_FALSE(*apply);
  EXPECT_EQ(d.scale(), 4.0);
  apply = d.FinishStep(4.0, 2, false, [](double) -> absl::StatusOr<bool> {
    return absl::DeadlineExceededError("peer gone");
  });
  EXPECT_EQ(apply.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(d.scale(), 4.0) << "an error changes nothing";
}

// Every step skipped is a run that does not train: the 50th in a row is an
// error naming the step; a step applied in between starts the count again.
TEST(LossScalingTest, FiftyStepsSkippedInARowStopTheRun) {
  for (const char* spec : {"dynamic", "1024"}) {
    SCOPED_TRACE(spec);
    LossScaling s = *LossScaling::FromFlags(spec, std::nullopt, false);
    auto found = [](bool inf) {
      return [inf](double) -> absl::StatusOr<bool> { return inf; };
    };
    int64_t step = 1;
    for (int i = 0; i + 1 < LossScaling::kMaxSkippedInARow; ++i) {
      ASSERT_FALSE(*s.FinishStep(s.scale(), step++, false, found(true)));
    }
    ASSERT_TRUE(*s.FinishStep(s.scale(), step++, false, found(false)));
    for (int i = 0; i + 1 < LossScaling::kMaxSkippedInARow; ++i) {
      ASSERT_FALSE(*s.FinishStep(s.scale(), step++, false, found(true)));
    }
    const double scale = s.scale();
    absl::StatusOr<bool> last = s.FinishStep(scale, step, false, found(true));
    EXPECT_EQ(last.status().code(), absl::StatusCode::kInternal);
    EXPECT_EQ(last.status().message(),
              absl::StrCat("inf/nan gradients in 50 steps in a row, the last at step ", step,
                           " at loss scale ", scale,
                           ": every one was skipped, so the run is not training; lower --lr or "
                           "check the data"));
  }
}

// The count of steps skipped in a row goes into checkpoints: a run resumed
// after 30 of them stops at the 20th more, as the uninterrupted run would.
TEST(LossScalingTest, StepsSkippedInARowContinueAcrossAResume) {
  for (const char* spec : {"dynamic", "1024"}) {
    SCOPED_TRACE(spec);
    auto found_inf = [](double) -> absl::StatusOr<bool> { return true; };
    LossScaling a = *LossScaling::FromFlags(spec, std::nullopt, false);
    for (int64_t step = 1; step <= 30; ++step) {
      ASSERT_FALSE(*a.FinishStep(a.scale(), step, false, found_inf));
    }
    std::map<std::string, std::string> extra;
    a.Save(extra);
    EXPECT_EQ(extra.at("loss_scale_skipped_in_a_row"), "30");
    LossScaling b = *LossScaling::FromFlags(spec, std::nullopt, false);
    ASSERT_TRUE(b.Restore(extra).ok());
    for (int64_t step = 31; step < 50; ++step) {
      ASSERT_FALSE(*b.FinishStep(b.scale(), step, false, found_inf));
    }
    EXPECT_EQ(b.FinishStep(b.scale(), 50, false, found_inf).status().code(),
              absl::StatusCode::kInternal);
    extra["loss_scale_skipped_in_a_row"] = "50";
    EXPECT_EQ(b.Restore(extra).code(), absl::StatusCode::kDataLoss);
  }
}

TEST(LossScalingTest, StateRoundTripsThroughACheckpoint) {
  LossScaling a = *LossScaling::FromFlags("dynamic", 1024, false);
  a.Update(true);
  a.Update(false);
  std::map<std::string, std::string> extra;
  a.Save(extra);
  EXPECT_EQ(extra.at("loss_scale"), "512");
  EXPECT_EQ(extra.at("loss_scale_good_steps"), "1");
  LossScaling b = *LossScaling::FromFlags("dynamic", 65536, false);
  ASSERT_TRUE(b.Restore(extra).ok());
  EXPECT_EQ(b.scale(), 512.0);
  extra["loss_scale"] = "-1";
  EXPECT_EQ(b.Restore(extra).code(), absl::StatusCode::kDataLoss);
  extra["loss_scale"] = "inf";  // would skip every step: inf * 0.5 is inf
  EXPECT_EQ(b.Restore(extra).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(b.scale(), 512.0);
  std::map<std::string, std::string> none;
  EXPECT_TRUE(b.Restore(none).ok());  // a checkpoint from a run without scaling
  EXPECT_EQ(b.scale(), 512.0);
}

// What a resume changes that the flags did not say is noted.
TEST(LossScalingTest, RestoreNoteSaysWhatTheCheckpointChanges) {
  std::map<std::string, std::string> extra = {{"loss_scale", "65536"},
                                              {"loss_scale_good_steps", "6"}};
  LossScaling dynamic = *LossScaling::FromFlags("dynamic", 1024, false);
  EXPECT_EQ(dynamic.RestoreNote(extra),
            "the dynamic loss scale continues from the checkpoint's 65536 in place of the "
            "initial 1024 (--init_loss_scale applies to a fresh start)");
  ASSERT_TRUE(dynamic.Restore(extra).ok());
  EXPECT_EQ(dynamic.RestoreNote(extra), "");  // the same scale: nothing to say
  LossScaling fixed = *LossScaling::FromFlags("1024", std::nullopt, false);
  EXPECT_EQ(fixed.RestoreNote(extra),
            "the checkpoint's dynamic loss scale (65536) is not continued: this run's loss scale "
            "is fixed 1024");
  LossScaling none = *LossScaling::FromFlags("none", std::nullopt, false);
  EXPECT_EQ(none.RestoreNote(extra),
            "the checkpoint's dynamic loss scale (65536) is not continued: this run's loss scale "
            "is none");
  EXPECT_EQ(dynamic.RestoreNote({}), "");  // a checkpoint without a dynamic scale
}

// A bf16 run's scale grows freely (no overflow to back it off); resumed with
// fp16 a scale past 2^64 would take more than the 50 halvings a run allows
// to reach fp16's range: the run starts from its initial scale, and says so.
TEST(LossScalingTest, AScaleTooHighForThisPrecisionIsNotContinued) {
  const std::map<std::string, std::string> extra = {{"loss_scale", "1e30"},
                                                    {"loss_scale_good_steps", "6"}};
  LossScaling fp16 = *LossScaling::FromFlags("dynamic", std::nullopt, /*needs_scaling=*/true);
  EXPECT_EQ(fp16.RestoreNote(extra),
            "the checkpoint's dynamic loss scale (1e+30) is above 2^64, where this run's "
            "precision may start: it starts from the initial 65536 instead");
  ASSERT_TRUE(fp16.Restore(extra).ok());
  EXPECT_EQ(fp16.scale(), 65536.0);
  // The same checkpoint in a bf16 run continues.
  LossScaling bf16 = *LossScaling::FromFlags("dynamic", std::nullopt, /*needs_scaling=*/false);
  ASSERT_TRUE(bf16.Restore(extra).ok());
  EXPECT_EQ(bf16.scale(), 1e30);
}

TEST(LossScalingTest, UnscaleGradientsFindsInfAndNan) {
  tensor::Tensor g = tensor::Tensor::FromVector({2.0f, 4.0f}, {2});
  std::vector<optim::ParamRef> refs = {
      optim::MakeParamRef("w", tensor::Tensor::Zeros({2}), g, true)};
  EXPECT_FALSE(UnscaleGradients(refs, 0.5));
  EXPECT_EQ(g.ToVector<float>(), (std::vector<float>{1.0f, 2.0f}));
  g.data<float>()[1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(UnscaleGradients(refs, 0.5));
}

}  // namespace
}  // namespace train
