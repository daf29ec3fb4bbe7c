// What a steady-state minGPT training step asks of the GPU beyond its
// kernels, counted on the CUDA emulation (third_party/cuda/emu/counters.h):
// the step //models/mingpt:train runs on --device=cuda (bf16 mixed precision,
// AdamW, gradient clipping). Once the first steps have filled the caching
// allocator a step allocates no device memory, and the number of times the
// host waits for the GPU (each wait idles a real GPU until the host has
// queued the next kernel) is small and does not grow with the number of
// layers or parameters.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "models/common/loss_scaling.h"
#include "models/common/one_process_step.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/mixed_precision.h"
#include "optim/adamw.h"
#include "precision/policy.h"
#include "third_party/cuda/emu/counters.h"

namespace mingpt {
namespace {

using cuda_emu::Counters;
using tensor::Device;
using tensor::Dtype;

constexpr int64_t kB = 2, kT = 16, kVocab = 64;

// The counts of the third of three steps of a model with `n_layer` blocks,
// in bf16, or in fp16 with a loss scale (whose unscale checks for inf/NaN).
Counters SteadyStepCounts(int64_t n_layer, bool fp16 = false) {
  GptConfig config;
  config.name = "counted";
  config.n_layer = n_layer;
  config.n_head = 2;
  config.n_embd = 32;
  config.vocab_size = kVocab;
  config.block_size = kT;
  config.dropout = 0.0f;
  const Device gpu = Device::Cuda(0);
  GPT model(config);
  model.Materialize(7, gpu);
  nn::MixedPrecision mixed(model, fp16 ? precision::MixedPrecisionPolicy::Fp16()
                                       : precision::MixedPrecisionPolicy::Bf16());
  // A fixed scale: its unscale and check run at every step, as the dynamic one's.
  train::LossScaling scaling =
      *train::LossScaling::FromFlags(fp16 ? "1024" : "none", std::nullopt, fp16);
  std::unique_ptr<optim::AdamW> adamw = *optim::AdamW::Create({});
  std::vector<int64_t> ids(kB * kT);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % kVocab);

  // The single-process step of //models/mingpt:train: forward and backward,
  // then the binary's own end of a step (masters back, unscale, clip, AdamW
  // writing the next compute copies, gradients dropped).
  int64_t step_index = 0;
  auto step = [&] {
    // (B, T), queued as the train binary's batch is
    tensor::Tensor inputs = tensor::Tensor::FromData<int64_t>(ids, {kB, kT}).ToQueued(gpu);
    tensor::Tensor targets = inputs;                                                   // (B, T)
    mixed.CastForCompute();
    const double scale = scaling.scale();
    const double loss = model.ForwardBackward(inputs, targets, scale);
    absl::StatusOr<train::StepResult> done = train::FinishOneProcessStep(
        model, mixed, *adamw, loss, scale, step_index++, /*grad_clip=*/1.0, scaling);
    EXPECT_TRUE(done.ok()) << done.status();
    return loss;
  };
  const Counters counts = cuda_emu::CountSteadyCall(step);
  std::printf("n_layer %lld, %s: one steady-state step: %s\n", static_cast<long long>(n_layer),
              fp16 ? "fp16, loss scale" : "bf16", counts.ToString().c_str());
  return counts;
}

TEST(GpuStepCountsTest, SteadyStateStepAllocatesNothingAndWaitsForTheGpuAFewTimes) {
  const Counters two = SteadyStepCounts(2);
  const Counters four = SteadyStepCounts(4);
  for (const Counters& c : {two, four}) {
    EXPECT_EQ(c.device_allocs, 0) << c.ToString();
    EXPECT_EQ(c.device_frees, 0) << c.ToString();
    EXPECT_EQ(c.pinned_allocs, 0) << c.ToString();
    // The loss and the gradient norm: two, whatever the depth. The token
    // embedding's id check costs none: its result arrives with the loss's
    // wait (a deferred check; three waits while it read its own back, four
    // while the batch's copy to the GPU waited for the previous step's last
    // kernels, five while the position embedding checked the positions the
    // model makes itself).
    EXPECT_LE(c.host_syncs, 2) << c.ToString();
  }
  EXPECT_EQ(four.host_syncs, two.host_syncs) << "host waits grow with the depth";
  // Two blocks more: 71 launches (their forwards, backwards and optimizer
  // work; 79 while the Linear biases' gradients were added from temporaries,
  // 91 while each LayerNorm's parameter gradients were made as temporaries and
  // added one by one, with an f32 copy of its weight).
  EXPECT_GT(four.kernel_launches, two.kernel_launches);
  EXPECT_LE(four.kernel_launches - two.kernel_launches, 71);
  // The gradients dropped after a step are written anew by the next backward,
  // not zeroed and added to: the memsets left are the two embeddings'
  // gradients (scatter-added into zeros) and the token ids' check, whatever
  // the depth (30 / 54 while the step zeroed every gradient in place).
  EXPECT_EQ(four.memsets, two.memsets) << four.ToString();
  EXPECT_LE(two.memsets, 3) << two.ToString();
}

// The loss scaler's unscale and inf/NaN check is one more wait, not one per
// gradient.
TEST(GpuStepCountsTest, LossScalingAddsOneWait) {
  const Counters bf16 = SteadyStepCounts(2);
  const Counters fp16 = SteadyStepCounts(2, /*fp16=*/true);
  const Counters fp16_deeper = SteadyStepCounts(4, /*fp16=*/true);
  EXPECT_EQ(fp16.device_allocs, 0) << fp16.ToString();
  EXPECT_EQ(fp16.host_syncs, bf16.host_syncs + 1) << fp16.ToString();
  EXPECT_EQ(fp16_deeper.host_syncs, fp16.host_syncs) << fp16_deeper.ToString();
}

}  // namespace
}  // namespace mingpt
