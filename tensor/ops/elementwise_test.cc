// Tests of the elementwise ops: forward results against naive double-precision
// loops, backward passes against finite differences, broadcasting, strided
// views, bf16/f16 storage against f32, mixed-precision accumulation and the
// error messages.
#include "tensor/ops/elementwise.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/random.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using ::tensor::testing::AllClose;
using ::tensor::testing::Dot;
using ::tensor::testing::NumericalGradient;
using ::tensor::testing::RandomTensor;

// The numpy broadcast of two shapes, written independently of the library.
Shape RefBroadcastShape(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  Shape out;
  for (int d = 0; d < rank; ++d) {
    const int da = d - (rank - a.rank()), db = d - (rank - b.rank());
    const int64_t sa = da >= 0 ? a[da] : 1, sb = db >= 0 ? b[db] : 1;
    out.push_back(sa == 1 ? sb : sa);
  }
  return out;
}

// Flat row-major index into `shape` of the element that out index `i` (of
// out_shape) reads when shape is broadcast to out_shape.
int64_t SourceIndex(int64_t i, const Shape& out_shape, const Shape& shape) {
  int64_t src = 0, stride = 1;
  for (int d = out_shape.rank() - 1; d >= 0; --d) {
    const int64_t idx = i % out_shape[d];
    i /= out_shape[d];
    const int sd = d - (out_shape.rank() - shape.rank());
    if (sd < 0) continue;
    if (shape[sd] != 1) src += idx * stride;
    stride *= shape[sd];
  }
  return src;
}

// fn(a, b) over the broadcast shape, computed in double; returned as f32.
Tensor RefBinary(const Tensor& a, const Tensor& b,
                 const std::function<double(double, double)>& fn) {
  const Shape out = RefBroadcastShape(a.shape(), b.shape());
  const std::vector<float> va = a.ToVector<float>(), vb = b.ToVector<float>();
  std::vector<float> r(out.numel());
  for (int64_t i = 0; i < out.numel(); ++i) {
    r[i] = static_cast<float>(
        fn(va[SourceIndex(i, out, a.shape())], vb[SourceIndex(i, out, b.shape())]));
  }
  return Tensor::FromVector(r, out);
}

Tensor RefUnary(const Tensor& x, const std::function<double(double)>& fn) {
  std::vector<float> v = x.ToVector<float>();
  for (float& e : v) e = static_cast<float>(fn(e));
  return Tensor::FromVector(v, x.shape());
}

double RefGelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

double RefGeluGrad(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// Expects `fn` to throw an OpError whose message starts with `prefix`.
void ExpectOpError(const std::function<void()>& fn, const std::string& prefix) {
  try {
    fn();
    ADD_FAILURE() << "expected an OpError starting with: " << prefix;
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, prefix.size()), prefix) << e.what();
  }
}

struct BroadcastCase {
  Shape a, b;
};

const std::vector<BroadcastCase>& BroadcastCases() {
  static const auto* cases = new std::vector<BroadcastCase>{
      {{2, 3, 4}, {2, 3, 4}},  // same shape
      {{2, 3, 4}, {4}},        // suffix (bias-like)
      {{2, 3, 4}, {3, 4}},     // suffix
      {{2, 3, 4}, {3, 1}},     // size-1 inner dim
      {{2, 1, 4}, {3, 4}},     // both operands broadcast
      {{4}, {2, 3, 4}},        // a is the smaller one
      {{2, 3, 4}, {}},         // scalar
      {{5, 1}, {1, 6}},        // outer product
      {{1}, {7}},
      {{0, 3}, {3}},         // empty
      {{37, 1000}, {1000}},  // several chunks of the thread pool
      {{70001}, {70001}},    // one long coalesced row, split across chunks
  };
  return *cases;
}

TEST(ElementwiseTest, AddSubMulMatchReferenceWithBroadcasting) {
  uint64_t seed = 1;
  for (const BroadcastCase& c : BroadcastCases()) {
    SCOPED_TRACE(c.a.ToString() + " and " + c.b.ToString());
    const Tensor a = RandomTensor(c.a, seed++);
    const Tensor b = RandomTensor(c.b, seed++);
    EXPECT_TRUE(AllClose(Add(a, b), RefBinary(a, b, std::plus<double>()), 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(Sub(a, b), RefBinary(a, b, std::minus<double>()), 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(Mul(a, b), RefBinary(a, b, std::multiplies<double>()), 1e-6, 1e-6));
  }
}

TEST(ElementwiseTest, BroadcastShapes) {
  EXPECT_EQ(BroadcastShapes("t", {2, 1, 4}, {3, 1}), Shape({2, 3, 4}));
  EXPECT_EQ(BroadcastShapes("t", {}, {5}), Shape({5}));
  EXPECT_EQ(BroadcastShapes("t", {0, 3}, {1, 3}), Shape({0, 3}));
}

TEST(ElementwiseTest, StridedInputsAndOutputs) {
  const Tensor base = RandomTensor({6, 5}, 11);
  const Tensor at = base.Transpose(0, 1);  // (5,6), not contiguous
  const Tensor b = RandomTensor({5, 6}, 12);
  EXPECT_TRUE(AllClose(Add(at, b), RefBinary(at, b, std::plus<double>()), 1e-6, 1e-6));
  const Tensor narrow = RandomTensor({4, 10}, 13).Narrow(1, 2, 6);  // (4,6), row stride 10
  const Tensor bias = RandomTensor({12}, 14).Narrow(0, 3, 6);
  EXPECT_TRUE(
      AllClose(Mul(narrow, bias), RefBinary(narrow, bias, std::multiplies<double>()), 1e-6, 1e-6));
  // In place into a strided view: only the viewed elements change.
  const Tensor y = RandomTensor({4, 10}, 15);
  const Tensor before = y.Clone();
  const Tensor x = RandomTensor({4, 3}, 16);
  const Tensor view = y.Narrow(1, 4, 3);
  Axpy(2.0, x, view);
  const std::vector<float> vy = y.ToVector<float>(), vb = before.ToVector<float>(),
                           vx = x.ToVector<float>();
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 10; ++c) {
      const float expected =
          (c >= 4 && c < 7) ? vb[r * 10 + c] + 2 * vx[r * 3 + c - 4] : vb[r * 10 + c];
      EXPECT_FLOAT_EQ(vy[r * 10 + c], expected) << r << "," << c;
    }
  }
}

TEST(ElementwiseTest, LowPrecisionMatchesF32) {
  struct Tol {
    Dtype dtype;
    double rtol;
  };
  // One rounding of the output: 2^-8 relative for bf16, 2^-11 for f16.
  for (const Tol& t : {Tol{Dtype::kBF16, 8e-3}, Tol{Dtype::kF16, 1e-3}}) {
    SCOPED_TRACE(DtypeName(t.dtype));
    const Tensor a = RandomTensor({3, 50, 17}, 21, -3, 3, t.dtype);
    const Tensor b = RandomTensor({17}, 22, -3, 3, t.dtype);
    const Tensor af = a.To(Dtype::kF32), bf = b.To(Dtype::kF32);
    const Tensor sum = Add(a, b);
    EXPECT_EQ(sum.dtype(), t.dtype);
    EXPECT_TRUE(AllClose(sum, Add(af, bf), 1e-5, t.rtol));
    EXPECT_TRUE(AllClose(Sub(a, b), Sub(af, bf), 1e-5, t.rtol));
    EXPECT_TRUE(AllClose(Mul(a, b), Mul(af, bf), 1e-5, t.rtol));
    EXPECT_TRUE(AllClose(Scale(a, 0.3), Scale(af, 0.3), 1e-5, t.rtol));
    EXPECT_TRUE(AllClose(Gelu(a), Gelu(af), 1e-4, t.rtol));
    EXPECT_TRUE(AllClose(Relu(a), Relu(af), 0, t.rtol));
    EXPECT_TRUE(AllClose(BiasGelu(a, b), BiasGelu(af, bf), 1e-4, t.rtol));
    const Tensor g = RandomTensor(a.shape(), 23, -1, 1, t.dtype);
    const Tensor gf = g.To(Dtype::kF32);
    EXPECT_TRUE(AllClose(GeluBackward(g, a), GeluBackward(gf, af), 1e-4, t.rtol));
    EXPECT_TRUE(AllClose(ReluBackward(g, a), ReluBackward(gf, af), 0, t.rtol));
    // bias gradient: one sum over 150 rows, rounded once to the low precision.
    EXPECT_TRUE(AllClose(AddBiasBackward(g), AddBiasBackward(gf), 1e-3, t.rtol));
  }
}

TEST(ElementwiseTest, LowPrecisionStoresRoundExactlyLikeFromFloat) {
  // The kernels convert 8 lanes at a time; the result must be bit-identical to
  // computing in f32 and converting with Tensor::To (FromFloat<T>), over
  // magnitudes from f16 subnormals to overflow, with NaN and inf, and a length
  // that leaves a tail block.
  std::vector<float> va, vb;
  Generator gen(5);
  for (int i = 0; i < 2001; ++i) {
    const int exponent = -30 + i % 48;  // 2^-30 .. 2^17
    va.push_back(std::ldexp(gen.Uniform(2 * i) * 2 - 1, exponent));
    vb.push_back(std::ldexp(gen.Uniform(2 * i + 1) * 2 - 1, exponent));
  }
  va[7] = NAN;
  vb[100] = INFINITY;
  va[200] = -INFINITY;
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    SCOPED_TRACE(DtypeName(dtype));
    const Tensor a = Tensor::FromVector(va, {2001}, dtype);
    const Tensor b = Tensor::FromVector(vb, {2001}, dtype);
    const Tensor af = a.To(Dtype::kF32), bf = b.To(Dtype::kF32);
    const auto same_bits = [&](const Tensor& got, const Tensor& f32) {
      const Tensor want = f32.To(dtype);
      const uint16_t* g = static_cast<const uint16_t*>(got.raw_data());
      const uint16_t* w = static_cast<const uint16_t*>(want.raw_data());
      for (int64_t i = 0; i < got.numel(); ++i) {
        if (g[i] != w[i]) return ::testing::AssertionFailure() << "element " << i;
      }
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(same_bits(Add(a, b), Add(af, bf)));
    EXPECT_TRUE(same_bits(Mul(a, b), Mul(af, bf)));
    EXPECT_TRUE(same_bits(Scale(a, 1.0 / 3), Scale(af, 1.0 / 3)));
    EXPECT_TRUE(same_bits(Gelu(a), Gelu(af)));
  }
}

// Finite-difference check of d/da and d/db of L = <op(a, b), w>.
void CheckBinaryBackward(
    const Shape& sa, const Shape& sb, const std::function<Tensor(const Tensor&, const Tensor&)>& op,
    const std::function<BinaryGrads(const Tensor&, const Tensor&, const Tensor&)>& backward) {
  SCOPED_TRACE(sa.ToString() + " and " + sb.ToString());
  const Tensor a = RandomTensor(sa, 31);
  const Tensor b = RandomTensor(sb, 32);
  const Tensor w = RandomTensor(RefBroadcastShape(sa, sb), 33);
  const BinaryGrads grads = backward(w, a, b);
  ASSERT_EQ(grads.grad_a.shape(), sa);
  ASSERT_EQ(grads.grad_b.shape(), sb);
  const Tensor num_a = NumericalGradient([&](const Tensor& x) { return Dot(op(x, b), w); }, a);
  const Tensor num_b = NumericalGradient([&](const Tensor& x) { return Dot(op(a, x), w); }, b);
  EXPECT_TRUE(AllClose(grads.grad_a, num_a, 2e-3, 2e-3));
  EXPECT_TRUE(AllClose(grads.grad_b, num_b, 2e-3, 2e-3));
}

TEST(ElementwiseTest, BinaryBackwardMatchesFiniteDifferences) {
  const std::vector<std::pair<Shape, Shape>> shapes = {{{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}},
                                                       {{2, 3, 4}, {3, 1}},    {{2, 1, 4}, {3, 4}},
                                                       {{4}, {2, 3, 4}},       {{2, 3}, {}}};
  for (const auto& [sa, sb] : shapes) {
    CheckBinaryBackward(sa, sb, Add, [](const Tensor& g, const Tensor& a, const Tensor& b) {
      return AddBackward(g, a.shape(), b.shape());
    });
    CheckBinaryBackward(sa, sb, Sub, [](const Tensor& g, const Tensor& a, const Tensor& b) {
      return SubBackward(g, a.shape(), b.shape());
    });
    CheckBinaryBackward(sa, sb, Mul, [](const Tensor& g, const Tensor& a, const Tensor& b) {
      return MulBackward(g, a, b);
    });
  }
}

TEST(ElementwiseTest, ScaleAndBackward) {
  const Tensor x = RandomTensor({3, 7}, 41);
  EXPECT_TRUE(AllClose(Scale(x, -2.5), RefUnary(x, [](double v) { return -2.5 * v; }), 1e-6, 1e-6));
  const Tensor w = RandomTensor({3, 7}, 42);
  const Tensor num = NumericalGradient([&](const Tensor& t) { return Dot(Scale(t, -2.5), w); }, x);
  EXPECT_TRUE(AllClose(ScaleBackward(w, -2.5), num, 1e-3, 1e-3));
  const Tensor y = x.Clone();
  ScaleInPlace(y, 0.5);
  EXPECT_TRUE(AllClose(y, RefUnary(x, [](double v) { return 0.5 * v; }), 1e-7, 1e-7));
}

TEST(ElementwiseTest, AxpyAndAddInPlace) {
  const Tensor x = RandomTensor({33, 65}, 51);
  const Tensor y0 = RandomTensor({33, 65}, 52);
  const Tensor expected = RefBinary(y0, x, [](double y, double x) { return y + 0.25 * x; });
  Tensor y = y0.Clone();
  Axpy(0.25, x, y);
  EXPECT_TRUE(AllClose(y, expected, 1e-6, 1e-6));
  y = y0.Clone();
  AddInPlace(y, x);
  EXPECT_TRUE(AllClose(y, RefBinary(y0, x, std::plus<double>()), 1e-6, 1e-6));
}

TEST(ElementwiseTest, MixedPrecisionAccumulation) {
  // Low-precision gradients accumulate into f32 without an extra rounding.
  for (Dtype low : {Dtype::kBF16, Dtype::kF16}) {
    SCOPED_TRACE(DtypeName(low));
    const Tensor x = RandomTensor({4, 100}, 61, -1, 1, low);
    const Tensor y0 = RandomTensor({4, 100}, 62);
    const Tensor expected =
        RefBinary(y0, x.To(Dtype::kF32), [](double y, double x) { return y + 3 * x; });
    const Tensor y = y0.Clone();
    Axpy(3.0, x, y);
    EXPECT_EQ(y.dtype(), Dtype::kF32);
    EXPECT_TRUE(AllClose(y, expected, 1e-6, 1e-6));
    // Many small accumulations stay f32-accurate (a bf16 y would stall at 1).
    const Tensor acc = Tensor::Full({8}, 1.0);
    const Tensor tiny = Tensor::Full({8}, 1e-3, low);
    for (int i = 0; i < 1000; ++i) AddInPlace(acc, tiny);
    const double step = tiny.To(Dtype::kF32).ToVector<float>()[0];
    EXPECT_NEAR(acc.ToVector<float>()[0], 1.0 + 1000 * step, 1e-4);
  }
}

// SumAs adds in float, left to right, and rounds once: (a + b) + c in f32
// for bf16 / f16 / f32 operands (each exact in f32), then the output dtype.
TEST(ElementwiseTest, SumAsAddsInFloatAndRoundsOnce) {
  const Tensor a = RandomTensor({3, 50}, 71, -1, 1, Dtype::kBF16);
  const Tensor b = RandomTensor({3, 50}, 72, -1, 1, Dtype::kF16);
  const Tensor c = RandomTensor({3, 50}, 73);
  const std::vector<float> va = a.To(Dtype::kF32).ToVector<float>();
  const std::vector<float> vb = b.To(Dtype::kF32).ToVector<float>();
  const std::vector<float> vc = c.ToVector<float>();
  for (Dtype out : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    SCOPED_TRACE(DtypeName(out));
    const Tensor sum3 = SumAs({a, b, c}, out);
    const Tensor sum2 = SumAs({a, b.Transpose(0, 1).Contiguous().Transpose(0, 1)}, out);
    EXPECT_EQ(sum3.dtype(), out);
    const std::vector<float> got3 = sum3.To(Dtype::kF32).ToVector<float>();
    const std::vector<float> got2 = sum2.To(Dtype::kF32).ToVector<float>();
    std::vector<float> want3(va.size()), want2(va.size());
    for (size_t i = 0; i < va.size(); ++i) {
      want3[i] = (va[i] + vb[i]) + vc[i];
      want2[i] = va[i] + vb[i];
    }
    const std::vector<float> r3 =
        Tensor::FromVector(want3, {3, 50}).To(out).To(Dtype::kF32).ToVector<float>();
    const std::vector<float> r2 =
        Tensor::FromVector(want2, {3, 50}).To(out).To(Dtype::kF32).ToVector<float>();
    EXPECT_EQ(got3, r3);
    EXPECT_EQ(got2, r2);
  }
  // What is wrong is named.
  const auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const OpError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { SumAs({a}, Dtype::kF32); }).find("2 to 4 tensors, got 1"),
            std::string::npos);
  EXPECT_NE(message([&] { SumAs({a, b, c, a, b}, Dtype::kF32); }).find("got 5"), std::string::npos);
  EXPECT_NE(message([&] { SumAs({a, RandomTensor({50, 3}, 1)}, Dtype::kF32); })
                .find("shapes differ: (3,50) and (50,3)"),
            std::string::npos);
  EXPECT_NE(message([&] { SumAs({a, b}, Dtype::kI64); }).find("dtype must be floating"),
            std::string::npos);
  EXPECT_NE(message([&] { SumAs({a, Tensor()}, Dtype::kF32); }).find("undefined"),
            std::string::npos);
}

TEST(ElementwiseTest, AddBiasAndBackward) {
  const Tensor x = RandomTensor({2, 3, 5}, 71);
  const Tensor bias = RandomTensor({5}, 72);
  EXPECT_TRUE(AllClose(AddBias(x, bias), RefBinary(x, bias, std::plus<double>()), 1e-6, 1e-6));
  const Tensor w = RandomTensor({2, 3, 5}, 73);
  const Tensor num =
      NumericalGradient([&](const Tensor& b) { return Dot(AddBias(x, b), w); }, bias);
  const Tensor grad_bias = AddBiasBackward(w);
  EXPECT_EQ(grad_bias.shape(), Shape({5}));
  EXPECT_TRUE(AllClose(grad_bias, num, 1e-3, 1e-3));
  // Into: accumulates, also a bf16 gradient into an f32 one.
  const Tensor acc = Tensor::Full({5}, 1.0);
  AddBiasBackwardInto(w, acc);
  AddBiasBackwardInto(w.To(Dtype::kBF16), acc);
  const Tensor expected = Add(Add(Tensor::Full({5}, 1.0), grad_bias),
                              AddBiasBackward(w.To(Dtype::kBF16).To(Dtype::kF32)));
  EXPECT_TRUE(AllClose(acc, expected, 1e-5, 1e-5));
}

TEST(ElementwiseTest, GeluMatchesReference) {
  std::vector<float> values;
  for (int i = -400; i <= 400; ++i) values.push_back(i * 0.025f);  // [-10, 10]
  for (float v : {-100.0f, -30.0f, 30.0f, 100.0f, 1e-6f, -1e-6f, 0.0f}) values.push_back(v);
  const Tensor x = Tensor::FromVector(values, {static_cast<int64_t>(values.size())});
  EXPECT_TRUE(AllClose(Gelu(x), RefUnary(x, RefGelu), 1e-8, 2e-6));
  const Tensor g = RandomTensor(x.shape(), 81);
  const Tensor expected = RefBinary(g, x, [](double g, double x) { return g * RefGeluGrad(x); });
  EXPECT_TRUE(AllClose(GeluBackward(g, x), expected, 1e-7, 1e-5));
  // Long and strided inputs take the same vector path.
  const Tensor big = RandomTensor({300, 41}, 82, -6, 6).Transpose(0, 1);
  EXPECT_TRUE(AllClose(Gelu(big), RefUnary(big, RefGelu), 1e-8, 2e-6));
}

TEST(ElementwiseTest, GeluPropagatesNanAndInf) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> y = Gelu(Tensor::FromVector({nan, inf, -inf, 1}, {4})).ToVector<float>();
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], inf);
  EXPECT_TRUE(std::isnan(y[2]));  // -inf * 0, as in PyTorch
  EXPECT_NEAR(y[3], RefGelu(1.0), 1e-6);
  // Large finite inputs saturate without inf or NaN, forward and backward.
  const Tensor big = Tensor::FromVector({-1e30f, -100, -30, 30, 100, 1e30f}, {6});
  EXPECT_EQ(Gelu(big).ToVector<float>(), std::vector<float>({-0.0f, -0.0f, -0.0f, 30, 100, 1e30f}));
  EXPECT_TRUE(AllClose(GeluBackward(Tensor::Full({6}, 2.0), big),
                       Tensor::FromVector({0, 0, 0, 2, 2, 2}, {6}), 1e-30, 0));
}

TEST(ElementwiseTest, GeluBackwardMatchesFiniteDifferences) {
  const Tensor x = RandomTensor({4, 6}, 91, -3, 3);
  const Tensor w = RandomTensor({4, 6}, 92);
  const Tensor num = NumericalGradient([&](const Tensor& t) { return Dot(Gelu(t), w); }, x);
  EXPECT_TRUE(AllClose(GeluBackward(w, x), num, 1e-3, 1e-3));
}

TEST(ElementwiseTest, BiasGeluMatchesUnfusedAndBackward) {
  const Tensor x = RandomTensor({3, 4, 9}, 101, -3, 3);
  const Tensor bias = RandomTensor({9}, 102);
  EXPECT_TRUE(AllClose(BiasGelu(x, bias), Gelu(AddBias(x, bias)), 1e-6, 1e-6));
  const Tensor w = RandomTensor(x.shape(), 103);
  const BiasGeluGrads grads = BiasGeluBackward(w, x, bias);
  const Tensor num_x =
      NumericalGradient([&](const Tensor& t) { return Dot(BiasGelu(t, bias), w); }, x);
  const Tensor num_b =
      NumericalGradient([&](const Tensor& t) { return Dot(BiasGelu(x, t), w); }, bias);
  EXPECT_TRUE(AllClose(grads.grad_x, num_x, 1e-3, 1e-3));
  EXPECT_TRUE(AllClose(grads.grad_bias, num_b, 2e-3, 2e-3));
  // 1-D x: grad_bias equals grad_x but is its own tensor.
  const Tensor x1 = RandomTensor({9}, 104);
  const BiasGeluGrads g1 = BiasGeluBackward(RandomTensor({9}, 105), x1, bias);
  EXPECT_FALSE(g1.grad_bias.SharesStorageWith(g1.grad_x));
  EXPECT_TRUE(AllClose(g1.grad_bias, g1.grad_x, 0, 0));
}

TEST(ElementwiseTest, ReluAndBackward) {
  const Tensor x = Tensor::FromVector({-2, -0.5, 0, 0.5, 3, NAN}, {6});
  const std::vector<float> y = Relu(x).ToVector<float>();
  EXPECT_EQ(y[0], 0);
  EXPECT_EQ(y[1], 0);
  EXPECT_EQ(y[2], 0);
  EXPECT_EQ(y[3], 0.5f);
  EXPECT_EQ(y[4], 3);
  EXPECT_TRUE(std::isnan(y[5]));
  const Tensor g = Tensor::FromVector({1, 2, 3, 4, 5, 6}, {6});
  EXPECT_EQ(ReluBackward(g, x).ToVector<float>(), std::vector<float>({0, 0, 0, 4, 5, 0}));
  // Finite differences away from the kink.
  const Tensor xr = RandomTensor({5, 7}, 111);
  const Tensor w = RandomTensor({5, 7}, 112);
  const Tensor num = NumericalGradient([&](const Tensor& t) { return Dot(Relu(t), w); }, xr, 1e-4);
  EXPECT_TRUE(AllClose(ReluBackward(w, xr), num, 1e-3, 1e-3));
}

TEST(ElementwiseTest, ErrorMessages) {
  const Tensor a = Tensor::Zeros({2, 3});
  ExpectOpError(
      [&] {
        Add(a, Tensor::Zeros({4, 3}));
      },
      "[add] shapes (2,3) and (4,3) cannot be broadcast: sizes 2 and 4 at dim 0 "
      "(dims aligned at the end) differ and neither is 1");
  ExpectOpError(
      [&] {
        Mul(a, Tensor::Zeros({2, 3}, Dtype::kBF16));
      },
      "[mul] dtypes differ: f32 (2,3) and bf16 (2,3)");
  ExpectOpError([&] { Sub(Tensor::Zeros({2}, Dtype::kI32), Tensor::Zeros({2}, Dtype::kI32)); },
                "[sub] dtype i32 of tensor (2) is not supported");
  ExpectOpError(
      [&] {
        Axpy(1.0, a, Tensor::Zeros({2, 3}, Dtype::kBF16));
      },
      "[axpy] cannot accumulate x (2,3) f32 into y (2,3) bf16");
  ExpectOpError(
      [&] {
        AddInPlace(a, Tensor::Zeros({3, 2}));
      },
      "[add_in_place] shapes (2,3) and (3,2) differ");
  ExpectOpError([&] { AddBias(a, Tensor::Zeros({2})); },
                "[add_bias] bias (2) does not match x (2,3)");
  ExpectOpError([&] { GeluBackward(Tensor::Zeros({3}), a); },
                "[gelu_backward] shapes (3) and (2,3) differ");
  ExpectOpError(
      [&] {
        AddBackward(Tensor::Zeros({2, 2}), {2, 3}, {3});
      },
      "[add_backward] grad_out (2,2) does not match the output shape (2,3)");
  ExpectOpError([&] { Gelu(Tensor()); }, "[gelu] got an undefined tensor");
}

}  // namespace
}  // namespace tensor
