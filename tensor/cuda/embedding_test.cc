// Embedding on the GPU against the CPU: the gather (any dtype, i32 / i64 ids)
// and the backward, both bit for bit (the GPU sums each row in the CPU's
// position order), accumulation into f32, out-of-range ids (reported at the
// next wait: a deferred check), determinism.
#include "tensor/ops/embedding.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using testing::RandomTensor;

constexpr Tolerance kExact{0.0, 0.0};

Tensor Ids(const std::vector<int64_t>& v, const Shape& shape, Dtype dtype) {
  return Tensor::FromData<int64_t>(v, shape).To(dtype);
}

// The sum of an f32 tensor's elements.
float Total(const Tensor& t) {
  float sum = 0.0f;
  for (float x : t.ToVector<float>()) sum += x;
  return sum;
}

// n ids in [0, hi) (many repeats when hi is small).
Tensor RandomIds(const Shape& shape, uint64_t seed, float hi, Dtype dtype = Dtype::kI64) {
  return RandomTensor(shape, seed, 0.0f, hi).To(dtype);
}

TEST(CudaEmbeddingTest, GatherEveryDtypeBitForBit) {
  SKIP_WITHOUT_GPU();
  for (Dtype id_dtype : {Dtype::kI32, Dtype::kI64}) {
    const Tensor ids = RandomIds({4, 33}, 1, 50.0f, id_dtype);
    // Row widths: 16-byte units (768 f32), 8-byte (2 f32), 2-byte (3 bf16).
    for (int64_t c : {768, 2, 3, 37}) {
      for (Dtype d : FloatDtypes()) {
        const Tensor w = RandomTensor({50, c}, 2, -1.0f, 1.0f, d);
        EXPECT_TRUE(MatchesCpu(Embedding(ToGpu(w), ToGpu(ids)), Embedding(w, ids), kExact))
            << DtypeName(d) << " C=" << c;
      }
    }
  }
  // A strided (transposed) id tensor and a u8 table.
  const Tensor ids = RandomIds({6, 5}, 3, 10.0f);
  const Tensor w = RandomTensor({10, 7}, 4, 0.0f, 200.0f).To(Dtype::kU8);
  EXPECT_TRUE(MatchesCpu(Embedding(ToGpu(w), ToGpu(ids).Transpose(0, 1)),
                         Embedding(w, ids.Transpose(0, 1)), kExact));
}

TEST(CudaEmbeddingTest, BackwardBitForBitWithRepeatedIds) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    for (int64_t vocab : {1, 7, 1000, 50257}) {
      const Tensor ids = RandomIds({2, 2048}, 5, std::min<float>(vocab, 60.0f));
      const Tensor g = RandomTensor({2, 2048, 96}, 6, -1.0f, 1.0f, d);
      EXPECT_TRUE(MatchesCpu(EmbeddingBackward(ToGpu(g), ToGpu(ids), vocab),
                             EmbeddingBackward(g, ids, vocab), kExact))
          << DtypeName(d) << " V=" << vocab;
    }
  }
}

TEST(CudaEmbeddingTest, AccumulateIntoF32BitForBit) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor ids = RandomIds({513}, 7, 40.0f, Dtype::kI32);
    const Tensor g = RandomTensor({513, 65}, 8, -1.0f, 1.0f, d);
    const Tensor gw0 = RandomTensor({100, 65}, 9);
    Tensor gw_cpu = gw0.Clone();
    Tensor gw_gpu = ToGpu(gw0);
    for (int i = 0; i < 2; ++i) {
      EmbeddingBackwardAccumulate(g, ids, gw_cpu);
      EmbeddingBackwardAccumulate(ToGpu(g), ToGpu(ids), gw_gpu);
    }
    EXPECT_TRUE(MatchesCpu(gw_gpu, gw_cpu, kExact)) << DtypeName(d);
  }
}

// ids_checked (nn::Embedding's backward, after its forward checked the
// ids): the same sums, and an id out of range adds nothing rather than
// writing outside the table.
TEST(CudaEmbeddingTest, AccumulateWithIdsCheckedByTheForward) {
  SKIP_WITHOUT_GPU();
  const Tensor ids = RandomIds({300}, 13, 50.0f, Dtype::kI64);
  const Tensor g = RandomTensor({300, 33}, 14);
  const Tensor gw0 = RandomTensor({50, 33}, 15);
  Tensor checked = ToGpu(gw0);
  Tensor trusted = ToGpu(gw0);
  EmbeddingBackwardAccumulate(ToGpu(g), ToGpu(ids), checked);
  EmbeddingBackwardAccumulate(ToGpu(g), ToGpu(ids), trusted, /*ids_checked=*/true);
  EXPECT_TRUE(MatchesCpu(trusted, ToCpu(checked), kExact));

  // Rows 0 and 3 receive their gradient; ids 5, -1 and 4 (V = 4) add nothing.
  Tensor table = ToGpu(Tensor::Zeros({4, 2}));
  const Tensor rows = Tensor::FromVector({1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, {5, 2});
  EmbeddingBackwardAccumulate(ToGpu(rows), ToGpu(Ids({0, 5, -1, 3, 4}, {5}, Dtype::kI64)), table,
                              /*ids_checked=*/true);
  EXPECT_EQ(ToCpu(table).ToVector<float>(), std::vector<float>({1, 1, 0, 0, 0, 0, 4, 4}));
}

TEST(CudaEmbeddingTest, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const Tensor ids = ToGpu(RandomIds({16384}, 10, 5.0f));  // heavy repeats
  const Tensor g = ToGpu(RandomTensor({16384, 256}, 11));
  const std::vector<float> a = ToCpu(EmbeddingBackward(g, ids, 5)).ToVector<float>();
  const std::vector<float> b = ToCpu(EmbeddingBackward(g, ids, 5)).ToVector<float>();
  EXPECT_EQ(a, b);
}

TEST(CudaEmbeddingTest, EmptyIds) {
  SKIP_WITHOUT_GPU();
  const Tensor ids = Tensor::Empty({0}, Dtype::kI64);
  const Tensor w = RandomTensor({4, 3}, 12);
  EXPECT_EQ(Embedding(ToGpu(w), ToGpu(ids)).shape(), Shape({0, 3}));
  EXPECT_TRUE(MatchesCpu(EmbeddingBackward(ToGpu(Tensor::Empty({0, 3})), ToGpu(ids), 4),
                         EmbeddingBackward(Tensor::Empty({0, 3}), ids, 4), kExact));  // zeros
}

// The error of the CPU's check, thrown at the host's next wait for the GPU
// (here the copy back) rather than by the op, which queues the check and
// returns; the rows of the bad ids are zeros meanwhile.
TEST(CudaEmbeddingTest, OutOfRangeIdsAreReportedAtTheNextWait) {
  SKIP_WITHOUT_GPU();
  const Tensor w = Tensor::Full({5, 3}, 1.0);
  for (Dtype id_dtype : {Dtype::kI32, Dtype::kI64}) {
    // Two bad ids: the first position is named.
    const Tensor ids = Ids({1, 2, 7, -1}, {2, 2}, id_dtype);
    const Tensor out = Embedding(ToGpu(w), ToGpu(ids));  // queued, no throw
    try {
      ToCpu(out);
      FAIL() << "expected OpError";
    } catch (const OpError& e) {
      EXPECT_STREQ(e.what(),
                   "[embedding] id 7 at position [1,0] of ids (2,2) is out of range for 5 "
                   "embeddings (weight (5,3) f32; checked on the GPU, reported at the next wait "
                   "for it)");
    }
    // Reported once: the same rows read again, zeros where the ids were bad.
    EXPECT_EQ(ToCpu(out).ToVector<float>(),
              std::vector<float>({1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
  }
  const Tensor grad = EmbeddingBackward(ToGpu(Tensor::Full({2, 4}, 1.0)),
                                        ToGpu(Ids({0, -3}, {2}, Dtype::kI32)), 5);
  try {
    ToCpu(grad);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[embedding_backward] id -3 at position [1]"), std::string::npos) << msg;
  }
  EXPECT_EQ(Total(ToCpu(grad)), 4.0f);  // row 0 only: -3 added nothing
  EXPECT_THROW(Embedding(ToGpu(w), Ids({0}, {1}, Dtype::kI64)), OpError);  // devices differ
  EXPECT_THROW(Embedding(ToGpu(w), ToGpu(Tensor::Zeros({2}))), OpError);   // f32 ids
}

// Checks that pass report nothing; many of them with no wait between stay
// bounded (at 64 unread, the next check waits for the oldest and reads those
// arrived) and a failed one among them is still the one reported, with its
// own position.
TEST(CudaEmbeddingTest, ManyChecksWithoutAWaitReportTheFailedOne) {
  SKIP_WITHOUT_GPU();
  const Tensor w = ToGpu(Tensor::Full({5, 3}, 1.0));
  const Tensor good = ToGpu(Ids({0, 4, 2}, {3}, Dtype::kI64));
  for (int i = 0; i < 100; ++i) Embedding(w, good);
  EXPECT_EQ(Total(ToCpu(Embedding(w, good))), 9.0f);
  try {
    for (int i = 0; i < 200; ++i) {
      Embedding(w, i == 150 ? ToGpu(Ids({0, 4, 5}, {3}, Dtype::kI64)) : good);
    }
    ToCpu(w);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[embedding] id 5 at position [2] of ids (3)"), std::string::npos) << msg;
  }
  EXPECT_EQ(Total(ToCpu(Embedding(w, good))), 9.0f);  // nothing left to report
}

}  // namespace
}  // namespace tensor
