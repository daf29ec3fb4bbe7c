// What a steady-state T5 training step asks of the GPU beyond its kernels,
// counted on the CUDA emulation (third_party/cuda/emu/counters.h): the step
// //models/t5:train runs on --device=cuda (bf16 mixed precision, AdamW,
// gradient clipping) with a padded encoder batch. Once the caching allocator
// is warm a step allocates no device memory, and the host waits for the GPU a
// few times, however many layers there are.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "models/common/loss_scaling.h"
#include "models/common/one_process_step.h"
#include "models/t5/model.h"
#include "nn/mixed_precision.h"
#include "optim/adamw.h"
#include "precision/policy.h"
#include "third_party/cuda/emu/counters.h"

namespace t5 {
namespace {

using cuda_emu::Counters;
using tensor::Device;
using tensor::Tensor;

constexpr int64_t kB = 2, kS = 12, kT = 8, kVocab = 40;

// The counts of the third of three steps of a T5 with `layers` encoder and
// decoder blocks, head size 32 (the fused attention).
Counters SteadyStepCounts(int64_t layers) {
  T5Config c;
  c.name = "counted";
  c.vocab_size = kVocab;
  c.d_model = 32;
  c.num_heads = 2;
  c.d_kv = 32;
  c.d_ff = 64;
  c.num_layers = layers;
  c.num_decoder_layers = layers;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  c.dropout_rate = 0.0f;
  const Device gpu = Device::Cuda(0);
  T5Model model(c);
  model.Materialize(3, gpu);
  nn::MixedPrecision mixed(model, precision::MixedPrecisionPolicy::Bf16());
  std::unique_ptr<optim::AdamW> adamw = *optim::AdamW::Create({});
  std::vector<int64_t> enc(kB * kS), mask(kB * kS, 1), dec(kB * kT), tgt(kB * kT);
  for (size_t i = 0; i < enc.size(); ++i) enc[i] = static_cast<int64_t>((i * 7 + 3) % kVocab);
  for (int64_t j = kS - 3; j < kS; ++j) mask[kS + j] = 0;  // example 1 ends in padding
  for (size_t i = 0; i < dec.size(); ++i) {
    dec[i] = static_cast<int64_t>((i * 5 + 1) % kVocab);
    tgt[i] = static_cast<int64_t>((i * 3 + 2) % kVocab);
  }

  train::LossScaling scaling = *train::LossScaling::FromFlags("none", std::nullopt, false);

  // The single-process step of //models/t5:train: forward and backward, then
  // the binary's own end of a step (masters back, clip, AdamW writing the
  // next compute copies, gradients dropped).
  int64_t step_index = 0;
  auto step = [&] {
    // (B, S), (B, S), (B, T), (B, T); queued, as the train binary's batches are.
    const Tensor encoder_inputs = Tensor::FromData<int64_t>(enc, {kB, kS}).ToQueued(gpu);
    const Tensor encoder_mask = Tensor::FromData<int64_t>(mask, {kB, kS}).ToQueued(gpu);
    const Tensor decoder_inputs = Tensor::FromData<int64_t>(dec, {kB, kT}).ToQueued(gpu);
    const Tensor targets = Tensor::FromData<int64_t>(tgt, {kB, kT}).ToQueued(gpu);
    mixed.CastForCompute();
    const double loss =
        model.ForwardBackward(encoder_inputs, encoder_mask, decoder_inputs, targets);
    absl::StatusOr<train::StepResult> done = train::FinishOneProcessStep(
        model, mixed, *adamw, loss, scaling.scale(), step_index++, /*grad_clip=*/1.0, scaling);
    EXPECT_TRUE(done.ok()) << done.status();
    return loss;
  };
  const Counters counts = cuda_emu::CountSteadyCall(step);
  std::printf("T5, %lld + %lld layers, bf16: one steady-state step: %s\n",
              static_cast<long long>(layers), static_cast<long long>(layers),
              counts.ToString().c_str());
  return counts;
}

TEST(T5GpuStepCountsTest, SteadyStateStepAllocatesNothingAndWaitsForTheGpuAFewTimes) {
  const Counters two = SteadyStepCounts(2);
  const Counters four = SteadyStepCounts(4);
  for (const Counters& c : {two, four}) {
    EXPECT_EQ(c.device_allocs, 0) << c.ToString();
    EXPECT_EQ(c.device_frees, 0) << c.ToString();
    EXPECT_EQ(c.pinned_allocs, 0) << c.ToString();
    // The loss and the gradient norm: two, whatever the depth (measured: 2,
    // with 5 copies to the host and 4 to the GPU). The shared embedding's id
    // checks (encoder, decoder) cost none: their results arrive with the
    // loss's wait (deferred checks; 4 waits while each read its own back, 5
    // while the batch's first copy to the GPU waited for the previous step's
    // last kernels). The two
    // relative position tables' bucket ids cost none: each layer keeps its
    // table on the device for the positions it was made from (7 waits when
    // they were made on the host and copied every step; 9 when their lookups
    // also checked the ids, which are the layer's own). The attention's key
    // padding mask costs none (the fused kernels read it on the device; the
    // unfused path built it on the host every call).
    EXPECT_LE(c.host_syncs, 2) << c.ToString();
  }
  EXPECT_EQ(four.host_syncs, two.host_syncs) << "host waits grow with the depth";
  EXPECT_GT(four.kernel_launches, two.kernel_launches);
  // No memset per parameter: the gradients dropped after a step are written
  // anew by the next backward. What is left: the relative position tables'
  // gradients (scatter-added into zeros), the ids' checks and the biased
  // attention backward's accumulators: 8 / 12 (53 / 99 while the step zeroed
  // every gradient in place).
  EXPECT_LE(two.memsets, 8) << two.ToString();
  EXPECT_LE(four.memsets, 12) << four.ToString();
}

}  // namespace
}  // namespace t5
