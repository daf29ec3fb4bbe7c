// Tests of the shape ops: casts and their backward, concat / split along each
// dim for every dtype against index loops, finite-difference gradients,
// strided inputs, contiguous copies, narrow backward and the error messages.
#include "tensor/ops/shape_ops.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace tensor {
namespace {

using ::tensor::testing::AllClose;
using ::tensor::testing::Dot;
using ::tensor::testing::NumericalGradient;
using ::tensor::testing::RandomTensor;

void ExpectOpError(const std::function<void()>& fn, const std::string& prefix) {
  try {
    fn();
    ADD_FAILURE() << "expected an OpError starting with: " << prefix;
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, prefix.size()), prefix) << e.what();
  }
}

// A tensor of `dtype` whose element i holds (i * 7 + salt) % 97 (exact in
// every dtype, u8 included).
Tensor Iota(const Shape& shape, Dtype dtype, int salt) {
  std::vector<float> v(shape.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7 + salt) % 97);
  return Tensor::FromVector(v, shape, dtype);
}

// Element (i0, i1, i2) of a contiguous rank-3 vector.
float At3(const std::vector<float>& v, const Shape& s, int64_t i0, int64_t i1, int64_t i2) {
  return v[(i0 * s[1] + i1) * s[2] + i2];
}

TEST(ShapeOpsTest, CastAndBackward) {
  const Tensor x = RandomTensor({3, 4}, 1, -2, 2);
  const Tensor h = Cast(x, Dtype::kBF16);
  EXPECT_EQ(h.dtype(), Dtype::kBF16);
  EXPECT_TRUE(AllClose(h, x, 0, 1.0 / 256));
  EXPECT_TRUE(Cast(x, Dtype::kF32).SharesStorageWith(x));  // no-op cast: no copy
  const Tensor g = RandomTensor({3, 4}, 2, -1, 1, Dtype::kBF16);
  const Tensor gx = CastBackward(g, Dtype::kF32);
  EXPECT_EQ(gx.dtype(), Dtype::kF32);
  EXPECT_TRUE(AllClose(gx, g, 0, 0));  // bf16 -> f32 is exact
  // f32 -> f32 cast gradient by finite differences (identity).
  const Tensor w = RandomTensor({3, 4}, 3);
  const Tensor num =
      NumericalGradient([&](const Tensor& t) { return Dot(Cast(t, Dtype::kF32), w); }, x.Clone());
  EXPECT_TRUE(AllClose(CastBackward(w, Dtype::kF32), num, 1e-3, 1e-3));
  EXPECT_EQ(Cast(Tensor::FromVector({1.7f, -2.2f}, {2}), Dtype::kI32).ToVector<int32_t>(),
            std::vector<int32_t>({1, -2}));
}

TEST(ShapeOpsTest, ConcatAndSplitEveryDimAndDtype) {
  for (Dtype dtype :
       {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kI32, Dtype::kI64, Dtype::kU8}) {
    for (int dim = -3; dim < 3; ++dim) {
      SCOPED_TRACE(absl::StrCat(DtypeName(dtype), " dim ", dim));
      const int d = dim < 0 ? dim + 3 : dim;
      Shape s0 = {2, 3, 4}, s1 = {2, 3, 4}, s2 = {2, 3, 4};
      s0[d] = 1;
      s1[d] = 3;
      s2[d] = 2;
      const std::vector<Tensor> parts = {Iota(s0, dtype, 0), Iota(s1, dtype, 5),
                                         Iota(s2, dtype, 9)};
      const Tensor cat = Concat(parts, dim);
      Shape expected_shape = {2, 3, 4};
      expected_shape[d] = 6;
      ASSERT_EQ(cat.shape(), expected_shape);
      EXPECT_EQ(cat.dtype(), dtype);
      EXPECT_TRUE(cat.is_contiguous());
      // Reference: element (i0,i1,i2) of cat comes from the part covering index i_d.
      const std::vector<float> got = cat.ToVector<float>();
      std::vector<std::vector<float>> pv;
      for (const Tensor& p : parts) pv.push_back(p.ToVector<float>());
      for (int64_t i0 = 0; i0 < expected_shape[0]; ++i0) {
        for (int64_t i1 = 0; i1 < expected_shape[1]; ++i1) {
          for (int64_t i2 = 0; i2 < expected_shape[2]; ++i2) {
            int64_t idx[3] = {i0, i1, i2};
            int part = 0;
            while (idx[d] >= parts[part].dim(d)) idx[d] -= parts[part++].dim(d);
            ASSERT_EQ(At3(got, expected_shape, i0, i1, i2),
                      At3(pv[part], parts[part].shape(), idx[0], idx[1], idx[2]))
                << i0 << "," << i1 << "," << i2;
          }
        }
      }
      const std::vector<Tensor> pieces = Split(cat, {1, 3, 2}, dim);
      ASSERT_EQ(pieces.size(), 3u);
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(pieces[i].shape(), parts[i].shape());
        EXPECT_TRUE(pieces[i].is_contiguous());
        EXPECT_FALSE(pieces[i].SharesStorageWith(cat));
        EXPECT_EQ(pieces[i].ToVector<float>(), parts[i].ToVector<float>());
      }
    }
  }
}

TEST(ShapeOpsTest, StridedInputsAndEmptyPieces) {
  const Tensor a = RandomTensor({5, 3}, 10).Transpose(0, 1);  // (3,5), not contiguous
  const Tensor b = RandomTensor({3, 2}, 11);
  const Tensor empty = Tensor::Zeros({3, 0});
  const Tensor cat = Concat({a, empty, b}, 1);
  ASSERT_EQ(cat.shape(), Shape({3, 7}));
  EXPECT_TRUE(AllClose(cat.Narrow(1, 0, 5), a, 0, 0));
  EXPECT_TRUE(AllClose(cat.Narrow(1, 5, 2), b, 0, 0));
  const std::vector<Tensor> pieces = Split(cat.Transpose(0, 1), {5, 0, 2}, 0);
  EXPECT_TRUE(AllClose(pieces[0], a.Transpose(0, 1), 0, 0));
  EXPECT_EQ(pieces[1].shape(), Shape({0, 3}));
  EXPECT_TRUE(AllClose(pieces[2], b.Transpose(0, 1), 0, 0));
}

TEST(ShapeOpsTest, ConcatAndSplitBackwardMatchFiniteDifferences) {
  const Tensor a = RandomTensor({2, 3}, 20);
  const Tensor b = RandomTensor({2, 4}, 21);
  const Tensor w = RandomTensor({2, 7}, 22);
  const std::vector<Tensor> grads = ConcatBackward(w, {3, 4}, 1);
  const Tensor num_a = NumericalGradient(
      [&](const Tensor& t) {
        return Dot(Concat({t, b}, 1), w);
      },
      a);
  const Tensor num_b = NumericalGradient(
      [&](const Tensor& t) {
        return Dot(Concat({a, t}, 1), w);
      },
      b);
  EXPECT_TRUE(AllClose(grads[0], num_a, 1e-3, 1e-3));
  EXPECT_TRUE(AllClose(grads[1], num_b, 1e-3, 1e-3));

  // L = <split(x)[0], w0> + <split(x)[2], w2>; piece 1 unused (undefined gradient).
  const Tensor x = RandomTensor({6, 2}, 23);
  const Tensor w0 = RandomTensor({1, 2}, 24), w2 = RandomTensor({3, 2}, 25);
  const Tensor grad_x = SplitBackward({w0, Tensor(), w2}, x.shape(), {1, 2, 3}, 0);
  const Tensor num_x = NumericalGradient(
      [&](const Tensor& t) {
        const std::vector<Tensor> p = Split(t, {1, 2, 3}, 0);
        return Dot(p[0], w0) + Dot(p[2], w2);
      },
      x);
  EXPECT_TRUE(AllClose(grad_x, num_x, 1e-3, 1e-3));
  EXPECT_EQ(grad_x.Narrow(0, 1, 2).ToVector<float>(), std::vector<float>(4, 0.0f));
}

TEST(ShapeOpsTest, ContiguousCopyAndNarrowBackward) {
  const Tensor x = RandomTensor({4, 6}, 30);
  const Tensor view = x.Transpose(0, 1).Narrow(0, 1, 3);  // (3,4), strided
  const Tensor c = ContiguousCopy(view);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.SharesStorageWith(x));
  EXPECT_TRUE(AllClose(c, view, 0, 0));
  EXPECT_FALSE(ContiguousCopy(x).SharesStorageWith(x));  // copies even when contiguous

  // d/dx <x.Narrow(1, 2, 3), w>.
  const Tensor w = RandomTensor({4, 3}, 31);
  const Tensor grad = NarrowBackward(w, x.shape(), 1, 2);
  const Tensor num =
      NumericalGradient([&](const Tensor& t) { return Dot(t.Narrow(1, 2, 3), w); }, x);
  EXPECT_TRUE(AllClose(grad, num, 1e-3, 1e-3));
}

TEST(ShapeOpsTest, ErrorMessages) {
  const Tensor a = Tensor::Zeros({2, 3});
  ExpectOpError(
      [&] {
        Concat({a, Tensor::Zeros({3, 3})}, 1);
      },
      "[concat] shapes (2,3) (tensor 0) and (3,3) (tensor 1) must match except along "
      "dim 1");
  ExpectOpError(
      [&] {
        Concat({a, Tensor::Zeros({2, 3}, Dtype::kBF16)}, 0);
      },
      "[concat] tensor 1 has dtype bf16 but tensor 0 has f32");
  ExpectOpError([&] { Concat({a, a}, 2); }, "[concat] dim 2 out of range for shape (2,3) (rank 2)");
  ExpectOpError([&] { Concat({}, 0); }, "[concat] needs at least one tensor");
  ExpectOpError(
      [&] {
        Split(a, {1, 1}, 1);
      },
      "[split] sizes (1,1) must be >= 0 and add up to dim 1 of x (2,3) f32, which is 3");
  ExpectOpError([&] { Split(a, {3}, -3); }, "[split] dim -3 out of range for shape (2,3)");
  ExpectOpError(
      [&] {
        SplitBackward({Tensor::Zeros({2, 2}), Tensor()}, {2, 3}, {1, 2}, 1);
      },
      "[split_backward] gradient 0 has shape (2,2), expected (2,1)");
  ExpectOpError(
      [&] {
        NarrowBackward(Tensor::Zeros({2, 2}), {2, 3}, 1, 2);
      },
      "[narrow_backward] grad_out (2,2) at offset 2 along dim 1 does not fit in (2,3)");
}

// Sizes below zero, or whose sum overflows, are refused before any copy:
// they added up to the dim (-2 + 4 = 2; 2^63 - 1 twice and 4 wrap to 2) and
// moved the copies outside the gradient's buffer. So is a narrow whose start
// + length overflows.
TEST(ShapeOpsTest, SizesThatOnlyAddUpByWrappingAreRefused) {
  constexpr int64_t kMax = INT64_MAX;
  ExpectOpError([&] { SplitBackward({Tensor(), Tensor::Zeros({4})}, {2}, {-2, 4}, 0); },
                "[split_backward] sizes (-2,4) must be >= 0 and add up to dim 0 of (2)");
  ExpectOpError(
      [&] { SplitBackward({Tensor(), Tensor(), Tensor::Zeros({4})}, {2}, {kMax, kMax, 4}, 0); },
      "[split_backward] sizes (9223372036854775807,9223372036854775807,4) must be >= 0");
  ExpectOpError([&] { Split(Tensor::Zeros({2}), {kMax, kMax, 4}, 0); },
                "[split] sizes (9223372036854775807,9223372036854775807,4) must be >= 0");
  ExpectOpError([&] { NarrowBackward(Tensor::Zeros({2}), {4}, 0, kMax - 1); },
                "[narrow_backward] grad_out (2) at offset 9223372036854775806 along dim 0 does "
                "not fit in (4)");
  EXPECT_EQ(SplitBackward({Tensor(), Tensor::FromVector({1, 2}, {2})}, {3}, {1, 2}, 0)
                .ToVector<float>(),
            (std::vector<float>{0, 1, 2}));
}

}  // namespace
}  // namespace tensor
