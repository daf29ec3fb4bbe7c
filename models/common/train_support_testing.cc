// What the checkpoint loading tests share (train_support_testing.h).
#include "models/common/train_support_testing.h"

#include <filesystem>
#include <utility>

#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"

namespace train {
namespace testing {

TinyBatch MakeTinyBatch() {
  return {tensor::Tensor::FromVector({1, 5, 9, 3, 7, 2, 8, 4}, {2, 4}, tensor::Dtype::kI64),
          tensor::Tensor::FromVector({5, 9, 3, 7, 2, 8, 4, 6}, {2, 4}, tensor::Dtype::kI64)};
}

mingpt::GptConfig SmallConfig() {
  mingpt::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 64;
  c.block_size = 16;
  c.dropout = 0;
  return c;
}

SavedRun SaveAfterOneStep(const mingpt::GptConfig& config, const std::string& dir,
                          TrainState state) {
  std::filesystem::remove_all(dir);
  SavedRun run;
  run.model = std::make_unique<mingpt::GPT>(config);
  run.model->Materialize(1);
  run.optimizer = optim::AdamW::Create({}).value();
  const TinyBatch batch = MakeTinyBatch();
  run.model->ForwardBackward(batch.idx, batch.tgt);
  run.optimizer->Step(optim::FromModule(*run.model));
  state.step = 1;
  const absl::Status s = SaveCheckpoint(dir, *run.model, *run.optimizer, state);
  EXPECT_TRUE(s.ok()) << s;
  run.step_dir = dir + "/" + CheckpointStepName(1);
  return run;
}

void StepBoth(SavedRun& saved, mingpt::GPT& model, optim::Optimizer& optimizer) {
  const TinyBatch batch = MakeTinyBatch();
  saved.model->ZeroGrad();
  saved.model->ForwardBackward(batch.idx, batch.tgt);
  saved.optimizer->Step(optim::FromModule(*saved.model));
  const tensor::Device device = model.NamedParameters().front().second->value.device();
  model.ForwardBackward(batch.idx.To(device), batch.tgt.To(device));
  optimizer.Step(optim::FromModule(model));
}

}  // namespace testing
}  // namespace train
