// T5 on a GPU (tagged gpu; skips without one): a tiny T5 (v1.0 tied and v1.1
// gated) with a padded encoder batch gives the CPU's loss and gradients on
// cuda:0 -- relative position biases, the encoder padding mask and the
// shared embedding, with head size 8 (the unfused attention path of the GPU)
// and 32 (the fused attention kernels, which take the bias and the mask);
// decoding (Encode, DecodeLogits, DecodeStep with the key/value cache,
// Generate) gives the CPU's logits and tokens.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/t5/generate.h"
#include "models/t5/model.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace t5 {
namespace {

using tensor::Device;
using tensor::Tensor;

T5Config Tiny(bool v1_1, int64_t d_kv) {
  T5Config c;
  c.name = "tiny";
  c.vocab_size = 13;
  c.d_model = 16;
  c.num_heads = 2;
  c.d_kv = d_kv;
  c.d_ff = 32;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  c.dropout_rate = 0.0f;
  if (v1_1) {
    c.feed_forward_proj = FeedForwardProj::kGatedGelu;
    c.tie_word_embeddings = false;
  }
  return c;
}

Tensor Ids(std::vector<int64_t> v, int64_t B, int64_t T, Device device) {
  return Tensor::FromData<int64_t>(v, {B, T}).To(device);
}

TEST(T5CudaTest, LossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto [v1_1, d_kv] : {std::pair{false, 8}, std::pair{true, 8}, std::pair{false, 32},
                            std::pair{true, 32}}) {
    SCOPED_TRACE(::testing::Message() << (v1_1 ? "v1.1" : "v1.0") << " d_kv " << d_kv);
    double losses[2];
    std::vector<std::pair<std::string, Tensor>> grads[2];
    const Device devices[2] = {Device::Cpu(), Device::Cuda(0)};
    for (int d = 0; d < 2; ++d) {
      T5Model model(Tiny(v1_1, d_kv));
      model.Materialize(5, devices[d]);
      // Row 1's encoder input ends in 2 padding positions; one ignored target.
      losses[d] = model.ForwardBackward(
          Ids({3, 7, 1, 12, 5, 9, 4, 4, 8, 2, 0, 0}, 2, 6, devices[d]),
          Ids({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 2, 6, devices[d]),
          Ids({0, 11, 6, 2, 10, 0, 12, 3, 3, 0}, 2, 5, devices[d]),
          Ids({11, 6, 2, 10, 1, 12, 3, 3, 7, -100}, 2, 5, devices[d]));
      for (auto& [name, p] : model.NamedParameters()) {
        ASSERT_TRUE(p->grad.defined()) << name;
        EXPECT_EQ(p->grad.device(), devices[d]) << name;
        grads[d].emplace_back(name, p->grad.To(Device::Cpu()));
      }
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-5 * std::abs(losses[0]));
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(tensor::testing::AllClose(grads[1][i].second, grads[0][i].second, 1e-4, 1e-5))
          << grads[0][i].first;
    }
  }
}

// Decoding on the GPU (d_kv 32: the fused kernels): the decoder's logits
// (T5Model::Encode, DecodeLogits; DecodeStep fed a prompt then one position)
// are the CPU's, and greedy decoding, with the cache and without, and beam
// search (the cache's rows reordered on the device) pick the CPU's tokens.
TEST(T5CudaTest, DecodingMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (bool v1_1 : {false, true}) {
    SCOPED_TRACE(v1_1 ? "v1.1" : "v1.0");
    std::vector<std::vector<int64_t>> tokens[2][2];  // [device][kv_cache]
    std::vector<std::vector<int64_t>> beams[2];      // [device]: 3 beams with the cache
    Tensor logits[2], stepped[2];
    const Device devices[2] = {Device::Cpu(), Device::Cuda(0)};
    for (int d = 0; d < 2; ++d) {
      T5Model model(Tiny(v1_1, 32));
      model.Materialize(5, devices[d]);
      model.Train(false);
      const Tensor x = Ids({3, 7, 1, 12, 5, 9, 4, 4, 8, 2, 0, 0}, 2, 6, devices[d]);  // (B, S)
      const Tensor mask = Ids({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 2, 6, devices[d]);
      const Tensor encoded = model.Encode(x, mask);  // (B, S, d)
      logits[d] =
          model
              .DecodeLogits(encoded, mask, Ids({0, 11, 6, 2, 10, 0, 12, 3, 3, 0}, 2, 5, devices[d]))
              .To(Device::Cpu());  // (B, T, V)
      DecoderCache cache;
      cache.capacity = 5;
      model.DecodeStep(encoded, mask, Ids({0, 11, 6, 0, 12, 3}, 2, 3, devices[d]), cache);
      stepped[d] = model.DecodeStep(encoded, mask, Ids({2, 3}, 2, 1, devices[d]), cache)
                       .To(Device::Cpu());  // (B, 1, V): position 3
      for (bool kv_cache : {false, true}) {
        GenerateOptions options;
        options.max_new_tokens = 6;
        options.kv_cache = kv_cache;
        absl::StatusOr<std::vector<std::vector<int64_t>>> got = Generate(model, x, mask, options);
        ASSERT_TRUE(got.ok()) << got.status();
        tokens[d][kv_cache] = *got;
      }
      GenerateOptions beam;
      beam.max_new_tokens = 6;
      beam.num_beams = 3;
      beam.eos_id = 2;
      absl::StatusOr<std::vector<std::vector<int64_t>>> searched = Generate(model, x, mask, beam);
      ASSERT_TRUE(searched.ok()) << searched.status();
      beams[d] = *searched;
    }
    EXPECT_TRUE(tensor::testing::AllClose(logits[1], logits[0], 1e-4, 1e-5));
    EXPECT_TRUE(
        tensor::testing::AllClose(stepped[1], logits[0].Narrow(1, 3, 1).Contiguous(), 1e-4, 1e-5));
    EXPECT_EQ(tokens[1][0], tokens[0][0]);
    EXPECT_EQ(tokens[1][1], tokens[0][0]);
    EXPECT_EQ(beams[1], beams[0]);
  }
}

}  // namespace
}  // namespace t5
