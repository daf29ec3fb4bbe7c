// Reductions on the GPU against the CPU: sums and means over every dim (rows
// long enough to be chunked, columns split over row chunks), over all
// elements, maxima with first-index ties and NaN, the backward passes,
// ReduceToShape(Into), SumSquares, run-to-run determinism, errors.
#include "tensor/ops/reduce.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
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

constexpr Tolerance kExact{0.0, 0.0};

// Shapes whose (outer, reduce, inner) blocks take every GPU path: short and
// chunked rows, few and many columns, split and unsplit column chunks.
std::vector<Shape> Shapes() {
  return {{7},       {3, 5, 4},    {2, 10000},   {10000, 3},  {64, 96},
          {5, 1, 9}, {2, 3000, 7}, {700, 40},    {3, 130, 264}};
}

TEST(CudaReduceTest, SumAndMeanOverEveryDim) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    uint64_t seed = 1;
    for (const Shape& shape : Shapes()) {
      const Tensor x = RandomTensor(shape, seed++, -1.0f, 1.0f, d);
      for (int dim = 0; dim < shape.rank(); ++dim) {
        for (bool keepdim : {false, true}) {
          const std::string what = absl::StrCat(DtypeName(d), " ", shape.ToString(), " dim ", dim);
          // Both sum in double: they agree to the output's rounding.
          EXPECT_TRUE(
              MatchesCpu(Sum(ToGpu(x), dim, keepdim), Sum(x, dim, keepdim), DefaultTolerance(d)))
              << what;
          EXPECT_TRUE(
              MatchesCpu(Mean(ToGpu(x), dim, keepdim), Mean(x, dim, keepdim), DefaultTolerance(d)))
              << what;
        }
      }
    }
  }
}

TEST(CudaReduceTest, AllElementsAndSumSquares) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    for (const Shape& shape : {Shape{}, Shape{1}, Shape{3, 33}, Shape{1000, 1001}}) {
      const Tensor x = RandomTensor(shape, 7, -1.0f, 1.0f, d);
      EXPECT_TRUE(MatchesCpu(SumAll(ToGpu(x)), SumAll(x), DefaultTolerance(d, 2.0)))
          << shape.ToString();
      EXPECT_TRUE(MatchesCpu(MeanAll(ToGpu(x)), MeanAll(x), DefaultTolerance(d, 2.0)))
          << shape.ToString();
      const double gpu = SumSquares(ToGpu(x)), cpu = SumSquares(x);
      EXPECT_NEAR(gpu, cpu, 1e-12 * std::max(1.0, cpu)) << shape.ToString();
    }
  }
  // A strided view is summed as its elements.
  const Tensor x = RandomTensor({300, 200}, 8);
  EXPECT_TRUE(MatchesCpu(Sum(ToGpu(x).Transpose(0, 1), 1), Sum(x.Transpose(0, 1), 1)));
  EXPECT_NEAR(SumSquares(ToGpu(x).Transpose(0, 1)), SumSquares(x), 1e-9);
  EXPECT_NEAR(L2Norm({ToGpu(x), ToGpu(x)}), L2Norm({x, x}), 1e-9);
  EXPECT_EQ(SumSquares(ToGpu(Tensor::Empty({0, 3}))), 0.0);
}

TEST(CudaReduceTest, EmptyDimensions) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Tensor::Empty({3, 0, 4});
  EXPECT_TRUE(MatchesCpu(Sum(ToGpu(x), 1), Sum(x, 1), kExact));    // zeros
  EXPECT_TRUE(MatchesCpu(Mean(ToGpu(x), 1), Mean(x, 1), kExact));  // NaN
  EXPECT_EQ(Sum(ToGpu(x), 0).shape(), Shape({0, 4}));
}

TEST(CudaReduceTest, IsDeterministicRunToRun) {
  SKIP_WITHOUT_GPU();
  const Tensor x = ToGpu(RandomTensor({3000, 4097}, 9, -1.0f, 1.0f));
  const std::vector<float> a = ToCpu(Sum(x, 0)).ToVector<float>();
  const std::vector<float> b = ToCpu(Sum(x, 0)).ToVector<float>();
  EXPECT_EQ(a, b);
  EXPECT_EQ(ToCpu(SumAll(x)).Item(), ToCpu(SumAll(x)).Item());
  EXPECT_EQ(SumSquares(x), SumSquares(x));
}

// Column sums of rows at least 32 wide (bias gradients) read 16 bytes at a
// time when the rows allow; the one-column kernel (an odd offset) adds in the
// same order: the same bits.
TEST(CudaReduceTest, PackedColumnSumsMatchUnpackedBitForBit) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    SCOPED_TRACE(DtypeName(d));
    const Tensor host = RandomTensor({1 + 600 * 264}, 12, -1.0f, 1.0f, d);
    const Tensor flat = ToGpu(host);
    const Tensor aligned = flat.Narrow(0, 0, 600 * 264).Reshape({600, 264});
    const Tensor odd = flat.Narrow(0, 1, 600 * 264).Reshape({600, 264});
    const Tensor odd_copy = ToGpu(ToCpu(odd));  // its own, aligned allocation
    EXPECT_EQ(ToCpu(Sum(odd, 0)).To(Dtype::kF32).ToVector<float>(),
              ToCpu(Sum(odd_copy, 0)).To(Dtype::kF32).ToVector<float>());
    EXPECT_TRUE(MatchesCpu(Sum(aligned, 0), Sum(host.Narrow(0, 0, 600 * 264).Reshape({600, 264}), 0),
                           DefaultTolerance(d, 2.0)));
  }
}

TEST(CudaReduceTest, MaxWithFirstIndexTiesAndNaN) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    uint64_t seed = 20;
    for (const Shape& shape : Shapes()) {
      // Values on a coarse grid: many ties.
      const Tensor x = RandomTensor(shape, seed++, -4.0f, 4.0f, Dtype::kF32);
      std::vector<float> v = x.ToVector<float>();
      for (float& e : v) e = std::floor(e);
      const Tensor t = Tensor::FromVector(v, shape, d);
      for (int dim = 0; dim < shape.rank(); ++dim) {
        const MaxResult gpu = MaxWithIndices(ToGpu(t), dim);
        const MaxResult cpu = MaxWithIndices(t, dim);
        EXPECT_TRUE(MatchesCpu(gpu.values, cpu.values, kExact)) << shape.ToString() << " " << dim;
        EXPECT_TRUE(MatchesCpu(gpu.indices, cpu.indices, kExact)) << shape.ToString() << " " << dim;
      }
      const MaxResult gpu = MaxAllWithIndex(ToGpu(t));
      const MaxResult cpu = MaxAllWithIndex(t);
      EXPECT_TRUE(MatchesCpu(gpu.values, cpu.values, kExact)) << shape.ToString();
      EXPECT_TRUE(MatchesCpu(gpu.indices, cpu.indices, kExact)) << shape.ToString();
    }
  }
  // NaN is the largest, first NaN wins; in a chunked row too.
  std::vector<float> v(20000, 1.0f);
  v[17] = 5.0f;
  v[9017] = 5.0f;
  v[15000] = std::numeric_limits<float>::quiet_NaN();
  v[17000] = std::numeric_limits<float>::quiet_NaN();
  const Tensor t = Tensor::FromVector(v, {2, 10000});
  const MaxResult gpu = MaxWithIndices(ToGpu(t), 1);
  EXPECT_EQ(ToCpu(gpu.indices).ToVector<int64_t>(), (std::vector<int64_t>{17, 5000}));
  EXPECT_EQ(ToCpu(MaxAllWithIndex(ToGpu(t)).indices).Item(), 15000);
  EXPECT_TRUE(std::isnan(ToCpu(MaxAll(ToGpu(t))).Item()));
}

TEST(CudaReduceTest, BackwardPasses) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Shape in{4, 6, 5};
    for (int dim = 0; dim < 3; ++dim) {
      for (bool keepdim : {false, true}) {
        const Tensor x = RandomTensor(in, 30 + dim, -1.0f, 1.0f, d);
        const Tensor g = Sum(x, dim, keepdim);  // the output's shape
        EXPECT_TRUE(MatchesCpu(SumBackward(ToGpu(g), in, dim, keepdim),
                               SumBackward(g, in, dim, keepdim), kExact));
        EXPECT_TRUE(MatchesCpu(MeanBackward(ToGpu(g), in, dim, keepdim),
                               MeanBackward(g, in, dim, keepdim), kExact));
        const MaxResult m = MaxWithIndices(x, dim, keepdim);
        EXPECT_TRUE(MatchesCpu(MaxBackward(ToGpu(g), ToGpu(m.indices), in, dim, keepdim),
                               MaxBackward(g, m.indices, in, dim, keepdim), kExact));
      }
    }
    const Tensor x = RandomTensor(in, 40, -1.0f, 1.0f, d);
    const Tensor g = SumAll(x);
    EXPECT_TRUE(MatchesCpu(SumAllBackward(ToGpu(g), in), SumAllBackward(g, in), kExact));
    EXPECT_TRUE(MatchesCpu(MeanAllBackward(ToGpu(g), in), MeanAllBackward(g, in), kExact));
    const MaxResult m = MaxAllWithIndex(x);
    EXPECT_TRUE(MatchesCpu(MaxAllBackward(ToGpu(g), ToGpu(m.indices), in),
                           MaxAllBackward(g, m.indices, in), kExact));
  }
}

TEST(CudaReduceTest, ReduceToShapeAndInto) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({4, 7, 3, 9}, 50, -1.0f, 1.0f, d);
    for (const Shape& to : {Shape{9}, Shape{3, 1}, Shape{1, 7, 1, 9}, Shape{4, 1, 3, 1}, Shape{},
                            Shape{4, 7, 3, 9}}) {
      EXPECT_TRUE(
          MatchesCpu(ReduceToShape(ToGpu(x), to), ReduceToShape(x, to), DefaultTolerance(d, 2.0)))
          << to.ToString();
    }
    // Accumulated into f32 (the bias gradient of bf16 activations).
    const Tensor out0 = RandomTensor({3, 9}, 51);
    Tensor out_cpu = out0.Clone();
    Tensor out_gpu = ToGpu(out0);
    ReduceToShapeInto(x, out_cpu, /*accumulate=*/true);
    ReduceToShapeInto(ToGpu(x), out_gpu, /*accumulate=*/true);
    EXPECT_TRUE(MatchesCpu(out_gpu, out_cpu, DefaultTolerance(Dtype::kF32, 2.0)));
  }
}

TEST(CudaReduceTest, Errors) {
  SKIP_WITHOUT_GPU();
  const Tensor g = ToGpu(Tensor::Full({2}, 1.0));
  const Tensor bad = ToGpu(Tensor::FromData<int64_t>(std::vector<int64_t>{1, 7}, {2}));
  try {
    MaxBackward(g, bad, {2, 3}, 1);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[max_backward] index 7 out of range for a dimension of size 3"),
              std::string::npos)
        << msg;
  }
  EXPECT_THROW(ReduceToShapeInto(ToGpu(RandomTensor({2, 3}, 1)), Tensor::Zeros({3}), false),
               OpError);  // devices differ
  EXPECT_THROW(Sum(ToGpu(RandomTensor({2, 3}, 1)), 2), OpError);
}

}  // namespace
}  // namespace tensor
