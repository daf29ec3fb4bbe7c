// Single-process checkpoints load without holding the files: the model is
// read into its parameters and the optimizer state becomes the buffers read,
// so a rank's load peaks at the optimizer state (not model + 2 x state), and
// the loaded run equals the saved one.
#include "models/common/train_support.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
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
  const std::string dir = ::testing::TempDir() + "/load_checkpoint";
  std::filesystem::remove_all(dir);
  const tensor::Tensor idx =
      tensor::Tensor::FromVector({1, 5, 9, 3, 7, 2, 8, 4}, {2, 4}, tensor::Dtype::kI64);
  const tensor::Tensor tgt =
      tensor::Tensor::FromVector({5, 9, 3, 7, 2, 8, 4, 6}, {2, 4}, tensor::Dtype::kI64);
  mingpt::GPT saved(Config());
  saved.Materialize(1);
  auto opt = optim::AdamW::Create({}).value();
  saved.ForwardBackward(idx, tgt);
  opt->Step(optim::FromModule(saved));
  TrainState state;
  state.step = 1;
  state.loader_state = "x";
  ASSERT_TRUE(SaveCheckpoint(dir, saved, *opt, state).ok());

  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  mingpt::GPT model(Config());
  model.Materialize(2);
  auto fresh = optim::AdamW::Create({}).value();
  const tensor::Device cpu = tensor::Device::Cpu();
  const int64_t before = ledger.Total(cpu).current;
  ledger.ResetPeaks();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(dir + "/step_000001", model, *fresh);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  EXPECT_EQ(loaded->loader_state, "x");
  const int64_t state_bytes = fresh->StateBytes();
  EXPECT_EQ(state_bytes, 8 * model.NumParameters());
  // The state read, plus the step counts (one i64 tensor per parameter).
  EXPECT_LE(ledger.Total(cpu).peak - before, state_bytes + 8 * 64 + 4096);
  EXPECT_EQ(ledger.Stats(cpu, tensor::MemoryCategory::kOptimizerState).current, state_bytes);

  // One more step of each equals.
  saved.ZeroGrad();
  saved.ForwardBackward(idx, tgt);
  opt->Step(optim::FromModule(saved));
  model.ForwardBackward(idx, tgt);
  fresh->Step(optim::FromModule(model));
  auto a = saved.NamedParameters(), b = model.NamedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(tensor::testing::AllClose(a[i].second->value, b[i].second->value, 0, 0))
        << a[i].first;
  }
}

}  // namespace
}  // namespace train
