// Elementwise ops on the GPU against the CPU: broadcasting arithmetic (bit
// for bit: both round each float operation once), backward reductions,
// in-place accumulation, bias and activations, strided views, errors.
#include "tensor/ops/elementwise.h"

#include <string>

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

struct ShapePair {
  Shape a, b;
};

// Same shapes, the models' broadcasts (bias (C) and (1, C), a scalar-like (1)),
// and general numpy broadcasts on either side.
std::vector<ShapePair> BroadcastCases() {
  return {{{33, 70}, {33, 70}},  {{4, 9, 70}, {70}},
          {{4, 9, 70}, {1, 70}}, {{4, 9, 70}, {1}},
          {{1}, {5, 3}},         {{4, 1, 5}, {3, 5}},
          {{6, 1}, {1, 7}},      {{2, 3, 4, 5}, {3, 1, 5}},
          {{5000}, {5000}},      {{3, 1, 4099}, {2, 4099}},
          {{}, {3, 2}}};
}

TEST(CudaElementwiseTest, AddSubMulEveryBroadcastBitForBit) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    uint64_t seed = 1;
    for (const ShapePair& c : BroadcastCases()) {
      const Tensor a = RandomTensor(c.a, seed++, -2.0f, 2.0f, d);
      const Tensor b = RandomTensor(c.b, seed++, -2.0f, 2.0f, d);
      const std::string what = absl::StrCat(DtypeName(d), " ", c.a.ToString(), " ", c.b.ToString());
      EXPECT_TRUE(MatchesCpu(Add(ToGpu(a), ToGpu(b)), Add(a, b), kExact)) << what;
      EXPECT_TRUE(MatchesCpu(Sub(ToGpu(a), ToGpu(b)), Sub(a, b), kExact)) << what;
      EXPECT_TRUE(MatchesCpu(Mul(ToGpu(a), ToGpu(b)), Mul(a, b), kExact)) << what;
    }
  }
}

// SumAs of 2, 3 and 4 operands of mixed dtypes, contiguous and strided (a
// transposed view; the strided kernel), into each dtype: the CPU's bits.
TEST(CudaElementwiseTest, SumAsMixedDtypesBitForBit) {
  SKIP_WITHOUT_GPU();
  const Tensor a = RandomTensor({40, 33}, 1, -1.0f, 1.0f, Dtype::kBF16);
  const Tensor b = RandomTensor({40, 33}, 2, -1.0f, 1.0f, Dtype::kF16);
  const Tensor c = RandomTensor({40, 33}, 3, -1.0f, 1.0f, Dtype::kF32);
  const Tensor d = RandomTensor({33, 40}, 4, -1.0f, 1.0f, Dtype::kBF16).Transpose(0, 1);
  const Tensor ga = ToGpu(a), gb = ToGpu(b), gc = ToGpu(c);
  const Tensor gd = ToGpu(d.Transpose(0, 1)).Transpose(0, 1);  // the same strided view
  for (Dtype out : FloatDtypes()) {
    SCOPED_TRACE(DtypeName(out));
    EXPECT_TRUE(MatchesCpu(SumAs({ga, gb}, out), SumAs({a, b}, out), kExact));
    EXPECT_TRUE(MatchesCpu(SumAs({ga, gb, gc}, out), SumAs({a, b, c}, out), kExact));
    EXPECT_TRUE(MatchesCpu(SumAs({gd, ga, gb, gc}, out), SumAs({d, a, b, c}, out), kExact));
    EXPECT_EQ(SumAs({ga, gb}, out).dtype(), out);
  }
  EXPECT_THROW(SumAs({ga, b}, Dtype::kF32), OpError);  // two devices
}

TEST(CudaElementwiseTest, StridedOperands) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor a = RandomTensor({40, 33}, 1, -1.0f, 1.0f, d);
    const Tensor b = RandomTensor({33, 40}, 2, -1.0f, 1.0f, d);
    // a + b^T: the transposed view is read through its strides.
    EXPECT_TRUE(
        MatchesCpu(Add(ToGpu(a), ToGpu(b).Transpose(0, 1)), Add(a, b.Transpose(0, 1)), kExact));
    // A narrowed (non-contiguous) view times a column.
    const Tensor col = RandomTensor({40, 1}, 3, -1.0f, 1.0f, d);
    EXPECT_TRUE(MatchesCpu(Mul(ToGpu(a).Narrow(1, 3, 20), ToGpu(col)), Mul(a.Narrow(1, 3, 20), col),
                           kExact));
  }
}

TEST(CudaElementwiseTest, BackwardReducesToOperandShapes) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    uint64_t seed = 10;
    for (const ShapePair& c : BroadcastCases()) {
      const Tensor a = RandomTensor(c.a, seed++, -2.0f, 2.0f, d);
      const Tensor b = RandomTensor(c.b, seed++, -2.0f, 2.0f, d);
      const Shape out = BroadcastShapes("test", c.a, c.b);
      const Tensor g = RandomTensor(out, seed++, -1.0f, 1.0f, d);
      const Tolerance tol = DefaultTolerance(d, 2.0);
      const std::string what = absl::StrCat(DtypeName(d), " ", c.a.ToString(), " ", c.b.ToString());
      const BinaryGrads add_gpu = AddBackward(ToGpu(g), c.a, c.b);
      const BinaryGrads add_cpu = AddBackward(g, c.a, c.b);
      EXPECT_TRUE(MatchesCpu(add_gpu.grad_a, add_cpu.grad_a, tol)) << what;
      EXPECT_TRUE(MatchesCpu(add_gpu.grad_b, add_cpu.grad_b, tol)) << what;
      const BinaryGrads sub_gpu = SubBackward(ToGpu(g), c.a, c.b);
      const BinaryGrads sub_cpu = SubBackward(g, c.a, c.b);
      EXPECT_TRUE(MatchesCpu(sub_gpu.grad_a, sub_cpu.grad_a, tol)) << what;
      EXPECT_TRUE(MatchesCpu(sub_gpu.grad_b, sub_cpu.grad_b, tol)) << what;
      const BinaryGrads mul_gpu = MulBackward(ToGpu(g), ToGpu(a), ToGpu(b));
      const BinaryGrads mul_cpu = MulBackward(g, a, b);
      EXPECT_TRUE(MatchesCpu(mul_gpu.grad_a, mul_cpu.grad_a, tol)) << what;
      EXPECT_TRUE(MatchesCpu(mul_gpu.grad_b, mul_cpu.grad_b, tol)) << what;
    }
  }
}

TEST(CudaElementwiseTest, ScaleAndInPlaceAccumulation) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({17, 301}, 4, -3.0f, 3.0f, d);
    EXPECT_TRUE(MatchesCpu(Scale(ToGpu(x), 0.37), Scale(x, 0.37), kExact));
    EXPECT_TRUE(MatchesCpu(ScaleBackward(ToGpu(x), -1.5), ScaleBackward(x, -1.5), kExact));

    // In place, through a strided view: only the viewed elements change.
    Tensor cpu = x.Clone();
    Tensor gpu = ToGpu(x);
    ScaleInPlace(cpu.Transpose(0, 1).Narrow(0, 5, 100), 2.5);
    ScaleInPlace(gpu.Transpose(0, 1).Narrow(0, 5, 100), 2.5);
    EXPECT_TRUE(MatchesCpu(gpu, cpu, kExact));

    const Tensor y0 = RandomTensor({17, 301}, 5, -1.0f, 1.0f, d);
    Tensor y_cpu = y0.Clone();
    Tensor y_gpu = ToGpu(y0);
    // y + alpha x: one FMA on the GPU, whatever the compiler made of it on the CPU.
    Axpy(-0.25, x, y_cpu);
    Axpy(-0.25, ToGpu(x), y_gpu);
    EXPECT_TRUE(MatchesCpu(y_gpu, y_cpu)) << DtypeName(d);
    AddInPlace(y_cpu, x);
    AddInPlace(y_gpu, ToGpu(x));
    EXPECT_TRUE(MatchesCpu(y_gpu, y_cpu)) << DtypeName(d);

    // f32 += bf16 / f16 (mixed precision gradient accumulation).
    const Tensor acc0 = RandomTensor({17, 301}, 6, -1.0f, 1.0f, Dtype::kF32);
    Tensor acc_cpu = acc0.Clone();
    Tensor acc_gpu = ToGpu(acc0);
    AddInPlace(acc_cpu, x);
    AddInPlace(acc_gpu, ToGpu(x));  // alpha 1: exact either way
    EXPECT_TRUE(MatchesCpu(acc_gpu, acc_cpu, kExact)) << DtypeName(d);
  }
}

TEST(CudaElementwiseTest, BiasAndItsBackward) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({4, 33, 96}, 7, -2.0f, 2.0f, d);
    const Tensor bias = RandomTensor({96}, 8, -1.0f, 1.0f, d);
    EXPECT_TRUE(MatchesCpu(AddBias(ToGpu(x), ToGpu(bias)), AddBias(x, bias), kExact));

    const Tolerance tol = DefaultTolerance(d, 4.0);
    EXPECT_TRUE(MatchesCpu(AddBiasBackward(ToGpu(x)), AddBiasBackward(x), tol));
    // Column sums of many rows (chunked on the GPU).
    const Tensor g = RandomTensor({9000, 40}, 9, -1.0f, 1.0f, d);
    EXPECT_TRUE(MatchesCpu(AddBiasBackward(ToGpu(g)), AddBiasBackward(g), tol));

    // Accumulated into an f32 gradient, twice.
    const Tensor gb0 = RandomTensor({40}, 10, -1.0f, 1.0f, Dtype::kF32);
    Tensor gb_cpu = gb0.Clone();
    Tensor gb_gpu = ToGpu(gb0);
    for (int i = 0; i < 2; ++i) {
      AddBiasBackwardInto(g, gb_cpu);
      AddBiasBackwardInto(ToGpu(g), gb_gpu);
    }
    EXPECT_TRUE(MatchesCpu(gb_gpu, gb_cpu, DefaultTolerance(Dtype::kF32, 4.0))) << DtypeName(d);
  }
}

TEST(CudaElementwiseTest, Activations) {
  SKIP_WITHOUT_GPU();
  for (Dtype d : FloatDtypes()) {
    const Tensor x = RandomTensor({8, 257}, 11, -6.0f, 6.0f, d);
    const Tensor g = RandomTensor({8, 257}, 12, -1.0f, 1.0f, d);
    const Tensor bias = RandomTensor({257}, 13, -1.0f, 1.0f, d);
    // GELU: expf on the GPU, a vector exp on the CPU: a few ulps apart.
    const Tolerance tol = DefaultTolerance(d, 2.0);
    EXPECT_TRUE(MatchesCpu(Gelu(ToGpu(x)), Gelu(x), tol)) << DtypeName(d);
    EXPECT_TRUE(MatchesCpu(GeluBackward(ToGpu(g), ToGpu(x)), GeluBackward(g, x), tol));
    EXPECT_TRUE(MatchesCpu(BiasGelu(ToGpu(x), ToGpu(bias)), BiasGelu(x, bias), tol));
    const BiasGeluGrads gpu = BiasGeluBackward(ToGpu(g), ToGpu(x), ToGpu(bias));
    const BiasGeluGrads cpu = BiasGeluBackward(g, x, bias);
    EXPECT_TRUE(MatchesCpu(gpu.grad_x, cpu.grad_x, tol));
    EXPECT_TRUE(MatchesCpu(gpu.grad_bias, cpu.grad_bias, DefaultTolerance(d, 8.0)));

    EXPECT_TRUE(MatchesCpu(Relu(ToGpu(x)), Relu(x), kExact));
    EXPECT_TRUE(MatchesCpu(ReluBackward(ToGpu(g), ToGpu(x)), ReluBackward(g, x), kExact));
  }
  // Fused bias + GELU equals GELU of the sum (f32).
  const Tensor x = RandomTensor({3, 64}, 14, -3.0f, 3.0f);
  const Tensor bias = RandomTensor({64}, 15, -1.0f, 1.0f);
  EXPECT_TRUE(MatchesCpu(BiasGelu(ToGpu(x), ToGpu(bias)), Gelu(AddBias(x, bias))));
}

TEST(CudaElementwiseTest, EmptyTensors) {
  SKIP_WITHOUT_GPU();
  const Tensor a = Tensor::Empty({0, 5}, Dtype::kF32);
  EXPECT_EQ(Add(ToGpu(a), ToGpu(Tensor::Zeros({5}))).shape(), Shape({0, 5}));
  EXPECT_EQ(Gelu(ToGpu(a)).shape(), Shape({0, 5}));
}

TEST(CudaElementwiseTest, ErrorsNameTheOpAndDevices) {
  SKIP_WITHOUT_GPU();
  const Tensor a = RandomTensor({2, 3}, 16);
  try {
    Add(ToGpu(a), a);
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[add]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  }
  EXPECT_THROW(AddInPlace(ToGpu(a), a), OpError);
  EXPECT_THROW(AddInPlace(ToGpu(a.To(Dtype::kBF16)), ToGpu(a)), OpError);  // bf16 += f32
  EXPECT_THROW(Add(ToGpu(a), ToGpu(RandomTensor({4, 3}, 17))), OpError);   // not broadcastable
}

}  // namespace
}  // namespace tensor
