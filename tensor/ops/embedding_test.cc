// Tests of Embedding / EmbeddingBackward(Accumulate): gathers against a plain
// loop, scatter-add with repeated ids against a double reference and finite
// differences, low precision paths, and id / shape errors.
#include "tensor/ops/embedding.h"

#include <vector>

#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using testing::AllClose;
using testing::Dot;
using testing::NumericalGradient;
using testing::RandomTensor;

Tensor Ids(const std::vector<int64_t>& v, const Shape& shape, Dtype dtype) {
  return Tensor::FromData<int64_t>(v, shape).To(dtype);
}

// grad_weight[v] = sum of grad_out rows with ids == v, in double.
Tensor ReferenceBackward(const Tensor& grad_out, const std::vector<int64_t>& ids, int64_t vocab) {
  const int64_t c = grad_out.dim(-1);
  const std::vector<float> g = grad_out.ToVector<float>();
  std::vector<double> acc(vocab * c, 0.0);
  for (size_t n = 0; n < ids.size(); ++n) {
    for (int64_t j = 0; j < c; ++j) acc[ids[n] * c + j] += g[n * c + j];
  }
  return Tensor::FromVector(std::vector<float>(acc.begin(), acc.end()), {vocab, c});
}

TEST(EmbeddingTest, GathersRowsForI32AndI64Ids) {
  const Tensor w = RandomTensor({7, 5}, 1);
  const std::vector<float> wv = w.ToVector<float>();
  const std::vector<int64_t> idv = {3, 0, 6, 3, 1, 2};
  for (Dtype idt : {Dtype::kI32, Dtype::kI64}) {
    const Tensor out = Embedding(w, Ids(idv, {2, 3}, idt));
    EXPECT_EQ(out.shape(), Shape({2, 3, 5}));
    const std::vector<float> ov = out.ToVector<float>();
    for (size_t n = 0; n < idv.size(); ++n) {
      for (int j = 0; j < 5; ++j) EXPECT_EQ(ov[n * 5 + j], wv[idv[n] * 5 + j]) << n << "," << j;
    }
  }
  // bf16 tables are copied bit for bit; a scalar id gives one row.
  const Tensor wb = w.To(Dtype::kBF16);
  const Tensor ob = Embedding(wb, Ids(idv, {6}, Dtype::kI64));
  EXPECT_EQ(ob.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(ob, Embedding(wb.To(Dtype::kF32), Ids(idv, {6}, Dtype::kI64)), 0, 0));
  const Tensor row = Embedding(w, Ids({4}, {}, Dtype::kI32));
  EXPECT_EQ(row.shape(), Shape({5}));
  EXPECT_TRUE(AllClose(row, w.Select(0, 4), 0, 0));
}

TEST(EmbeddingTest, BackwardSumsRepeatedIds) {
  const std::vector<int64_t> idv = {2, 5, 2, 2, 0, 5, 9, 2};
  const Tensor g = RandomTensor({2, 4, 13}, 2);
  for (Dtype idt : {Dtype::kI32, Dtype::kI64}) {
    const Tensor gw = EmbeddingBackward(g, Ids(idv, {2, 4}, idt), 11);
    EXPECT_EQ(gw.shape(), Shape({11, 13}));
    EXPECT_TRUE(AllClose(gw, ReferenceBackward(g, idv, 11), 1e-6, 1e-6));
    // Rows never looked up are zero.
    for (int64_t v : {1, 3, 4, 6, 7, 8, 10}) {
      for (float x : gw.Select(0, v).ToVector<float>()) EXPECT_EQ(x, 0.0f);
    }
  }
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferences) {
  Tensor w = RandomTensor({6, 4}, 3);
  const Tensor ids = Ids({1, 4, 1, 1, 5}, {5}, Dtype::kI64);
  const Tensor probe = RandomTensor({5, 4}, 4);
  auto loss = [&](const Tensor&) { return Dot(Embedding(w, ids), probe); };
  EXPECT_TRUE(AllClose(EmbeddingBackward(probe, ids, 6), NumericalGradient(loss, w), 1e-3, 1e-3));
}

TEST(EmbeddingTest, AccumulateAddsToExistingGradients) {
  const std::vector<int64_t> idv = {0, 3, 3, 1};
  const Tensor g = RandomTensor({4, 9}, 5);
  const Tensor base = RandomTensor({4, 9}, 6);
  const Tensor acc = base.Clone();
  EmbeddingBackwardAccumulate(g, Ids(idv, {4}, Dtype::kI32), acc);
  const std::vector<float> bv = base.ToVector<float>();
  const std::vector<float> rv = ReferenceBackward(g, idv, 4).ToVector<float>();
  std::vector<float> expected(bv.size());
  for (size_t i = 0; i < bv.size(); ++i) expected[i] = bv[i] + rv[i];
  EXPECT_TRUE(AllClose(acc, Tensor::FromVector(expected, {4, 9}), 1e-6, 1e-6));
  // Row 2 was never looked up: unchanged.
  EXPECT_TRUE(AllClose(acc.Select(0, 2), base.Select(0, 2), 0, 0));
}

TEST(EmbeddingTest, Bf16GradientsAccumulateInF32) {
  // 300 bf16 rows of ones into one id: an f32 accumulator gives exactly 300,
  // where summing in bf16 would stall at 256.
  const Tensor g = Tensor::Full({300, 4}, 1.0, Dtype::kBF16);
  const Tensor ids = Tensor::Zeros({300}, Dtype::kI64);
  const Tensor gw = EmbeddingBackward(g, ids, 2);
  EXPECT_EQ(gw.dtype(), Dtype::kBF16);
  for (float v : gw.Select(0, 0).ToVector<float>()) EXPECT_EQ(v, 300.0f);
  const Tensor gw32 = Tensor::Zeros({2, 4});
  EmbeddingBackwardAccumulate(g, ids, gw32);
  EmbeddingBackwardAccumulate(g, ids, gw32);
  for (float v : gw32.Select(0, 0).ToVector<float>()) EXPECT_EQ(v, 600.0f);

  const Tensor gr = RandomTensor({64, 24}, 7, -1.0f, 1.0f, Dtype::kBF16);
  const Tensor idr = RandomTensor({64}, 8, 0.0f, 10.0f).To(Dtype::kI32);
  EXPECT_TRUE(AllClose(EmbeddingBackward(gr, idr, 10),
                       EmbeddingBackward(gr.To(Dtype::kF32), idr, 10), 1e-2, 1e-2));
}

TEST(EmbeddingTest, LargeBackwardIsDeterministicAndCorrect) {
  const int64_t n = 4096, vocab = 1000, c = 33;
  const Tensor ids = RandomTensor({n}, 9, 0.0f, 50.0f).To(Dtype::kI64);  // heavy repeats
  const Tensor g = RandomTensor({n, c}, 10);
  const Tensor a = EmbeddingBackward(g, ids, vocab);
  const Tensor b = EmbeddingBackward(g, ids, vocab);
  EXPECT_TRUE(AllClose(a, b, 0, 0));
  EXPECT_TRUE(AllClose(a, ReferenceBackward(g, ids.ToVector<int64_t>(), vocab), 1e-5, 1e-5));
}

TEST(EmbeddingTest, ErrorsNameTheOpIdPositionAndShapes) {
  const Tensor w = Tensor::Zeros({5, 3});
  try {
    Embedding(w, Ids({1, 2, 7, 0}, {2, 2}, Dtype::kI64));
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[embedding] id 7 at position [1,0] of ids (2,2) is out of range for 5 "
                 "embeddings (weight (5,3) f32)");
  }
  EXPECT_THROW(Embedding(w, Ids({-1}, {1}, Dtype::kI32)), OpError);
  // ids_checked only lets a GPU skip its check: the CPU checks anyway.
  EXPECT_THROW(Embedding(w, Ids({-1}, {1}, Dtype::kI32), /*ids_checked=*/true), OpError);
  EXPECT_THROW(Embedding(w, Tensor::Zeros({2})), OpError);  // f32 ids
  EXPECT_THROW(Embedding(Tensor::Zeros({5}), Ids({0}, {1}, Dtype::kI32)), OpError);
  try {
    EmbeddingBackward(Tensor::Zeros({3, 4}), Ids({0, 1}, {2}, Dtype::kI32), 5);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_STREQ(e.what(),
                 "[embedding_backward] grad_out (3,4) f32 does not match ids (2): expected (2,4)");
  }
  EXPECT_THROW(EmbeddingBackward(Tensor::Zeros({2, 4}), Ids({0, 5}, {2}, Dtype::kI32), 5),
               OpError);
  EXPECT_THROW(EmbeddingBackwardAccumulate(Tensor::Zeros({2, 4}), Ids({0, 1}, {2}, Dtype::kI32),
                                           Tensor::Zeros({4, 5}).Transpose(0, 1)),
               OpError);
}

}  // namespace
}  // namespace tensor
