// What the checkpoint loading tests on the CPU and on a GPU share: a minGPT
// stepped once with AdamW and saved, and the batch it trained on.
#ifndef MODELS_COMMON_TRAIN_SUPPORT_TESTING_H_
#define MODELS_COMMON_TRAIN_SUPPORT_TESTING_H_

#include <memory>
#include <string>

#include "models/common/train_support.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace train {
namespace testing {

// A minGPT small enough to save in milliseconds: 2 layers, 2 heads,
// n_embd 32, vocab 64, block 16, no dropout.
mingpt::GptConfig SmallConfig();

// Two sequences of 4 tokens (ids below 10) and their next tokens, on the CPU.
struct TinyBatch {
  tensor::Tensor idx;  // (2, 4) i64
  tensor::Tensor tgt;  // (2, 4) i64
};
TinyBatch MakeTinyBatch();

// A run saved after its first step: `config` materialized with seed 1, one
// AdamW step on MakeTinyBatch(), then SaveCheckpoint(dir, ..., state) with
// state.step = 1 (dir is emptied first), so the step folder is
// dir + "/" + CheckpointStepName(1).
struct SavedRun {
  std::unique_ptr<mingpt::GPT> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::string step_dir;
};
SavedRun SaveAfterOneStep(const mingpt::GptConfig& config, const std::string& dir,
                          TrainState state);

// One more step of the saved run (on the CPU) and of `model` with
// `optimizer` (on the model's device): what a load must continue as.
void StepBoth(SavedRun& saved, mingpt::GPT& model, optim::Optimizer& optimizer);

}  // namespace testing
}  // namespace train

#endif  // MODELS_COMMON_TRAIN_SUPPORT_TESTING_H_
