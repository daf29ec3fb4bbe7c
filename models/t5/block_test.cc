// T5Block: Hugging Face child names, finite-difference gradients of an
// encoder block that owns the relative bias (its returned bias included) and
// of a decoder block that takes a position bias, the encoder output and an
// encoder mask, and clear errors for missing or extra inputs.
#include "models/t5/block.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace t5 {
namespace {

using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

T5Config Tiny() {
  T5Config c;
  c.name = "tiny";
  c.vocab_size = 13;
  c.d_model = 8;
  c.num_heads = 2;
  c.d_kv = 3;  // inner 6 != d_model
  c.d_ff = 16;
  c.num_layers = 2;
  c.num_decoder_layers = 2;
  c.relative_attention_num_buckets = 8;
  c.relative_attention_max_distance = 16;
  c.dropout_rate = 0.0f;
  return c;
}

void Randomize(nn::Module& m, uint64_t seed) {
  m.Materialize(seed);
  for (auto& [name, p] : m.NamedParameters())
    p->value = RandomTensor(p->shape, seed++, -0.5f, 0.5f);
}

std::vector<std::string> Names(nn::Module& m) {
  std::vector<std::string> names;
  for (auto& [name, p] : m.NamedParameters()) names.push_back(name);
  return names;
}

TEST(T5BlockTest, NamesAreHuggingFaces) {
  T5Block encoder(Tiny(), /*is_decoder=*/false, /*has_relative_bias=*/true);
  EXPECT_EQ(encoder.class_name(), "T5Block");
  EXPECT_EQ(encoder.self_attention()->class_name(), "T5LayerSelfAttention");
  EXPECT_EQ(encoder.cross_attention(), nullptr);
  EXPECT_EQ(encoder.feed_forward()->class_name(), "T5LayerFF");
  EXPECT_EQ(Names(encoder), (std::vector<std::string>{
                                "layer.0.SelfAttention.q.weight", "layer.0.SelfAttention.k.weight",
                                "layer.0.SelfAttention.v.weight", "layer.0.SelfAttention.o.weight",
                                "layer.0.SelfAttention.relative_attention_bias.weight",
                                "layer.0.layer_norm.weight", "layer.1.DenseReluDense.wi.weight",
                                "layer.1.DenseReluDense.wo.weight", "layer.1.layer_norm.weight"}));
  T5Config gated = AsV1_1(Tiny());
  T5Block decoder(gated, /*is_decoder=*/true, /*has_relative_bias=*/false);
  EXPECT_EQ(decoder.cross_attention()->class_name(), "T5LayerCrossAttention");
  EXPECT_EQ(Names(decoder),
            (std::vector<std::string>{
                "layer.0.SelfAttention.q.weight", "layer.0.SelfAttention.k.weight",
                "layer.0.SelfAttention.v.weight", "layer.0.SelfAttention.o.weight",
                "layer.0.layer_norm.weight", "layer.1.EncDecAttention.q.weight",
                "layer.1.EncDecAttention.k.weight", "layer.1.EncDecAttention.v.weight",
                "layer.1.EncDecAttention.o.weight", "layer.1.layer_norm.weight",
                "layer.2.DenseReluDense.wi_0.weight", "layer.2.DenseReluDense.wi_1.weight",
                "layer.2.DenseReluDense.wo.weight", "layer.2.layer_norm.weight"}));
  EXPECT_TRUE(decoder.self_attention()->attention()->options().causal);
  EXPECT_FALSE(encoder.self_attention()->attention()->options().causal);
  EXPECT_TRUE(decoder.cross_attention()->attention()->options().cross_attention);
}

// Encoder block 0: y and the bias it returns both feed the loss
// L = <y, w_y> + <bias, w_b>, with a key mask that hides the last key of row 1.
TEST(T5BlockTest, EncoderBlockGradientsMatchFiniteDifferences) {
  T5Block block(Tiny(), /*is_decoder=*/false, /*has_relative_bias=*/true);
  Randomize(block, 3);
  const Tensor x = RandomTensor({2, 5, 8}, 11);
  const Tensor mask = Tensor::FromData<int64_t>({1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, {2, 5});
  const Tensor w_y = RandomTensor({2, 5, 8}, 12);
  const Tensor w_b = RandomTensor({1, 2, 5, 5}, 13);
  auto loss = [&]() {
    Context ctx;
    Tensors out = block.Run(Tensors{x, Tensor(), mask}, ctx);
    return Dot(out.at(0), w_y) + Dot(out.at(1), w_b);
  };
  Context ctx;
  Tensors out = block.Run(Tensors{x, Tensor(), mask}, ctx);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].shape(), tensor::Shape({1, 2, 5, 5}));
  Tensors grads = block.RunBackward(Tensors{w_y, w_b}, ctx);
  ASSERT_EQ(grads.size(), 3u);
  EXPECT_FALSE(grads[T5Block::kPositionBias].defined());
  EXPECT_TRUE(AllClose(grads[T5Block::kX],
                       NumericalGradient([&](const Tensor&) { return loss(); }, x, 1e-3), 1e-3,
                       1e-2));
  for (auto& [name, p] : block.NamedParameters()) {
    const Tensor numeric = NumericalGradient([&](const Tensor&) { return loss(); }, p->value, 1e-3);
    EXPECT_TRUE(AllClose(p->grad, numeric, 1e-3, 1e-2)) << name;
  }
}

// Decoder block 1: takes the first block's bias, the encoder output and its mask.
TEST(T5BlockTest, DecoderBlockGradientsMatchFiniteDifferences) {
  T5Block block(AsV1_1(Tiny()), /*is_decoder=*/true, /*has_relative_bias=*/false);
  Randomize(block, 5);
  const Tensor x = RandomTensor({2, 4, 8}, 21);
  const Tensor bias = RandomTensor({1, 2, 4, 4}, 22);
  const Tensor enc = RandomTensor({2, 3, 8}, 23);
  const Tensor enc_mask = Tensor::FromData<int64_t>({1, 1, 0, 1, 1, 1}, {2, 3});
  const Tensor w_y = RandomTensor({2, 4, 8}, 24);
  const Tensors inputs = {x, bias, Tensor(), enc, enc_mask};
  auto loss = [&]() {
    Context ctx;
    return Dot(block.Run(inputs, ctx).at(0), w_y);
  };
  Context ctx;
  Tensors out = block.Run(inputs, ctx);
  ASSERT_EQ(out.size(), 1u);
  Tensors grads = block.RunBackward(Tensors{w_y}, ctx);
  ASSERT_EQ(grads.size(), 5u);
  auto numeric = [&](const Tensor& t) {
    return NumericalGradient([&](const Tensor&) { return loss(); }, t, 1e-3);
  };
  EXPECT_TRUE(AllClose(grads[T5Block::kX], numeric(x), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(grads[T5Block::kPositionBias], numeric(bias), 1e-3, 1e-2));
  EXPECT_TRUE(AllClose(grads[T5Block::kEncoderHidden], numeric(enc), 1e-3, 1e-2));
  EXPECT_FALSE(grads[T5Block::kMask].defined());
  EXPECT_FALSE(grads[T5Block::kEncoderMask].defined());
  // The masked encoder position gets no gradient.
  const std::vector<float> g_enc = grads[T5Block::kEncoderHidden].ToVector<float>();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(g_enc[2 * 8 + i], 0.0f);
  for (auto& [name, p] : block.NamedParameters()) {
    EXPECT_TRUE(AllClose(p->grad, numeric(p->value), 1e-3, 1e-2)) << name;
  }
}

TEST(T5BlockTest, WrongInputsAreClearErrors) {
  T5Block encoder(Tiny(), false, true);
  T5Block decoder(Tiny(), true, false);
  encoder.Materialize(1);
  decoder.Materialize(1);
  const Tensor x = RandomTensor({1, 3, 8}, 1);
  Context ctx;
  try {
    encoder.Run(Tensors{x, Tensor(), Tensor(), x}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[t5_block] an encoder block takes no encoder_hidden");
  }
  try {
    decoder.Run(Tensors{x}, ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[t5_block] a decoder block needs encoder_hidden (B, S, d_model)");
  }
}

}  // namespace
}  // namespace t5
