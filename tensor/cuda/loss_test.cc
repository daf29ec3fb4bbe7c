// Cross-entropy on the GPU against the CPU: forward (loss, lse, count),
// backward, and the fused in-place forward + backward; V = 50257 (rows that
// are not 16-byte aligned), tiny V, more than 65535 rows, i32 and i64 targets,
// ignore_index (some, all, and one that is a class id), the error for targets
// out of range (the fused op then leaves the logits alone), a loss that is
// bit-identical across runs, and every size a row's block may be given
// (cuda::SetCrossEntropyRowThreads).
#include "tensor/ops/loss.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/loss.h"
#include "tensor/cuda/testing.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::DefaultTolerance;
using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using testing::RandomTensor;

// Targets in [0, v), every `ignore_every`-th one ignore_index (0: none).
Tensor RandomTargets(const Shape& shape, int64_t v, uint64_t seed, int ignore_every, Dtype dtype,
                     int64_t ignore_index = kDefaultIgnoreIndex) {
  std::vector<int64_t> t(shape.numel());
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < t.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[i] = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(v));
    if (ignore_every > 0 && i % ignore_every == 1) t[i] = ignore_index;
  }
  return Tensor::FromData<int64_t>(t, shape).To(dtype);
}

// Loss and lse: sums of up to 50257 exponentials in another order.
Tolerance LossTolerance() { return DefaultTolerance(Dtype::kF32, 10.0); }

// Gradients (softmax - onehot) * scale: relative error from the lse, one
// rounding in bf16 / f16 (f16 subnormals for the small probabilities).
Tolerance GradTolerance(Dtype d) {
  switch (d) {
    case Dtype::kBF16:
      return {1.6e-2, 1e-9};
    case Dtype::kF16:
      return {2e-3, 1e-7};
    default:
      return {1e-4, 1e-9};
  }
}

struct Case {
  Shape logits;
  int ignore_every;
};

std::vector<Case> Cases() {
  return {{{6, 37}, 3},       {{3, 1}, 0},     {{2, 5, 129}, 4},
          {{4, 8, 50257}, 5}, {{3, 50257}, 0}, {{70000, 11}, 7}};
}

Shape RowsOf(const Shape& logits) {
  Shape rows;
  for (int i = 0; i + 1 < logits.rank(); ++i) rows.push_back(logits[i]);
  return rows;
}

TEST(CudaLossTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Case& c : Cases()) {
    const int64_t v = c.logits[c.logits.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      for (Dtype idt : {Dtype::kI32, Dtype::kI64}) {
        SCOPED_TRACE(c.logits.ToString() + " " + std::string(DtypeName(d)) + " targets " +
                     std::string(DtypeName(idt)));
        const Tensor x = RandomTensor(c.logits, ++seed, -5.0f, 5.0f, d);
        const Tensor t = RandomTargets(RowsOf(c.logits), v, ++seed, c.ignore_every, idt);
        const CrossEntropyResult cpu = CrossEntropy(x, t);
        const CrossEntropyResult gpu = CrossEntropy(ToGpu(x), ToGpu(t));
        EXPECT_EQ(gpu.count, cpu.count);
        EXPECT_EQ(gpu.ignore_index, cpu.ignore_index);
        EXPECT_TRUE(MatchesCpu(gpu.loss, cpu.loss, LossTolerance()));
        EXPECT_TRUE(MatchesCpu(gpu.lse, cpu.lse, LossTolerance()));
        // grad_loss = count: gradients are softmax - onehot (not tiny).
        const float grad_loss = cpu.count == 0 ? 1.0f : static_cast<float>(cpu.count);
        EXPECT_TRUE(MatchesCpu(CrossEntropyBackward(ToGpu(x), ToGpu(t), gpu, grad_loss),
                               CrossEntropyBackward(x, t, cpu, grad_loss), GradTolerance(d)));
        EXPECT_TRUE(MatchesCpu(CrossEntropyBackward(ToGpu(x), ToGpu(t), gpu, 2.5f),
                               CrossEntropyBackward(x, t, cpu, 2.5f), GradTolerance(d)));
      }
    }
  }
}

TEST(CudaLossTest, FusedInPlaceMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (const Case& c : Cases()) {
    const int64_t v = c.logits[c.logits.rank() - 1];
    for (Dtype d : FloatDtypes()) {
      SCOPED_TRACE(c.logits.ToString() + " " + std::string(DtypeName(d)));
      const Tensor x = RandomTensor(c.logits, ++seed, -5.0f, 5.0f, d);
      const Tensor t = RandomTargets(RowsOf(c.logits), v, ++seed, c.ignore_every, Dtype::kI64);
      const float grad_loss = 3.0f;
      const Tensor cpu_logits = x.Clone();
      const CrossEntropyResult cpu = CrossEntropyForwardBackwardInPlace(cpu_logits, t, grad_loss);
      const Tensor gpu_logits = ToGpu(x);
      const CrossEntropyResult gpu =
          CrossEntropyForwardBackwardInPlace(gpu_logits, ToGpu(t), grad_loss);
      EXPECT_EQ(gpu.count, cpu.count);
      EXPECT_TRUE(MatchesCpu(gpu.loss, cpu.loss, LossTolerance()));
      EXPECT_TRUE(MatchesCpu(gpu.lse, cpu.lse, LossTolerance()));
      EXPECT_TRUE(MatchesCpu(gpu_logits, cpu_logits, GradTolerance(d)));
    }
  }
}

// Logits as an aligned LM head writes them (nn::LinearOptions::
// align_output_rows): (B, T, V) rows of a (B*T, ceil64(V)) buffer. The
// kernels read and overwrite the rows in place, leave the padding alone, and
// give what contiguous logits give.
TEST(CudaLossTest, RowPaddedLogitsMatchContiguous) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const Shape& shape : {Shape({2, 3, 50257}), Shape({4, 37})}) {
    for (Dtype d : {Dtype::kBF16, Dtype::kF32}) {
      SCOPED_TRACE(shape.ToString() + " " + std::string(DtypeName(d)));
      const int64_t v = shape[shape.rank() - 1], ld = (v + 63) / 64 * 64, n = shape.numel() / v;
      const Tensor x = RandomTensor(shape, ++seed, -5.0f, 5.0f, d);
      const Tensor t = RandomTargets(RowsOf(shape), v, ++seed, 3, Dtype::kI64);
      const Tensor buffer = ToGpu(Tensor::Full({n, ld}, 9.0, d));  // (N, ld); pads stay 9
      Tensor padded = buffer.Narrow(1, 0, v).Reshape(shape);
      ASSERT_EQ(padded.RowStride(), ld);
      padded.CopyFrom(ToGpu(x));
      const CrossEntropyResult plain = CrossEntropy(ToGpu(x), ToGpu(t));
      const CrossEntropyResult strided = CrossEntropy(padded, ToGpu(t));
      EXPECT_EQ(strided.count, plain.count);
      EXPECT_TRUE(MatchesCpu(strided.loss, ToCpu(plain.loss), LossTolerance()));
      EXPECT_TRUE(MatchesCpu(CrossEntropyBackward(padded, ToGpu(t), strided, 2.0f),
                             ToCpu(CrossEntropyBackward(ToGpu(x), ToGpu(t), plain, 2.0f)),
                             GradTolerance(d)));
      const Tensor contiguous = ToGpu(x);
      const CrossEntropyResult in_place = CrossEntropyForwardBackwardInPlace(contiguous, ToGpu(t));
      const CrossEntropyResult in_place_padded =
          CrossEntropyForwardBackwardInPlace(padded, ToGpu(t));
      EXPECT_TRUE(MatchesCpu(in_place_padded.loss, ToCpu(in_place.loss), LossTolerance()));
      EXPECT_TRUE(MatchesCpu(padded, ToCpu(contiguous), GradTolerance(d)));
      for (float pad : buffer.Narrow(1, v, ld - v).ToVector<float>()) ASSERT_EQ(pad, 9.0f);
    }
  }
}

TEST(CudaLossTest, IgnoreIndexAllIgnoredAndClassIdIgnoreIndex) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({5, 50257}, 7, -3.0f, 3.0f, d);
    // Every target ignored: loss 0 (not NaN), zero gradients.
    const Tensor all = Tensor::Full({5}, -100.0, Dtype::kI64);
    const CrossEntropyResult res = CrossEntropy(ToGpu(x), ToGpu(all));
    EXPECT_EQ(res.count, 0);
    EXPECT_EQ(res.loss.Item(), 0.0);
    EXPECT_TRUE(MatchesCpu(CrossEntropyBackward(ToGpu(x), ToGpu(all), res),
                           Tensor::Zeros({5, 50257}, d), {0.0, 0.0}));
    const Tensor logits = ToGpu(x);
    const CrossEntropyResult fused = CrossEntropyForwardBackwardInPlace(logits, ToGpu(all));
    EXPECT_EQ(fused.loss.Item(), 0.0);
    EXPECT_TRUE(MatchesCpu(logits, Tensor::Zeros({5, 50257}, d), {0.0, 0.0}));
    // ignore_index 0 is a class id: targets 0 are ignored, others counted.
    const Tensor t = Tensor::FromData<int64_t>({0, 3, 0, 50256, 9}, {5});
    const CrossEntropyResult cpu = CrossEntropy(x, t, 0);
    const CrossEntropyResult gpu = CrossEntropy(ToGpu(x), ToGpu(t), 0);
    EXPECT_EQ(gpu.count, 3);
    EXPECT_TRUE(MatchesCpu(gpu.loss, cpu.loss, LossTolerance()));
    EXPECT_TRUE(MatchesCpu(CrossEntropyBackward(ToGpu(x), ToGpu(t), gpu, 3.0f),
                           CrossEntropyBackward(x, t, cpu, 3.0f), GradTolerance(d)));
  }
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const OpError& e) {
    return e.what();
  }
  return "no error";
}

TEST(CudaLossTest, TargetsOutOfRangeAreTheCpuError) {
  SKIP_WITHOUT_GPU();
  const Tensor x = RandomTensor({2, 3, 10}, 11);
  const Tensor bad = Tensor::FromData<int64_t>({1, 2, -100, 10, 4, -3}, {2, 3});
  const std::string cpu_error = ErrorOf([&] { CrossEntropy(x, bad); });
  EXPECT_NE(cpu_error, "no error");
  EXPECT_EQ(ErrorOf([&] { CrossEntropy(ToGpu(x), ToGpu(bad)); }), cpu_error);
  EXPECT_EQ(ErrorOf([&] { CrossEntropy(ToGpu(x), ToGpu(bad.To(Dtype::kI32))); }), cpu_error);
  // The fused op throws before it writes: the logits are unchanged.
  const Tensor logits = ToGpu(x);
  EXPECT_EQ(ErrorOf([&] { CrossEntropyForwardBackwardInPlace(logits, ToGpu(bad)); }), cpu_error);
  EXPECT_TRUE(MatchesCpu(logits, x, {0.0, 0.0}));
  // The backward checks the targets too, and their count against the forward's.
  const Tensor good = Tensor::FromData<int64_t>({1, 2, -100, 9, 4, 0}, {2, 3});
  const CrossEntropyResult res = CrossEntropy(ToGpu(x), ToGpu(good));
  EXPECT_THROW(CrossEntropyBackward(ToGpu(x), ToGpu(bad), res), OpError);
  const Tensor fewer = Tensor::FromData<int64_t>({1, -100, -100, 9, 4, 0}, {2, 3});
  EXPECT_THROW(CrossEntropyBackward(ToGpu(x), ToGpu(fewer), res), OpError);
  // Targets on another device than the logits.
  EXPECT_THROW(CrossEntropy(ToGpu(x), good), OpError);
  EXPECT_THROW(CrossEntropy(ToGpu(x), ToGpu(good.To(Dtype::kF32))), OpError);
}

TEST(CudaLossTest, LossIsBitIdenticalAcrossRuns) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({4096, 1000}, 13, -5.0f, 5.0f, Dtype::kBF16));
  const Tensor t = ToGpu(RandomTargets({4096}, 1000, 14, 9, Dtype::kI64));
  const CrossEntropyResult a = CrossEntropy(x, t);
  const CrossEntropyResult b = CrossEntropy(x, t);
  EXPECT_EQ(a.loss.Item(), b.loss.Item());
  EXPECT_EQ(ToCpu(a.lse).ToVector<float>(), ToCpu(b.lse).ToVector<float>());
}

// Restores the kernels' default row block size when it goes.
class RowThreadsGuard {
 public:
  RowThreadsGuard() = default;
  RowThreadsGuard(const RowThreadsGuard&) = delete;
  RowThreadsGuard& operator=(const RowThreadsGuard&) = delete;
  ~RowThreadsGuard() { cuda::SetCrossEntropyRowThreads(0); }
};

// Every row block size gives the CPU's results: one warp a row to 1024
// threads, with rows of 37 (fewer elements than threads) and 1001 (bf16 rows
// that start off 16-byte boundaries: a scalar head, vectors and a tail).
TEST(CudaLossTest, EveryRowBlockSizeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  RowThreadsGuard restore;
  uint64_t seed = 700;
  for (int threads : {32, 96, 256, 1024}) {
    cuda::SetCrossEntropyRowThreads(threads);
    ASSERT_EQ(cuda::CrossEntropyRowThreads(), threads);
    ASSERT_EQ(cuda::CrossEntropyBlockThreads(1001, 8), threads);
    for (const Shape& shape : {Shape({6, 37}), Shape({4, 1001})}) {
      for (Dtype d : {Dtype::kBF16, Dtype::kF32}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, " + shape.ToString() + " " +
                     std::string(DtypeName(d)));
        const int64_t v = shape[1];
        const Tensor x = RandomTensor(shape, ++seed, -5.0f, 5.0f, d);
        const Tensor t = RandomTargets({shape[0]}, v, ++seed, 3, Dtype::kI64);
        const Tensor cpu_logits = x.Clone();
        const CrossEntropyResult cpu = CrossEntropyForwardBackwardInPlace(cpu_logits, t, 2.0f);
        const Tensor gpu_logits = ToGpu(x);
        const CrossEntropyResult gpu =
            CrossEntropyForwardBackwardInPlace(gpu_logits, ToGpu(t), 2.0f);
        EXPECT_EQ(gpu.count, cpu.count);
        EXPECT_TRUE(MatchesCpu(gpu.loss, cpu.loss, LossTolerance()));
        EXPECT_TRUE(MatchesCpu(gpu.lse, cpu.lse, LossTolerance()));
        EXPECT_TRUE(MatchesCpu(gpu_logits, cpu_logits, GradTolerance(d)));
      }
    }
  }
}

// The default: about 4 loads a thread, 128 to 1024 (GPT-2's rows of 50257
// bf16: 1024).
TEST(CudaLossTest, DefaultRowBlockSizes) {
  SKIP_WITHOUT_GPU();
  RowThreadsGuard restore;
  cuda::SetCrossEntropyRowThreads(0);
  EXPECT_EQ(cuda::CrossEntropyBlockThreads(50257, 8), 1024);
  EXPECT_EQ(cuda::CrossEntropyBlockThreads(50257, 1), 1024);
  EXPECT_EQ(cuda::CrossEntropyBlockThreads(8192, 8), 256);  // 1024 loads: 4 a thread
  EXPECT_EQ(cuda::CrossEntropyBlockThreads(37, 4), 128);
}

// A size that is not a multiple of a warp in [32, 1024] is refused, naming it
// (with or without a GPU), and leaves the setting as it was.
TEST(CudaLossTest, InvalidRowBlockSizesAreRefused) {
  RowThreadsGuard restore;
  cuda::SetCrossEntropyRowThreads(256);
  for (int bad : {-32, 16, 48, 1056, 2048}) {
    try {
      cuda::SetCrossEntropyRowThreads(bad);
      ADD_FAILURE() << bad << " threads a row were accepted";
    } catch (const OpError& e) {
      EXPECT_NE(std::string(e.what()).find("multiple of 32 in [32, 1024]; got " +
                                           std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(cuda::CrossEntropyRowThreads(), 256);
  }
}

}  // namespace
}  // namespace tensor
