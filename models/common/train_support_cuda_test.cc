// A single-process checkpoint loads into a model and optimizer on a GPU:
// each entry goes through one host tensor into its device parameter, the
// optimizer state read on the host moves to the GPU at the first step, and
// the next step equals the CPU run's (to the GPU's rounding). Skips without
// a GPU; runs on the CUDA emulation with --config=cuda_emu.
#include "gtest/gtest.h"
#include "models/common/train_support.h"
#include "models/common/train_support_testing.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace train {
namespace {

using tensor::Device;
using tensor::Tensor;

TEST(LoadCheckpointCudaTest, LoadsIntoAGpuModelAndItsOptimizerState) {
  SKIP_WITHOUT_GPU();
  mingpt::GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 32;
  c.block_size = 8;
  c.dropout = 0;
  testing::SavedRun saved =
      testing::SaveAfterOneStep(c, ::testing::TempDir() + "/load_checkpoint_cuda", TrainState());

  const Device gpu = Device::Cuda(0);
  mingpt::GPT model(c);
  model.Materialize(2, gpu);
  auto fresh = optim::AdamW::Create({}).value();
  absl::StatusOr<TrainState> loaded = LoadCheckpoint(saved.step_dir, model, *fresh);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto a = saved.model->NamedParameters(), b = model.NamedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(b[i].second->value.device(), gpu) << b[i].first;
    EXPECT_TRUE(
        tensor::testing::AllClose(b[i].second->value.To(Device::Cpu()), a[i].second->value, 0, 0))
        << a[i].first;
  }
  EXPECT_EQ(fresh->StepCount(a[0].first), 1);

  testing::StepBoth(saved, model, *fresh);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(tensor::testing::AllClose(b[i].second->value.To(Device::Cpu()), a[i].second->value,
                                          1e-5, 1e-4))
        << a[i].first;
  }
}

}  // namespace
}  // namespace train
