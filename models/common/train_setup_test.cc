// RunTrainMain, the train binaries' main: the exit code of each outcome, the
// error line on stderr, and after running out of memory (an OutOfMemoryError
// thrown, or a ResourceExhausted error a rank returned) the flags that lower
// what a rank needs; nothing more after other errors.
#include "models/common/train_setup.h"

#include <cstdint>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/allocator.h"
#include "tensor/error.h"

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

// on_failure sees every failure, thrown ones too (the binaries tell the
// ranks waiting for this one), and nothing of a success.
TEST(RunTrainMainTest, OnFailureSeesTheFailure) {
  std::vector<std::string> seen;
  const auto record = [&](const absl::Status& s) { seen.push_back(s.ToString()); };
  EXPECT_EQ(RunTrainMain([] { return absl::OkStatus(); }, record), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunTrainMain([] { return absl::InvalidArgumentError("--data=x: missing"); }, record),
            2);
  EXPECT_EQ(RunTrainMain([]() -> absl::Status { throw std::runtime_error("disk gone"); }, record),
            1);
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], "INVALID_ARGUMENT: --data=x: missing");
  EXPECT_THAT(seen[1], HasSubstr("disk gone"));
}

TEST(ResolveDeviceTest, AnUnknownDeviceNamesTheFlag) {
  absl::StatusOr<tensor::Device> device = ResolveDevice("gpu");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().message(),
            "--device=gpu: unknown device 'gpu'; expected cpu, cuda or cuda:N");
}

TEST(CheckLoopFlagsTest, NamesTheFlagThatIsOutOfRange) {
  EXPECT_TRUE(CheckLoopFlags(0, 1, 0, "").ok());  // zero steps: nothing to train
  EXPECT_TRUE(CheckLoopFlags(100, 10, 20, "/tmp/ck").ok());
  const auto message = [](int64_t steps, int64_t log_every, int64_t every, const char* dir) {
    absl::Status s = CheckLoopFlags(steps, log_every, every, dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  EXPECT_EQ(message(-3, 10, 0, ""), "--steps=-3 must be >= 0");
  EXPECT_EQ(message(5, 0, 0, ""),
            "--log_every=0 must be >= 1 (the first and last steps always print)");
  EXPECT_EQ(message(5, 1, -1, "/tmp/ck"),
            "--checkpoint_every=-1 must be >= 0 (0: at the end only)");
  EXPECT_EQ(message(5, 1, 2, ""), "--checkpoint_every=2 needs --checkpoint_dir to save into");
}

// --eval_every and --eval_batches given with nothing to evaluate (no
// --eval_data, no --val_fraction) are refused, naming the flag and what to
// give, rather than ignored; unset, or with evaluation data, they are fine.
TEST(OpenDataSourcesTest, EvalScheduleWithoutEvaluationDataIsAnError) {
  EvalFlags flags;
  absl::StatusOr<DataSources> plain = OpenDataSources("random", flags, 1, 64);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->eval, nullptr);
  flags.every = 5;
  flags.every_given = true;
  absl::StatusOr<DataSources> every = OpenDataSources("random", flags, 1, 64);
  EXPECT_EQ(every.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(every.status().message(), HasSubstr("--eval_every=5 without evaluation data"));
  EXPECT_THAT(every.status().message(), HasSubstr("--eval_data"));
  EXPECT_THAT(every.status().message(), HasSubstr("--val_fraction"));
  flags.every = 0;  // given as its default value: still given
  EXPECT_THAT(OpenDataSources("random", flags, 1, 64).status().message(),
              HasSubstr("--eval_every=0 without evaluation data"));
  flags.every_given = false;
  flags.batches = 2;
  flags.batches_given = true;
  absl::StatusOr<DataSources> batches = OpenDataSources("random", flags, 1, 64);
  EXPECT_EQ(batches.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batches.status().message(), HasSubstr("--eval_batches=2 without evaluation data"));
  // With evaluation data they apply.
  flags.every = 5;
  flags.every_given = true;
  flags.data = "random";
  absl::StatusOr<DataSources> both = OpenDataSources("random", flags, 1, 64);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_NE(both->eval, nullptr);
}

// --init_from on byte-level text: weights whose ids are a tokenizer's (a
// recorded tokenizer, or a Hugging Face model whose vocabulary is not 256)
// are refused, naming --init_from, --data and //tools:tokenize; byte-level
// weights (ours, maybe padded; a Hugging Face export of 256 ids), token data
// and --tokenizer=none pass.
TEST(CheckInitFromDataTest, RefusesTokenizedWeightsOnByteText) {
  const auto refused = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  const std::string hub =
      refused(CheckInitFromData("auto", "shipped", "/m/gpt2", "/m/gpt2", true, 50257));
  EXPECT_THAT(hub, HasSubstr("--init_from=/m/gpt2 with --data=shipped"));
  EXPECT_THAT(hub, HasSubstr("//tools:tokenize"));
  EXPECT_THAT(hub, HasSubstr("tokens of the tokenizer /m/gpt2 they record"));
  // A Hugging Face folder without vocab.json + merges.txt: its vocabulary tells.
  EXPECT_THAT(refused(CheckInitFromData("auto", "t.txt", "/m/bare", "", true, 50257)),
              HasSubstr("a Hugging Face model of 50257 token ids"));
  EXPECT_THAT(refused(CheckInitFromData("auto", "shipped", "/ck", "gpt2", false, 50304)),
              HasSubstr("tokens of the tokenizer gpt2 they record"));
  // Byte-level weights.
  EXPECT_TRUE(CheckInitFromData("auto", "shipped", "/ck", "", false, 256).ok());
  EXPECT_TRUE(CheckInitFromData("auto", "shipped", "/ck", "", false, 320).ok());  // padded
  EXPECT_TRUE(CheckInitFromData("auto", "shipped", "/hf", "", true, 256).ok());
  // Token data, and --tokenizer=none.
  EXPECT_TRUE(CheckInitFromData("auto", "train.bin", "/m/gpt2", "/m/gpt2", true, 50257).ok());
  EXPECT_TRUE(CheckInitFromData("auto", "random", "/m/gpt2", "/m/gpt2", true, 50257).ok());
  EXPECT_TRUE(CheckInitFromData("none", "shipped", "/m/gpt2", "/m/gpt2", true, 50257).ok());
}

// --optimizer and its options: --momentum is SGD's (0.9 when unset), and an
// error with adamw instead of being ignored.
TEST(MakeOptimizerTest, MomentumIsSgdsAndRefusedWithAdamW) {
  OptimizerSpec spec;
  spec.name = "sgd";
  std::unique_ptr<optim::Optimizer> sgd = MakeOptimizer(spec).value();
  EXPECT_EQ(static_cast<optim::SGD&>(*sgd).options().momentum, 0.9);
  spec.momentum = 0.0;  // plain SGD, asked for
  sgd = MakeOptimizer(spec).value();
  EXPECT_EQ(static_cast<optim::SGD&>(*sgd).options().momentum, 0.0);
  for (double bad : {1.0, 1.5, -0.1, std::nan("")}) {
    spec.momentum = bad;
    const absl::Status s = MakeOptimizer(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("must be in [0, 1)")) << s;
  }
  spec.momentum = 0.0;

  spec.name = "adamw";
  spec.beta2 = 0.95;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> adamw = MakeOptimizer(spec);
  EXPECT_EQ(adamw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(adamw.status().message(), HasSubstr("--momentum=0 is an SGD option"));
  spec.momentum.reset();
  adamw = MakeOptimizer(spec);
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_EQ(static_cast<optim::AdamW&>(**adamw).options().beta2, 0.95);

  spec.name = "lamb";
  EXPECT_THAT(MakeOptimizer(spec).status().message(),
              HasSubstr("--optimizer='lamb' is not one of adamw, sgd"));
}

// "cosine" warms up over 10% of --steps, at least one step, and none when
// --steps=0 (a run that only loads, evaluates or saves).
TEST(MakeLrScheduleTest, CosineWarmsUpATenthOfTheSteps) {
  for (int64_t steps : {0, 5, 100}) {
    absl::StatusOr<std::unique_ptr<optim::LrSchedule>> s = MakeLrSchedule("cosine", 1e-3, steps);
    ASSERT_TRUE(s.ok()) << steps << ": " << s.status();
    const std::string warmup = steps == 0 ? "0" : steps == 5 ? "1" : "10";
    EXPECT_NE((*s)->ToString().find("warmup_steps=" + warmup), std::string::npos)
        << (*s)->ToString();
  }
  absl::StatusOr<std::unique_ptr<optim::LrSchedule>> bad =
      MakeLrSchedule("cosine:max_lr=1,warmup_steps=10,total_steps=9", 1e-3, 9);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::StartsWith("--lr_schedule='cosine:max_lr=1,warmup_steps=10,total_steps=9' "
                                    "(--lr=0.001, --steps=9): "));
  // --lr set with a spec that has its own rate: refused, not ignored.
  bad = MakeLrSchedule("cosine:max_lr=6e-4,min_lr=6e-5,warmup_steps=1,total_steps=9", 0.5, 9,
                       /*lr_set=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::StartsWith("--lr=0.5 with --lr_schedule='cosine:max_lr=6e-4"));
  bad = MakeLrSchedule("constant:lr=1e-4", 0.5, 9, /*lr_set=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("the spec sets its own lr, so --lr would be ignored"));
  EXPECT_TRUE(MakeLrSchedule("cosine", 0.5, 9, /*lr_set=*/true).ok());
  EXPECT_TRUE(MakeLrSchedule("constant", 0.5, 9, /*lr_set=*/true).ok());
  // A decay over no step given in the spec (every step at min_lr) is refused;
  // the keyword over --steps=0, which trains nothing, is not.
  bad = MakeLrSchedule("cosine:total_steps=0", 1e-3, 9);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("total_steps=0 must be >= 1 (the steps the decay lasts"));
  EXPECT_TRUE(MakeLrSchedule("cosine", 1e-3, 0).ok());
}

// A spec's keys left out: its rate is --lr's and a cosine ends at --steps
// (nanoGPT decays over the run); the others keep the spec's defaults (0).
TEST(MakeLrScheduleTest, ASpecTakesWhatItLeavesOutFromLrAndSteps) {
  EXPECT_EQ(MakeLrSchedule("cosine:warmup_steps=5", 0.5, 40, /*lr_set=*/true).value()->ToString(),
            "cosine:max_lr=0.5,min_lr=0,warmup_steps=5,total_steps=40");
  EXPECT_EQ(MakeLrSchedule("cosine:max_lr=1,min_lr=0.1", 1e-3, 40).value()->ToString(),
            "cosine:max_lr=1,min_lr=0.1,warmup_steps=0,total_steps=40");
  EXPECT_EQ(MakeLrSchedule("cosine:total_steps=90", 1e-3, 40).value()->ToString(),
            "cosine:max_lr=0.001,min_lr=0,warmup_steps=0,total_steps=90");
  EXPECT_EQ(MakeLrSchedule("constant:", 0.25, 40, /*lr_set=*/true).value()->ToString(),
            "constant:lr=0.25");
  // Spaces around the kind: the keyword's schedule still (10% warmup, lr/10).
  EXPECT_EQ(MakeLrSchedule(" cosine ", 1.0, 40).value()->ToString(),
            MakeLrSchedule("cosine", 1.0, 40).value()->ToString());
  // Still checked as a whole, the error saying which values came from the flags.
  absl::StatusOr<std::unique_ptr<optim::LrSchedule>> bad =
      MakeLrSchedule("cosine:min_lr=0.1", 1e-3, 40);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--lr_schedule='cosine:min_lr=0.1' (--lr=0.001, --steps=40; max_lr from --lr, "
            "total_steps from --steps): lr schedule: cosine needs 0 <= min_lr <= max_lr, got "
            "min_lr=0.1 max_lr=0.001");
  bad = MakeLrSchedule("cosine:max_lr=1,warmup_steps=100", 1e-3, 50);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::StartsWith("--lr_schedule='cosine:max_lr=1,warmup_steps=100' (--lr=0.001, "
                                    "--steps=50; total_steps from --steps): "));
}

TEST(NoteRunSettingsChangesTest, SaysWhichOfTheCheckpointsSettingsDiffer) {
  auto schedule = MakeLrSchedule("cosine", 1e-3, 200).value();
  auto adamw = MakeOptimizer({"adamw", 1e-3, std::nullopt, 0.95, 0.1}).value();
  const auto note = [&](const TrainState& state) {
    ::testing::internal::CaptureStderr();
    NoteRunSettingsChanges(state, *schedule, *adamw);
    return ::testing::internal::GetCapturedStderr();
  };
  TrainState state;
  EXPECT_EQ(note(state), "");  // a checkpoint that records none
  RecordRunSettings(*schedule, *adamw, "", state.extra);
  EXPECT_EQ(state.extra["optimizer_settings"], adamw->Settings());
  EXPECT_EQ(note(state), "");
  state.extra["lr_schedule"] = MakeLrSchedule("cosine", 1e-3, 100).value()->ToString();
  EXPECT_EQ(note(state), "train: note: the checkpoint was trained with lr schedule " +
                             state.extra["lr_schedule"] + "; continuing with " +
                             schedule->ToString() + "\n");
  // Another weight decay (the lr is the schedule's, so it alone does not count).
  RecordRunSettings(*schedule, *MakeOptimizer({"adamw", 5e-4, std::nullopt, 0.95, 0.0}).value(),
                    "", state.extra);
  EXPECT_EQ(note(state), "train: note: the checkpoint was trained with optimizer "
                         "adamw(beta1=0.9,beta2=0.95,eps=1e-08,weight_decay=0); continuing with "
                         "adamw(beta1=0.9,beta2=0.95,eps=1e-08,weight_decay=0.1)\n");
  RecordRunSettings(*schedule, *MakeOptimizer({"adamw", 5e-4, std::nullopt, 0.95, 0.1}).value(),
                    "", state.extra);
  EXPECT_EQ(note(state), "");
  // Another precision: checkpoints hold fp32 weights, so a resume may change it, and says so.
  const std::string bf16 = precision::MixedPrecisionPolicy::Bf16().ToString();
  const std::string fp32 = precision::MixedPrecisionPolicy::Fp32().ToString();
  RecordRunSettings(*schedule, *adamw, bf16, state.extra);
  EXPECT_EQ(state.extra["precision"], bf16);
  ::testing::internal::CaptureStderr();
  NoteRunSettingsChanges(state, *schedule, *adamw, "", fp32);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "train: note: the checkpoint was trained with precision " + bf16 +
                "; continuing with " + fp32 + "\n");
  EXPECT_EQ(note(state), "");  // a run that does not say its precision
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
  // A sample's error names its own remedy: no training hint after it.
  EXPECT_EQ(RunMain([&] {
              return absl::ResourceExhaustedError("[sample] ...: " + oom +
                                                  "; --sample_gather=unit holds the root");
            }, &err), 1);
  EXPECT_THAT(err, Not(HasSubstr("--batch_size")));
}

// A collective that timed out in a step (thrown through the ops as a
// StatusError) exits 1 as a run that failed, not 2 as a bad flag, and names
// --timeout_s.
TEST(RunTrainMainTest, ACollectiveTimeoutExitsOneNamingTheTimeoutFlag) {
  std::string err;
  const absl::Status timed_out = absl::DeadlineExceededError("rank 0 of 2 timed out after 5 s");
  EXPECT_EQ(RunMain([&]() -> absl::Status {
              tensor::ThrowIfError(timed_out, "fsdp", "unit 'h.0' all_gather");
              return absl::OkStatus();
            }, &err),
            1);
  EXPECT_THAT(err, HasSubstr("train: error: [fsdp] unit 'h.0' all_gather: DEADLINE_EXCEEDED: rank "
                             "0 of 2 timed out after 5 s\n"));
  EXPECT_THAT(err, HasSubstr("raise --timeout_s"));
  // A bad op input stays what it was (Internal here, as before).
  EXPECT_EQ(RunMain([]() -> absl::Status { tensor::ThrowOpError("matmul", "shapes"); }, &err), 1);
  EXPECT_THAT(err, Not(HasSubstr("--timeout_s")));
}

}  // namespace
}  // namespace train
