// minGPT on a GPU (tagged gpu; skips without one): the loss and every
// gradient of ForwardBackward, and Loss, equal the CPU's for vocabularies
// whose logits rows the GPU lays out 64-aligned (11 and 67 columns in rows of
// 64 and 128: the LM head's align_output_rows) and one that needs no padding
// (64), in f32 and with a loss scale (the gradient scaled in the padded rows),
// at 12 tokens and at 256 (where the head's GEMMs run at the padded size);
// cached decoding (generation) gives the CPU's logits, and beam search (the
// cache's rows reordered on the device) the CPU's tokens. Also c_fc's bias
// gradient out of the GELU backward's GEMM (cuda::MatmulDGeluBiasGrad).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/mingpt/generate.h"
#include "models/mingpt/model.h"
#include "nn/linear.h"
#include "tensor/cuda/matmul.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace mingpt {
namespace {

using tensor::Device;
using tensor::Tensor;

GptConfig Tiny(int64_t vocab, int64_t block_size = 6) {
  GptConfig c;
  c.name = "tiny";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = vocab;
  c.block_size = block_size;
  c.dropout = 0.0f;
  return c;
}

TEST(GptCudaTest, LossAndGradientsMatchTheCpuWithAlignedLogitsRows) {
  SKIP_WITHOUT_GPU();
  // 2 x 6 tokens: the head's GEMMs at out = vocab; 4 x 64: at the padded size
  // (nn::Linear::kPaddedProductMinRows), the gradient taken in place.
  static_assert(4 * 64 >= nn::Linear::kPaddedProductMinRows);
  for (const auto& [batch, block] : {std::pair<int64_t, int64_t>{2, 6}, {4, 64}}) {
    for (int64_t vocab : {11, 64, 67}) {
      for (double loss_scale : {1.0, 8.0}) {
        SCOPED_TRACE(::testing::Message() << batch << " x " << block << " tokens, vocab " << vocab
                                          << ", loss scale " << loss_scale);
        std::vector<int64_t> ids(batch * block), targets(batch * block);
        for (size_t i = 0; i < ids.size(); ++i) {
          ids[i] = static_cast<int64_t>((i * 5 + 1) % vocab);
          targets[i] = static_cast<int64_t>((i * 7 + 3) % vocab);
        }
        double losses[2], eval[2];
        std::vector<std::pair<std::string, Tensor>> grads[2];
        const Device devices[2] = {Device::Cpu(), Device::Cuda(0)};
        for (int d = 0; d < 2; ++d) {
          GPT model(Tiny(vocab, block));
          model.Materialize(9, devices[d]);
          const Tensor idx = Tensor::FromData<int64_t>(ids, {batch, block}).To(devices[d]);
          const Tensor tgt = Tensor::FromData<int64_t>(targets, {batch, block}).To(devices[d]);
          losses[d] = model.ForwardBackward(idx, tgt, loss_scale);
          eval[d] = model.Loss(idx, tgt);
          for (auto& [name, p] : model.NamedParameters()) {
            ASSERT_TRUE(p->grad.defined()) << name;
            grads[d].emplace_back(name, p->grad.To(Device::Cpu()));
          }
        }
        EXPECT_NEAR(losses[1], losses[0], 1e-5 * std::abs(losses[0]));
        EXPECT_NEAR(eval[1], eval[0], 1e-5 * std::abs(eval[0]));
        ASSERT_EQ(grads[0].size(), grads[1].size());
        for (size_t i = 0; i < grads[0].size(); ++i) {
          EXPECT_TRUE(tensor::testing::AllClose(grads[1][i].second, grads[0][i].second, 1e-4,
                                                1e-5 * loss_scale))
              << grads[0][i].first;
        }
      }
    }
  }
}

// With cuda::MatmulDGeluBiasGrad on, each MLP's c_fc bias gradient comes out
// of c_proj's GELU-backward GEMM (DGELU_BGRAD) and c_fc's weight gradient is
// a plain GEMM: one fused GEMM fewer a layer than with it off, and in both
// ways the CPU's loss and gradients (f32; 4 x 64 tokens, hidden 64).
TEST(GptCudaTest, CFcBiasGradientFromTheGeluBackwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const GptConfig config = Tiny(64, 64);
  const int64_t batch = 4, block = 64;
  std::vector<int64_t> ids(batch * block), targets(batch * block);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 5 + 1) % 64);
    targets[i] = static_cast<int64_t>((i * 7 + 3) % 64);
  }
  struct Run {
    double loss = 0;
    std::vector<std::pair<std::string, Tensor>> grads;  // on the CPU
    int64_t fused = 0;                                   // GEMMs with an epilogue
  };
  auto run = [&](Device device) {
    Run r;
    GPT model(config);
    model.Materialize(9, device);
    const Tensor idx = Tensor::FromData<int64_t>(ids, {batch, block}).To(device);
    const Tensor tgt = Tensor::FromData<int64_t>(targets, {batch, block}).To(device);
    const int64_t before = tensor::cuda::GetMatmulCacheStats().epilogues_fused;
    r.loss = model.ForwardBackward(idx, tgt);
    r.fused = tensor::cuda::GetMatmulCacheStats().epilogues_fused - before;
    for (auto& [name, p] : model.NamedParameters()) {
      r.grads.emplace_back(name, p->grad.To(Device::Cpu()));
    }
    return r;
  };
  const Run cpu = run(Device::Cpu());
  tensor::cuda::SetMatmulDGeluBiasGrad(false);
  const Run off = run(Device::Cuda(0));
  tensor::cuda::SetMatmulDGeluBiasGrad(true);
  const Run on = run(Device::Cuda(0));
  tensor::cuda::SetMatmulDGeluBiasGrad(false);
  EXPECT_EQ(off.fused - on.fused, config.n_layer);
  for (const Run* gpu : {&off, &on}) {
    SCOPED_TRACE(gpu == &on ? "switch on" : "switch off");
    EXPECT_NEAR(gpu->loss, cpu.loss, 1e-5 * std::abs(cpu.loss));
    ASSERT_EQ(gpu->grads.size(), cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      EXPECT_TRUE(tensor::testing::AllClose(gpu->grads[i].second, cpu.grads[i].second, 1e-4, 1e-5))
          << cpu.grads[i].first;
    }
  }
}

// One model (vocabulary 67, block_size 9, the given width, seed 4) on the
// CPU and on the GPU, in eval mode: the decoding tests' pair.
struct EvalPair {
  explicit EvalPair(int64_t n_embd) : cpu(Config(n_embd)), gpu(Config(n_embd)) {
    cpu.Materialize(4, Device::Cpu());
    gpu.Materialize(4, Device::Cuda(0));
    cpu.Train(false);
    gpu.Train(false);
  }
  static GptConfig Config(int64_t n_embd) {
    GptConfig c = Tiny(67);
    c.n_embd = n_embd;
    c.block_size = 9;
    return c;
  }
  GPT cpu, gpu;
};

// Generation's cached decoding on the GPU (the fused attention at head size
// 32, the unfused path at 8, queries at the end of a longer key range) gives
// the CPU's full-forward logits of the last position at every length.
TEST(GptCudaTest, CachedDecodingMatchesTheCpuFullForward) {
  SKIP_WITHOUT_GPU();
  for (int64_t n_embd : {64, 16}) {
    SCOPED_TRACE(::testing::Message() << "head size " << n_embd / 2);
    EvalPair models(n_embd);
    GPT &cpu = models.cpu, &gpu = models.gpu;
    std::vector<int64_t> ids(2 * 9);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 13 + 2) % 67);
    const Tensor seq = Tensor::FromData<int64_t>(ids, {2, 9});  // (B, block_size)
    std::vector<nn::KvCache> caches;
    int64_t done = 0;
    for (int64_t step : {3, 1, 2, 1, 1, 1}) {
      const Tensor last =
          gpu.DecodeLogits(seq.Narrow(1, done, step).Contiguous().To(Device::Cuda(0)), caches);
      done += step;
      const Tensor want = cpu.LastLogits(seq.Narrow(1, 0, done).Contiguous());  // (2, 67)
      EXPECT_TRUE(tensor::testing::AllClose(last.To(Device::Cpu()), want, 1e-4, 1e-5))
          << "after " << done;
    }
    EXPECT_EQ(caches[0].k.device(), Device::Cuda(0));
  }
}

// Left-padded rows (prompts of unequal lengths) decode on the GPU as each
// row's sequence alone does on the CPU: the key padding mask in the fused
// kernels (head size 32) and the unfused path (8), in the prefill and after.
TEST(GptCudaTest, LeftPaddedDecodingMatchesEachRowAloneOnTheCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t n_embd : {64, 16}) {
    SCOPED_TRACE(::testing::Message() << "head size " << n_embd / 2);
    EvalPair models(n_embd);
    GPT &cpu = models.cpu, &gpu = models.gpu;
    const std::vector<int64_t> pad = {0, 3, 5};  // prompts of 6, 3 and 1 tokens
    std::vector<int64_t> ids(3 * 9);             // (B, block_size), padding as id 0
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t r = static_cast<int64_t>(i) / 9, p = static_cast<int64_t>(i) % 9;
      ids[i] = p < pad[r] ? 0 : static_cast<int64_t>((i * 17 + 3) % 67);
    }
    const Tensor seq = Tensor::FromData<int64_t>(ids, {3, 9});
    std::vector<nn::KvCache> caches;
    int64_t done = 0;
    for (int64_t step : {6, 1, 1, 1}) {
      const Tensor last = gpu.DecodeLogits(
          seq.Narrow(1, done, step).Contiguous().To(Device::Cuda(0)), caches, pad);  // (3, 67)
      done += step;
      for (int64_t r = 0; r < 3; ++r) {
        const Tensor alone = seq.Narrow(0, r, 1).Narrow(1, pad[r], done - pad[r]).Contiguous();
        EXPECT_TRUE(tensor::testing::AllClose(last.Narrow(0, r, 1).To(Device::Cpu()),
                                              cpu.LastLogits(alone), 1e-4, 1e-5))
            << "row " << r << " after " << done;
      }
    }
  }
}

// Beam search on the GPU: prompts of unequal lengths, the key/value cache's
// rows reordered on the device as beams move (nn::SelectKvCacheRows), and
// past block_size: the CPU's tokens.
TEST(GptCudaTest, BeamSearchMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  EvalPair models(64);
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 3}, {60}};
  SamplingOptions beams;
  beams.temperature = 0.0;
  beams.max_new_tokens = 8;  // 3 + 8 > block_size 9
  beams.num_beams = 3;
  beams.num_return_sequences = 2;
  absl::StatusOr<std::vector<std::vector<int64_t>>> cpu =
      Generate(models.cpu, prompts, beams, Device::Cpu());
  absl::StatusOr<std::vector<std::vector<int64_t>>> gpu =
      Generate(models.gpu, prompts, beams, Device::Cuda(0));
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  EXPECT_EQ(*gpu, *cpu);
  ASSERT_EQ(gpu->size(), 4u);
}

}  // namespace
}  // namespace mingpt
