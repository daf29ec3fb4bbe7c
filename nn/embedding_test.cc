// Embedding layer: lookup, finite-difference gradients with repeated ids,
// bf16 weights with fp32 gradients, and error messages.
#include "nn/embedding.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::Dot;
using tensor::testing::NumericalGradient;
using tensor::testing::RandomTensor;

Tensor Ids64(const std::vector<int64_t>& v, const tensor::Shape& shape) {
  return Tensor::FromData<int64_t>(v, shape);
}

TEST(EmbeddingTest, LooksUpRowsForI32AndI64Ids) {
  Embedding emb(4, 2);
  emb.Materialize(1);
  emb.weight()->value = Tensor::FromVector({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Context c1, c2;
  Tensor y = emb.Run(Ids64({3, 0, 2, 2}, {2, 2}), c1);
  EXPECT_EQ(y.shape(), tensor::Shape({2, 2, 2}));
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{30, 31, 0, 1, 20, 21, 20, 21}));
  Tensor y32 = emb.Run(Tensor::FromData<int32_t>(std::vector<int32_t>{1}, {1}), c2);
  EXPECT_EQ(y32.ToVector<float>(), (std::vector<float>{10, 11}));
}

TEST(EmbeddingTest, NamesAndInit) {
  Embedding emb(1000, 64);
  EXPECT_EQ(emb.class_name(), "Embedding");
  auto params = emb.NamedParameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_FALSE(params[0].second->weight_decay);
  emb.Materialize(7);
  std::vector<float> w = emb.weight()->value.ToVector<float>();
  double sum = 0, sq = 0;
  for (float v : w) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / w.size();
  const double std = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std, 0.02, 1e-3);  // minGPT: Normal(0, 0.02)
}

TEST(EmbeddingTest, GradientsMatchFiniteDifferences) {
  Embedding emb(5, 3);
  emb.Materialize(2);
  emb.weight()->value = RandomTensor({5, 3}, 3);
  const Tensor ids = Ids64({4, 1, 1, 0, 4, 4}, {2, 3});  // repeats; id 2 and 3 never used
  const Tensor w_out = RandomTensor({2, 3, 3}, 4);
  auto loss = [&](const Tensor&) {
    Context c;
    return Dot(emb.Run(ids, c), w_out);
  };
  Context ctx;
  emb.Run(ids, ctx);
  Tensors g = emb.RunBackward(Tensors{w_out}, ctx);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(g[0].defined());  // ids get no gradient
  EXPECT_EQ(emb.weight()->grad.dtype(), Dtype::kF32);
  EXPECT_TRUE(
      AllClose(emb.weight()->grad, NumericalGradient(loss, emb.weight()->value), 1e-3, 1e-2));
  std::vector<float> gw = emb.weight()->grad.ToVector<float>();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(gw[2 * 3 + c], 0.0f);
    EXPECT_EQ(gw[3 * 3 + c], 0.0f);
  }
  // A second backward accumulates.
  emb.Run(ids, ctx);
  emb.RunBackward(Tensors{w_out}, ctx);
  std::vector<float> gw2 = emb.weight()->grad.ToVector<float>();
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_FLOAT_EQ(gw2[i], 2 * gw[i]);
}

TEST(EmbeddingTest, Bf16WeightKeepsFp32Gradients) {
  Embedding ref(6, 4), low(6, 4);
  ref.Materialize(5);
  low.Materialize(5);
  low.weight()->value = ref.weight()->value.To(Dtype::kBF16);
  const Tensor ids = Ids64({5, 0, 3, 5}, {4});
  Context c1, c2;
  Tensor y_ref = ref.Run(ids, c1);
  Tensor y_low = low.Run(ids, c2);
  EXPECT_EQ(y_low.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(y_low, y_ref, 1e-3, 1e-2));
  const Tensor g = RandomTensor({4, 4}, 6);
  ref.RunBackward(Tensors{g}, c1);
  low.RunBackward(Tensors{g.To(Dtype::kBF16)}, c2);  // the gradient of a bf16 output
  EXPECT_EQ(low.weight()->grad.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(low.weight()->grad, ref.weight()->grad, 1e-2, 1e-2));
}

TEST(EmbeddingTest, BadIdsAreClearErrors) {
  Embedding emb(4, 2);
  emb.Materialize(1);
  Context ctx;
  try {
    emb.Run(Tensor::Zeros({2, 3}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[embedding] ids must be i32 or i64; got (2,3) f32");
  }
  try {
    emb.Run(Ids64({1, 4}, {2}), ctx);
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[embedding] ", 0), 0u) << e.what();
  }
  Embedding unmaterialized(4, 2);
  EXPECT_THROW(unmaterialized.Run(Ids64({1}, {1}), ctx), tensor::OpError);
  // An owner that checks its ids spares a GPU the check; the CPU checks anyway.
  EmbeddingOptions owned;
  owned.owner_checks_ids = true;
  Embedding positions(4, 2, owned);
  positions.Materialize(1);
  EXPECT_THROW(positions.Run(Ids64({1, 4}, {2}), ctx), tensor::OpError);
}

}  // namespace
}  // namespace nn
