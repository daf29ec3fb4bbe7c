// Matmul on the GPU (cuBLASLt) against the CPU op: trans flags, odd sizes,
// strided views, batched and broadcast batched, MatmulInto's beta, the
// backward, f32 / bf16 / f16, TF32, threads and errors. The plan tests at the
// top (row-major -> column-major mapping) run without a GPU.
#include "tensor/cuda/matmul.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/testing.h"
#include "tensor/memory_ledger.h"
#include "tensor/ops/matmul.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using cuda::testing::DefaultTolerance;
using cuda::testing::FloatDtypes;
using cuda::testing::MatchesCpu;
using cuda::testing::ToCpu;
using cuda::testing::ToGpu;
using cuda::testing::Tolerance;
using ::tensor::testing::RandomTensor;

// ---------------------------------------------------------------------------
// The plan (host only).
// ---------------------------------------------------------------------------

void Strides(cuda::GemmOperand* op, int64_t row_stride, int64_t col_stride) {
  op->row_stride = row_stride;
  op->col_stride = col_stride;
}

cuda::GemmArgs Args2d(int64_t m, int64_t n, int64_t k) {
  cuda::GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  Strides(&g.a, k, 1);  // row major (m, k)
  Strides(&g.b, n, 1);  // row major (k, n)
  Strides(&g.c, n, 1);
  return g;
}

TEST(CudaMatmulPlanTest, RowMajorOperandsSwapAndStayUntransposed) {
  cuda::LtPlan p;
  std::string why;
  ASSERT_TRUE(cuda::MakeLtPlan(Args2d(5, 7, 3), &p, &why)) << why;
  // C^T (7 x 5) = b^T (7 x 3) @ a^T (3 x 5).
  EXPECT_EQ(p.m, 7);
  EXPECT_EQ(p.n, 5);
  EXPECT_EQ(p.k, 3);
  EXPECT_FALSE(p.a.trans);
  EXPECT_EQ(p.a.rows, 7);
  EXPECT_EQ(p.a.cols, 3);
  EXPECT_EQ(p.a.ld, 7);
  EXPECT_FALSE(p.b.trans);
  EXPECT_EQ(p.b.rows, 3);
  EXPECT_EQ(p.b.cols, 5);
  EXPECT_EQ(p.b.ld, 3);
  EXPECT_EQ(p.c.rows, 7);
  EXPECT_EQ(p.c.cols, 5);
  EXPECT_EQ(p.c.ld, 7);
  EXPECT_EQ(p.batch, 1);
  EXPECT_TRUE(p.outer.empty());
}

TEST(CudaMatmulPlanTest, ColumnMajorOperandsBecomeTransposeFlags) {
  // a (5 x 3) stored as the transpose of a (3, 5) buffer; b (3 x 7) as the
  // transpose of a (7, 3) buffer (the Linear layer's W^T).
  cuda::GemmArgs g = Args2d(5, 7, 3);
  Strides(&g.a, 1, 5);
  Strides(&g.b, 1, 3);
  cuda::LtPlan p;
  std::string why;
  ASSERT_TRUE(cuda::MakeLtPlan(g, &p, &why)) << why;
  EXPECT_TRUE(p.a.trans);  // b's memory is column-major b (3 x 7)
  EXPECT_EQ(p.a.rows, 3);
  EXPECT_EQ(p.a.cols, 7);
  EXPECT_EQ(p.a.ld, 3);
  EXPECT_TRUE(p.b.trans);  // a's memory is column-major a (5 x 3)
  EXPECT_EQ(p.b.rows, 5);
  EXPECT_EQ(p.b.cols, 3);
  EXPECT_EQ(p.b.ld, 5);
}

TEST(CudaMatmulPlanTest, LeadingDimensionsOfNarrowedViewsAndVectors) {
  cuda::GemmArgs g = Args2d(4, 6, 3);
  g.a.row_stride = 10;  // a is a Narrow of a wider matrix
  g.c.row_stride = 8;   // c rows padded
  cuda::LtPlan p;
  std::string why;
  ASSERT_TRUE(cuda::MakeLtPlan(g, &p, &why)) << why;
  EXPECT_EQ(p.b.ld, 10);
  EXPECT_EQ(p.c.ld, 8);
  // A single row: its row stride is irrelevant, ld is the row length.
  g = Args2d(1, 6, 3);
  g.a.row_stride = 0;
  ASSERT_TRUE(cuda::MakeLtPlan(g, &p, &why)) << why;
  EXPECT_FALSE(p.b.trans);
  EXPECT_EQ(p.b.ld, 3);
}

TEST(CudaMatmulPlanTest, BatchesLastDimStridedEarlierDimsLooped) {
  cuda::GemmArgs g = Args2d(2, 3, 4);
  g.batch = {5, 6};
  g.a.batch_strides = {100, 8};
  g.b.batch_strides = {0, 0};  // broadcast
  g.c.batch_strides = {200, 6};
  cuda::LtPlan p;
  std::string why;
  ASSERT_TRUE(cuda::MakeLtPlan(g, &p, &why)) << why;
  EXPECT_EQ(p.batch, 6);
  EXPECT_EQ(p.a.batch_stride, 0);  // cuBLASLt's A is our b
  EXPECT_EQ(p.b.batch_stride, 8);  // cuBLASLt's B is our a
  EXPECT_EQ(p.c.batch_stride, 6);
  EXPECT_EQ(p.outer, Dims({5}));
  EXPECT_EQ(p.outer_a, Dims({100}));
  EXPECT_EQ(p.outer_b, Dims({0}));
  EXPECT_EQ(p.outer_c, Dims({200}));
}

TEST(CudaMatmulPlanTest, RefusesWhatTheOpLayerMustPack) {
  cuda::LtPlan p;
  std::string why;
  cuda::GemmArgs g = Args2d(4, 6, 3);
  Strides(&g.a, 6, 2);  // no unit stride
  EXPECT_FALSE(cuda::MakeLtPlan(g, &p, &why));
  EXPECT_NE(why.find("a (4x3"), std::string::npos) << why;
  g = Args2d(4, 6, 3);
  Strides(&g.c, 1, 4);  // column-major c
  EXPECT_FALSE(cuda::MakeLtPlan(g, &p, &why));
  EXPECT_NE(why.find("row major"), std::string::npos) << why;
  g = Args2d(4, 6, 3);
  g.batch = {2};  // strides missing
  EXPECT_FALSE(cuda::MakeLtPlan(g, &p, &why));
}

TEST(CudaMatmulPlanTest, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  alignas(512) static char buffer[1024];
  EXPECT_EQ(cuda::AlignmentBytes(buffer, {}), 256);
  EXPECT_EQ(cuda::AlignmentBytes(buffer + 2, {}), 2);
  EXPECT_EQ(cuda::AlignmentBytes(buffer + 64, {}), 64);
  EXPECT_EQ(cuda::AlignmentBytes(buffer, {6}), 2);    // batch items 6 bytes apart
  EXPECT_EQ(cuda::AlignmentBytes(buffer, {0}), 256);  // broadcast
  EXPECT_EQ(cuda::AlignmentBytes(buffer + 16, {-32}), 16);
}

// ---------------------------------------------------------------------------
// On the GPU against the CPU op.
// ---------------------------------------------------------------------------

// The CPU reference for any input dtype: f16 (which the CPU GEMMs lack) is
// multiplied in f32 from its exact values and rounded to the output dtype.
Tensor CpuMatmul(const Tensor& a, const Tensor& b, const MatmulOptions& opts) {
  if (a.dtype() != Dtype::kF16) return Matmul(a, b, opts);
  const Dtype out = opts.out_dtype.value_or(Dtype::kF16);
  MatmulOptions f32 = opts;
  f32.out_dtype = Dtype::kF32;
  return Matmul(a.To(Dtype::kF32), b.To(Dtype::kF32), f32).To(out);
}

// Tolerance for results that are sums of k products. Both sides accumulate
// in f32, in different orders: f32 results drift with k; 16-bit results are
// dominated by their one final rounding (at most an ulp apart), so they get
// only a mild factor.
Tolerance TolFor(Dtype out, int64_t k) {
  const double kd = static_cast<double>(k);
  return DefaultTolerance(
      out, out == Dtype::kF32 ? std::max(1.0, kd / 128.0) : std::max(1.0, std::sqrt(kd) / 32.0));
}

struct Case {
  Shape a;
  Shape b;
  bool trans_a;
  bool trans_b;
};

std::string Name(const Case& c, Dtype d) {
  return absl::StrCat(c.a.ToString(), " @ ", c.b.ToString(), c.trans_a ? " ta" : "",
                      c.trans_b ? " tb" : "", " ", DtypeName(d));
}

int64_t InnerK(const Case& c) { return c.a.dim(c.trans_a ? -2 : -1); }

const std::vector<Case>& Cases() {
  static const auto* cases = new std::vector<Case>{
      // 2-D, every trans combination, sizes not multiples of 8 / 16.
      {{37, 29}, {29, 53}, false, false},
      {{29, 37}, {29, 53}, true, false},
      {{37, 29}, {53, 29}, false, true},
      {{29, 37}, {53, 29}, true, true},
      {{1, 1}, {1, 1}, false, false},
      {{1, 17}, {17, 1}, false, false},
      {{3, 1}, {1, 5}, false, false},
      {{64, 128}, {128, 96}, false, false},
      {{130, 257}, {65, 257}, false, true},
      // Batched, equal batch dims.
      {{3, 7, 11}, {3, 11, 5}, false, false},
      {{2, 3, 11, 7}, {2, 3, 5, 11}, true, true},
      // b broadcast (folded into M): the Linear layer x @ W^T.
      {{4, 9, 33}, {17, 33}, false, true},
      {{2, 3, 9, 33}, {33, 17}, false, false},
      {{4, 33, 9}, {33, 17}, true, false},
      // a broadcast (batch stride 0).
      {{9, 33}, {4, 33, 17}, false, false},
      {{33, 9}, {2, 3, 17, 33}, true, true},
  };
  return *cases;
}

TEST(CudaMatmulTest, ForwardEveryCaseAndDtype) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Case& c : Cases()) {
    for (Dtype d : FloatDtypes()) {
      const Tensor a = RandomTensor(c.a, seed++, -1.0f, 1.0f, d);
      const Tensor b = RandomTensor(c.b, seed++, -1.0f, 1.0f, d);
      const MatmulOptions opts{c.trans_a, c.trans_b, std::nullopt};
      EXPECT_TRUE(
          MatchesCpu(Matmul(ToGpu(a), ToGpu(b), opts), CpuMatmul(a, b, opts), TolFor(d, InnerK(c))))
          << Name(c, d);
    }
  }
}

TEST(CudaMatmulTest, SixteenBitInputsWithF32Output) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : {Dtype::kBF16, Dtype::kF16}) {
    const Tensor a = RandomTensor({4, 19, 70}, 11, -1.0f, 1.0f, d);
    const Tensor b = RandomTensor({45, 70}, 12, -1.0f, 1.0f, d);
    const MatmulOptions opts{false, true, Dtype::kF32};
    const Tensor gpu = Matmul(ToGpu(a), ToGpu(b), opts);
    EXPECT_EQ(gpu.dtype(), Dtype::kF32);
    EXPECT_TRUE(MatchesCpu(gpu, CpuMatmul(a, b, opts), TolFor(Dtype::kF32, 70))) << DtypeName(d);
  }
}

TEST(CudaMatmulTest, LongInnerDimension) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor a = RandomTensor({33, 4099}, 21, -1.0f, 1.0f, d);
    const Tensor b = RandomTensor({4099, 47}, 22, -1.0f, 1.0f, d);
    EXPECT_TRUE(MatchesCpu(Matmul(ToGpu(a), ToGpu(b)), CpuMatmul(a, b, {}), TolFor(d, 4099)))
        << DtypeName(d);
  }
}

TEST(CudaMatmulTest, StridedViews) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor wide = RandomTensor({21, 40}, 31, -1.0f, 1.0f, d);
    const Tensor b = RandomTensor({13, 9}, 32, -1.0f, 1.0f, d);
    // A Narrow of columns (ld 40 > 13) and at an odd element offset.
    const Tensor a_cpu = wide.Narrow(1, 3, 13);
    const Tensor a_gpu = ToGpu(wide).Narrow(1, 3, 13);
    EXPECT_TRUE(MatchesCpu(Matmul(a_gpu, ToGpu(b)), CpuMatmul(a_cpu, b, {}), TolFor(d, 13)))
        << DtypeName(d);
    // No unit stride in the matrix dims: packed first.
    const Tensor t = RandomTensor({9, 5, 13}, 33, -1.0f, 1.0f, d);
    const Tensor x_cpu = t.Transpose(0, 1).Select(2, 3);  // (5, 9) strides (13, 65)
    const Tensor x_gpu = ToGpu(t).Transpose(0, 1).Select(2, 3);
    const Tensor y = RandomTensor({9, 6}, 34, -1.0f, 1.0f, d);
    EXPECT_TRUE(MatchesCpu(Matmul(x_gpu, ToGpu(y)), CpuMatmul(x_cpu, y, {}), TolFor(d, 9)));
    const Tensor t2 = RandomTensor({6, 4, 9}, 35, -1.0f, 1.0f, d);
    const Tensor z_cpu = t2.Transpose(0, 1).Select(0, 1).Transpose(0, 1);  // (9, 6) strides (1, 36)
    const Tensor z_gpu = ToGpu(t2).Transpose(0, 1).Select(0, 1).Transpose(0, 1);
    EXPECT_TRUE(MatchesCpu(Matmul(x_gpu, z_gpu), CpuMatmul(x_cpu, z_cpu, {}), TolFor(d, 9)));
    // Batch dims that cannot be merged (looped over on the host).
    const Tensor big = RandomTensor({3, 4, 7, 10}, 36, -1.0f, 1.0f, d);
    const Tensor p_cpu = big.Narrow(1, 1, 2);  // (3, 2, 7, 10): batch strides 280, 70
    const Tensor p_gpu = ToGpu(big).Narrow(1, 1, 2);
    const Tensor q = RandomTensor({3, 2, 10, 5}, 37, -1.0f, 1.0f, d);
    EXPECT_TRUE(MatchesCpu(Matmul(p_gpu, ToGpu(q)), CpuMatmul(p_cpu, q, {}), TolFor(d, 10)));
  }
}

TEST(CudaMatmulTest, MatmulIntoBeta) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    for (Dtype out_dtype : {d, Dtype::kF32}) {
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        const Tensor a = RandomTensor({2, 23, 31}, 41, -1.0f, 1.0f, d);
        const Tensor b = RandomTensor({2, 31, 19}, 42, -1.0f, 1.0f, d);
        const Tensor c0 = RandomTensor({2, 23, 19}, 43, -1.0f, 1.0f, out_dtype);
        Tensor cpu = c0.Clone();
        Tensor gpu = ToGpu(c0);
        const MatmulOptions opts{false, false, out_dtype};
        if (d == Dtype::kF16) {
          // The CPU has no f16 GEMM: the reference is f32 product + beta * c.
          const Tensor prod = CpuMatmul(a, b, {false, false, Dtype::kF32});
          std::vector<float> p = prod.ToVector<float>(), c = c0.ToVector<float>();
          for (size_t i = 0; i < p.size(); ++i) p[i] += beta * c[i];
          cpu = Tensor::FromVector(p, c0.shape(), out_dtype);
        } else {
          MatmulInto(a, b, cpu, opts, beta);
        }
        MatmulInto(ToGpu(a), ToGpu(b), gpu, opts, beta);
        EXPECT_TRUE(MatchesCpu(gpu, cpu, TolFor(out_dtype, 31)))
            << DtypeName(d) << " -> " << DtypeName(out_dtype) << " beta " << beta;
      }
    }
  }
}

// Attention's unfused path writes each head's rows where the projection
// reads them: out (B, nh, T, hs) is a view of a (B, T, nh * hs) buffer, its
// heads interleaved along the rows (cuBLASLt's strided batch over nh with a
// batch stride of hs, below the matrix's span; B looped). The padding around
// the written elements keeps its value.
TEST(CudaMatmulTest, IntoHeadsInterleavedInTheirRows) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t B = 2, nh = 3, T = 37, hs = 16;
  for (Dtype d : FloatDtypes()) {
    for (float beta : {0.0f, 1.0f}) {
      const Tensor p = RandomTensor({B, nh, T, T}, 44, -1.0f, 1.0f, d);
      const Tensor v =
          RandomTensor({B, T, 3, nh, hs}, 45, -1.0f, 1.0f, d).Select(2, 1).Transpose(1, 2);
      const Tensor c0 = RandomTensor({B, T, 3, nh * hs}, 46, -1.0f, 1.0f, d);  // q, k, v parts
      Tensor cpu = c0.Clone();
      const Tensor gpu = ToGpu(c0);
      auto heads = [&](const Tensor& buffer) {  // the middle part as (B, nh, T, hs)
        return buffer.Select(2, 1).View({B, T, nh, hs}).Transpose(1, 2);
      };
      if (d == Dtype::kF16) {
        const Tensor prod = CpuMatmul(p, v, {false, false, Dtype::kF32});  // (B, nh, T, hs)
        const Tensor old = heads(c0).To(Dtype::kF32);
        std::vector<float> r = prod.ToVector<float>(), o = old.ToVector<float>();
        for (size_t i = 0; i < r.size(); ++i) r[i] += beta * o[i];
        heads(cpu).CopyFrom(Tensor::FromVector(r, prod.shape()).To(d));
      } else {
        MatmulInto(p, v, heads(cpu), {}, beta);
      }
      MatmulInto(ToGpu(p), ToGpu(v), heads(gpu), {}, beta);
      EXPECT_TRUE(MatchesCpu(gpu, cpu, TolFor(d, T))) << DtypeName(d) << " beta " << beta;
    }
  }
}

TEST(CudaMatmulTest, BetaZeroIgnoresNaNAndAccumulationRepeats) {
  SKIP_WITHOUT_GPU();
  const Tensor a = RandomTensor({17, 24}, 51);
  const Tensor b = RandomTensor({24, 9}, 52);
  Tensor gpu =
      Tensor::Full({17, 9}, std::numeric_limits<double>::quiet_NaN(), Dtype::kF32, Device::Cuda(0));
  MatmulInto(ToGpu(a), ToGpu(b), gpu, {}, 0.0f);
  EXPECT_TRUE(MatchesCpu(gpu, Matmul(a, b), TolFor(Dtype::kF32, 24)));
  // Gradient accumulation: three products summed in place.
  for (int i = 0; i < 2; ++i) MatmulInto(ToGpu(a), ToGpu(b), gpu, {}, 1.0f);
  Tensor cpu = Matmul(a, b);
  for (int i = 0; i < 2; ++i) MatmulInto(a, b, cpu, {}, 1.0f);
  EXPECT_TRUE(MatchesCpu(gpu, cpu, TolFor(Dtype::kF32, 72)));
}

TEST(CudaMatmulTest, EmptyDims) {
  SKIP_WITHOUT_GPU();
  // K == 0: zeros, or beta * out.
  const Tensor a = Tensor::Empty({4, 0}, Dtype::kBF16, Device::Cuda(0));
  const Tensor b = Tensor::Empty({0, 3}, Dtype::kBF16, Device::Cuda(0));
  EXPECT_TRUE(MatchesCpu(Matmul(a, b), Tensor::Zeros({4, 3}, Dtype::kBF16)));
  Tensor out = Tensor::Full({4, 3}, 2.0, Dtype::kF32, Device::Cuda(0));
  MatmulInto(a, b, out, {}, 0.5f);
  EXPECT_TRUE(MatchesCpu(out, Tensor::Full({4, 3}, 1.0, Dtype::kF32)));
  // M == 0 or an empty batch: an empty result.
  const Tensor e = Matmul(Tensor::Empty({0, 5}, Dtype::kF32, Device::Cuda(0)),
                          Tensor::Empty({5, 3}, Dtype::kF32, Device::Cuda(0)));
  EXPECT_EQ(e.shape(), Shape({0, 3}));
  const Tensor f = Matmul(Tensor::Empty({0, 2, 5}, Dtype::kF32, Device::Cuda(0)),
                          Tensor::Empty({5, 3}, Dtype::kF32, Device::Cuda(0)));
  EXPECT_EQ(f.shape(), Shape({0, 2, 3}));
}

TEST(CudaMatmulTest, BackwardEveryCase) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const Case& c : Cases()) {
    for (Dtype d : FloatDtypes()) {
      if (d == Dtype::kF16) continue;  // the CPU backward has no f16 (see Backward16 below)
      const Tensor a = RandomTensor(c.a, seed++, -1.0f, 1.0f, d);
      const Tensor b = RandomTensor(c.b, seed++, -1.0f, 1.0f, d);
      const MatmulOptions opts{c.trans_a, c.trans_b, std::nullopt};
      const Tensor out = Matmul(a, b, opts);
      const Tensor g = RandomTensor(out.shape(), seed++, -1.0f, 1.0f, d);
      const MatmulGrads cpu = MatmulBackward(g, a, b, opts);
      const MatmulGrads gpu = MatmulBackward(ToGpu(g), ToGpu(a), ToGpu(b), opts);
      // grad_a sums N (times a broadcast batch) products, grad_b M (times
      // one): at most numel / min(M, N).
      const int64_t sum_len =
          out.numel() / std::max<int64_t>(1, std::min(out.dim(-2), out.dim(-1)));
      EXPECT_TRUE(MatchesCpu(gpu.grad_a, cpu.grad_a, TolFor(d, sum_len))) << Name(c, d);
      EXPECT_TRUE(MatchesCpu(gpu.grad_b, cpu.grad_b, TolFor(d, sum_len))) << Name(c, d);
    }
  }
}

TEST(CudaMatmulTest, BackwardMixedPrecisionAndStridedGrad) {
  SKIP_WITHOUT_GPU();
  // bf16 inputs, an f32 grad_out (converted on the GPU), f32 gradients.
  const Tensor a = RandomTensor({3, 10, 24}, 61, -1.0f, 1.0f, Dtype::kBF16);
  const Tensor w = RandomTensor({20, 24}, 62, -1.0f, 1.0f, Dtype::kBF16);
  const MatmulOptions opts{false, true, Dtype::kF32};
  const Tensor g = RandomTensor({3, 10, 20}, 63);
  const MatmulGrads cpu = MatmulBackward(g, a, w, opts);
  const MatmulGrads gpu = MatmulBackward(ToGpu(g), ToGpu(a), ToGpu(w), opts);
  EXPECT_TRUE(MatchesCpu(gpu.grad_a, cpu.grad_a, TolFor(Dtype::kF32, 20)));
  EXPECT_TRUE(MatchesCpu(gpu.grad_b, cpu.grad_b, TolFor(Dtype::kF32, 30)));
  // A non-contiguous grad_out (a transposed view) with a broadcast a.
  const Tensor x = RandomTensor({7, 5}, 64);
  const Tensor y = RandomTensor({4, 5, 6}, 65);
  const Tensor gt = RandomTensor({4, 6, 7}, 66);
  const MatmulGrads cpu2 = MatmulBackward(gt.Transpose(1, 2), x, y);
  const MatmulGrads gpu2 = MatmulBackward(ToGpu(gt).Transpose(1, 2), ToGpu(x), ToGpu(y));
  EXPECT_TRUE(MatchesCpu(gpu2.grad_a, cpu2.grad_a, TolFor(Dtype::kF32, 24)));
  EXPECT_TRUE(MatchesCpu(gpu2.grad_b, cpu2.grad_b, TolFor(Dtype::kF32, 7)));
}

TEST(CudaMatmulTest, Backward16) {
  SKIP_WITHOUT_GPU();
  // f16: against the f32 backward on the same values, rounded to f16.
  const Tensor a = RandomTensor({2, 9, 14}, 71, -1.0f, 1.0f, Dtype::kF16);
  const Tensor b = RandomTensor({11, 14}, 72, -1.0f, 1.0f, Dtype::kF16);
  const Tensor g = RandomTensor({2, 9, 11}, 73, -1.0f, 1.0f, Dtype::kF16);
  const MatmulOptions opts{false, true, std::nullopt};
  const MatmulGrads ref =
      MatmulBackward(g.To(Dtype::kF32), a.To(Dtype::kF32), b.To(Dtype::kF32), opts);
  const MatmulGrads gpu = MatmulBackward(ToGpu(g), ToGpu(a), ToGpu(b), opts);
  EXPECT_TRUE(MatchesCpu(gpu.grad_a, ref.grad_a.To(Dtype::kF16), TolFor(Dtype::kF16, 11)));
  EXPECT_TRUE(MatchesCpu(gpu.grad_b, ref.grad_b.To(Dtype::kF16), TolFor(Dtype::kF16, 18)));
}

TEST(CudaMatmulTest, Tf32OnlyWhenAllowed) {
  SKIP_WITHOUT_GPU();
  ASSERT_FALSE(cuda::MatmulAllowTf32()) << "FSDP_CUDA_TF32 set in the test environment?";
  const Tensor a = RandomTensor({64, 512}, 81);
  const Tensor b = RandomTensor({512, 48}, 82);
  const Tensor cpu = Matmul(a, b);
  EXPECT_TRUE(MatchesCpu(Matmul(ToGpu(a), ToGpu(b)), cpu, TolFor(Dtype::kF32, 512)));
  cuda::SetMatmulAllowTf32(true);
  const Tensor tf32 = Matmul(ToGpu(a), ToGpu(b));
  cuda::SetMatmulAllowTf32(false);
  // 10-bit mantissa products: roughly bf16-like error, not f32's.
  EXPECT_TRUE(MatchesCpu(tf32, cpu, {2e-2, 2e-2}));
}

TEST(CudaMatmulTest, DescriptorsAreCached) {
  SKIP_WITHOUT_GPU();
  const Tensor a = ToGpu(RandomTensor({19, 23}, 91, -1.0f, 1.0f, Dtype::kBF16));
  const Tensor b = ToGpu(RandomTensor({23, 29}, 92, -1.0f, 1.0f, Dtype::kBF16));
  Matmul(a, b);
  const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
  for (int i = 0; i < 5; ++i) Matmul(a, b);
  const cuda::MatmulCacheStats after = cuda::GetMatmulCacheStats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.hits, before.hits + 5);
  EXPECT_LE(after.entries, cuda::kMatmulCacheCapacity);
}

// Tuning (SetMatmulTuning): the first call of a new GEMM times the
// heuristic's candidates on a scratch output; the accumulation into C
// (beta 1) and the result are those of the untuned GEMM; later calls reuse
// the choice. (The emulation offers 3 candidates, all computing the same.)
TEST(CudaMatmulTest, TuningTimesCandidatesAndLeavesTheAccumulatorAlone) {
  SKIP_WITHOUT_GPU();
  ASSERT_FALSE(cuda::MatmulTuning()) << "FSDP_CUDA_GEMM_TUNE set in the test environment?";
  const Tensor a = RandomTensor({96, 136}, 97, -1.0f, 1.0f, Dtype::kBF16);   // shapes no other
  const Tensor b = RandomTensor({136, 200}, 98, -1.0f, 1.0f, Dtype::kBF16);  // test uses
  const Tensor c0 = RandomTensor({96, 200}, 99);
  const MatmulOptions opts{false, false, Dtype::kF32};
  Tensor cpu = c0.Clone();
  MatmulInto(a, b, cpu, opts, 1.0f);

  cuda::SetMatmulTuning(true);
  const cuda::MatmulCacheStats before = cuda::GetMatmulCacheStats();
  Tensor gpu = ToGpu(c0);
  const Tensor a_gpu = ToGpu(a), b_gpu = ToGpu(b);
  const int64_t temporaries_before =
      MemoryLedger::Current().Stats(Device::Cuda(0), MemoryCategory::kTemporaries).current;
  MatmulInto(a_gpu, b_gpu, gpu, opts, 1.0f);  // tunes, then accumulates once
  const cuda::MatmulCacheStats tuned = cuda::GetMatmulCacheStats();
  MatmulInto(a_gpu, b_gpu, gpu, opts, 1.0f);  // the cached choice
  const cuda::MatmulCacheStats again = cuda::GetMatmulCacheStats();
  cuda::SetMatmulTuning(false);

  EXPECT_EQ(tuned.tuned, before.tuned + 1);
  EXPECT_LE(tuned.tuned_other_than_first - before.tuned_other_than_first, 1);
  EXPECT_EQ(again.tuned, tuned.tuned) << "a cached GEMM was tuned again";
  EXPECT_EQ(again.hits, tuned.hits + 1);
  EXPECT_EQ(MemoryLedger::Current().Stats(Device::Cuda(0), MemoryCategory::kTemporaries).current,
            temporaries_before)
      << "the scratch output was not freed";
  MatmulInto(a, b, cpu, opts, 1.0f);  // two accumulations, as on the GPU
  EXPECT_TRUE(MatchesCpu(gpu, cpu, TolFor(Dtype::kF32, 2 * 136)));
}

TEST(CudaMatmulTest, ThreadsEachWithTheirOwnHandle) {
  SKIP_WITHOUT_GPU();
  const Tensor a = RandomTensor({4, 65, 70}, 95, -1.0f, 1.0f, Dtype::kBF16);
  const Tensor b = RandomTensor({70, 33}, 96, -1.0f, 1.0f, Dtype::kBF16);
  const Tensor cpu = Matmul(a, b);
  std::vector<Tensor> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Tensor r;
      for (int i = 0; i < 20; ++i) r = Matmul(ToGpu(a), ToGpu(b));
      results[t] = ToCpu(r);  // synchronizes this thread's work
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Tensor& r : results) EXPECT_TRUE(MatchesCpu(ToGpu(r), cpu, TolFor(Dtype::kBF16, 70)));
}

TEST(CudaMatmulTest, Errors) {
  SKIP_WITHOUT_GPU();
  const Tensor a = RandomTensor({3, 4}, 1);
  const Tensor b = RandomTensor({4, 5}, 2);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const OpError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { Matmul(ToGpu(a), b); }).find("move both to one device"),
            std::string::npos);
  EXPECT_NE(
      message([&] { Matmul(ToGpu(a), ToGpu(b.To(Dtype::kBF16))); }).find("dtypes f32 and bf16"),
      std::string::npos);
  const Tensor i = ToGpu(Tensor::Zeros({3, 4}, Dtype::kI32));
  EXPECT_NE(message([&] { Matmul(i, i.Transpose(0, 1)); }).find("expected f32, bf16 or f16"),
            std::string::npos);
  Tensor cpu_out = Tensor::Empty({3, 5});
  EXPECT_NE(message([&] { MatmulInto(ToGpu(a), ToGpu(b), cpu_out); }).find("is on cpu"),
            std::string::npos);
  EXPECT_NE(message([&] { Matmul(ToGpu(a), ToGpu(a)); }).find("inner dimensions 4 and 3"),
            std::string::npos);
  // The CPU still refuses f16 (no CPU kernel).
  EXPECT_NE(
      message([&] { Matmul(a.To(Dtype::kF16), b.To(Dtype::kF16)); }).find("expected f32 or bf16"),
      std::string::npos);
}

}  // namespace
}  // namespace tensor
