// Single-process checkpoints load without holding the files: the model is
// read into its parameters and the optimizer state becomes the buffers read,
// so a rank's load peaks at the optimizer state (not model + 2 x state), and
// the loaded run equals the saved one.
#include "models/common/train_support.h"

#include <string>

#include "gtest/gtest.h"
#include "models/common/train_support_testing.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace train {
namespace {

mingpt::GptConfig Config() {
  mingpt::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 64;
  c.block_size = 16;
  c.dropout = 0;
  return c;
}

TEST(LoadCheckpointTest, ReadsIntoTheModelAndAdoptsTheStateRead) {
  TrainState state;
  state.loader_state = "x";
  testing::SavedRun saved =
      testing::SaveAfterOneStep(Config(), ::testing::TempDir() + "/load_checkpoint", state);

  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  mingpt::GPT model(Config());
  model.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  const tensor::Device cpu = tensor::Device::Cpu();
  const int64_t before = ledger.Total(cpu).current;
  ledger.ResetPeaks();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(saved.step_dir, model, *fresh);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  EXPECT_EQ(loaded->loader_state, "x");
  const int64_t state_bytes = fresh->StateBytes();
  EXPECT_EQ(state_bytes, 8 * model.NumParameters());
  // The state read, plus the step counts (one i64 tensor per parameter).
  EXPECT_LE(ledger.Total(cpu).peak - before, state_bytes + 8 * 64 + 4096);
  EXPECT_EQ(ledger.Stats(cpu, tensor::MemoryCategory::kOptimizerState).current, state_bytes);

  // One more step of each equals.
  testing::StepBoth(saved, model, *fresh);
  auto a = saved.model->NamedParameters(), b = model.NamedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(tensor::testing::AllClose(a[i].second->value, b[i].second->value, 0, 0))
        << a[i].first;
  }
}

}  // namespace
}  // namespace train
