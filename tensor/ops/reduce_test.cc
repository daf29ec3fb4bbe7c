// Tests of the reductions: sum / mean / max against naive double loops over
// every dim, backward passes against finite differences, accuracy of long
// sums, independence from the thread count, ReduceToShape, norms and errors.
#include "tensor/ops/reduce.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
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

enum class Kind { kSum, kMean, kMax };

// Reduces x over dim d in double; for kMax also returns the first argmax.
Tensor RefReduce(const Tensor& x, int d, bool keepdim, Kind kind,
                 std::vector<int64_t>* argmax = nullptr) {
  const std::vector<float> v = x.ToVector<float>();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= x.dim(i);
  for (int i = d + 1; i < x.rank(); ++i) inner *= x.dim(i);
  const int64_t n = x.dim(d);
  std::vector<float> out(outer * inner);
  if (argmax) argmax->assign(outer * inner, 0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double acc = kind == Kind::kMax ? -INFINITY : 0;
      int64_t best = 0;
      for (int64_t r = 0; r < n; ++r) {
        const double e = v[(o * n + r) * inner + i];
        if (kind == Kind::kMax) {
          if (e > acc) {
            acc = e;
            best = r;
          }
        } else {
          acc += e;
        }
      }
      if (kind == Kind::kMean) acc /= n;
      out[o * inner + i] = static_cast<float>(acc);
      if (argmax) (*argmax)[o * inner + i] = best;
    }
  }
  Shape shape;
  for (int i = 0; i < x.rank(); ++i) {
    if (i != d) shape.push_back(x.dim(i));
    if (i == d && keepdim) shape.push_back(1);
  }
  return Tensor::FromVector(out, shape);
}

void ExpectOpError(const std::function<void()>& fn, const std::string& prefix) {
  try {
    fn();
    ADD_FAILURE() << "expected an OpError starting with: " << prefix;
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, prefix.size()), prefix) << e.what();
  }
}

TEST(ReduceTest, OverEachDimMatchesReference) {
  const Tensor x = RandomTensor({3, 4, 5}, 1);
  for (int dim = -3; dim < 3; ++dim) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dim ", dim, " keepdim ", keepdim));
      const int d = dim < 0 ? dim + 3 : dim;
      EXPECT_TRUE(AllClose(Sum(x, dim, keepdim), RefReduce(x, d, keepdim, Kind::kSum), 1e-6, 1e-6));
      EXPECT_TRUE(
          AllClose(Mean(x, dim, keepdim), RefReduce(x, d, keepdim, Kind::kMean), 1e-6, 1e-6));
      std::vector<int64_t> argmax;
      const Tensor ref = RefReduce(x, d, keepdim, Kind::kMax, &argmax);
      const MaxResult m = MaxWithIndices(x, dim, keepdim);
      EXPECT_TRUE(AllClose(m.values, ref, 0, 0));
      EXPECT_EQ(m.indices.shape(), ref.shape());
      EXPECT_EQ(m.indices.ToVector<int64_t>(), argmax);
    }
  }
}

TEST(ReduceTest, LargeShapesUseBlocksAndMatchReference) {
  // Long rows (several blocks per row), many columns with many rows (row and
  // column blocks), and a strided input.
  const std::vector<std::pair<Shape, int>> cases = {
      {{3, 100003}, 1}, {{1000, 300}, 0}, {{2, 700, 33}, 1}, {{5, 4000}, 0}, {{70000, 2}, 0}};
  uint64_t seed = 10;
  for (const auto& [shape, dim] : cases) {
    SCOPED_TRACE(shape.ToString());
    const Tensor x = RandomTensor(shape, seed++);
    EXPECT_TRUE(AllClose(Sum(x, dim), RefReduce(x, dim, false, Kind::kSum), 1e-5, 1e-6));
    EXPECT_TRUE(AllClose(Mean(x, dim), RefReduce(x, dim, false, Kind::kMean), 1e-6, 1e-6));
    std::vector<int64_t> argmax;
    const Tensor ref = RefReduce(x, dim, false, Kind::kMax, &argmax);
    const MaxResult m = MaxWithIndices(x, dim);
    EXPECT_TRUE(AllClose(m.values, ref, 0, 0));
    EXPECT_EQ(m.indices.ToVector<int64_t>(), argmax);
  }
  const Tensor t = RandomTensor({64, 50}, 20).Transpose(0, 1);
  EXPECT_TRUE(AllClose(Sum(t, 1), RefReduce(t.Contiguous(), 1, false, Kind::kSum), 1e-6, 1e-6));
}

TEST(ReduceTest, LongSumsAreAccurate) {
  // 0.1f added 2^22 times: a float accumulator is off by percent; double is not.
  const int64_t n = int64_t{1} << 22;
  const Tensor x = Tensor::Full({n}, 0.1);
  const double exact = n * static_cast<double>(0.1f);
  EXPECT_NEAR(SumAll(x).Item(), exact, exact * 1e-7);
  EXPECT_NEAR(MeanAll(x).Item(), 0.1f, 1e-8);
  EXPECT_NEAR(Sum(x.View({4, n / 4}), 1).ToVector<float>()[3], exact / 4, exact * 1e-7);
  EXPECT_NEAR(Sum(x.View({n / 4, 4}), 0).ToVector<float>()[3], exact / 4, exact * 1e-7);
  EXPECT_NEAR(SumSquares(x), n * std::pow(static_cast<double>(0.1f), 2), 1e-9 * n);
}

// Sum, max and the L2 norm of a large tensor; the child processes below
// recompute them with other thread counts and compare bit for bit.
std::vector<double> ThreadSensitiveResults() {
  const Tensor x = RandomTensor({300, 1000}, 30);
  std::vector<double> r;
  for (float v : Sum(x, 0).ToVector<float>()) r.push_back(v);
  for (float v : Sum(x, 1).ToVector<float>()) r.push_back(v);
  r.push_back(SumAll(x).Item());
  r.push_back(L2Norm({x}));
  r.push_back(static_cast<double>(MaxAllWithIndex(x).indices.Item()));
  return r;
}

std::string Fingerprint(const std::vector<double>& values) {
  uint64_t h = 1469598103934665603ull;
  for (double v : values) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    h = (h ^ bits) * 1099511628211ull;
  }
  return absl::StrCat(h);
}

TEST(ReduceDeathTest, ResultsDoNotDependOnThreadCount) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The parent records its fingerprint; each child (a fresh process whose
  // default pool has FSDP_NUM_THREADS threads) compares with it.
  if (std::getenv("REDUCE_TEST_EXPECTED") == nullptr) {
    setenv("REDUCE_TEST_EXPECTED", Fingerprint(ThreadSensitiveResults()).c_str(), 1);
  }
  const std::string expected = std::getenv("REDUCE_TEST_EXPECTED");
  for (const char* threads : {"1", "3", "8"}) {
    setenv("FSDP_NUM_THREADS", threads, 1);
    EXPECT_EXIT(std::exit(Fingerprint(ThreadSensitiveResults()) == expected ? 0 : 1),
                ::testing::ExitedWithCode(0), "")
        << "threads " << threads;
  }
  unsetenv("FSDP_NUM_THREADS");
}

TEST(ReduceTest, BackwardMatchesFiniteDifferences) {
  const Tensor x = RandomTensor({3, 4, 5}, 40);
  for (int dim = 0; dim < 3; ++dim) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dim ", dim, " keepdim ", keepdim));
      const Shape out_shape = Sum(x, dim, keepdim).shape();
      const Tensor w = RandomTensor(out_shape, 41 + dim);
      auto num = [&](const std::function<Tensor(const Tensor&)>& f) {
        return NumericalGradient([&](const Tensor& t) { return Dot(f(t), w); }, x);
      };
      EXPECT_TRUE(AllClose(SumBackward(w, x.shape(), dim, keepdim),
                           num([&](const Tensor& t) { return Sum(t, dim, keepdim); }), 1e-3, 1e-3));
      EXPECT_TRUE(AllClose(MeanBackward(w, x.shape(), dim, keepdim),
                           num([&](const Tensor& t) { return Mean(t, dim, keepdim); }), 1e-3,
                           1e-3));
      const MaxResult m = MaxWithIndices(x, dim, keepdim);
      EXPECT_TRUE(AllClose(MaxBackward(w, m.indices, x.shape(), dim, keepdim),
                           num([&](const Tensor& t) { return Max(t, dim, keepdim); }), 1e-3, 1e-3));
    }
  }
  const Tensor w = Tensor::Full({}, 0.7);
  auto num_all = [&](const std::function<Tensor(const Tensor&)>& f) {
    return NumericalGradient([&](const Tensor& t) { return Dot(f(t), w); }, x);
  };
  EXPECT_TRUE(AllClose(SumAllBackward(w, x.shape()), num_all(SumAll), 1e-3, 1e-3));
  EXPECT_TRUE(AllClose(MeanAllBackward(w, x.shape()), num_all(MeanAll), 1e-3, 1e-3));
  EXPECT_TRUE(AllClose(MaxAllBackward(w, MaxAllWithIndex(x).indices, x.shape()), num_all(MaxAll),
                       1e-3, 1e-3));
}

TEST(ReduceTest, MaxTiesAndNan) {
  const Tensor x = Tensor::FromVector({1, 3, 3, 2, /**/ 5, 5, 5, 5}, {2, 4});
  EXPECT_EQ(MaxWithIndices(x, 1).indices.ToVector<int64_t>(), std::vector<int64_t>({1, 0}));
  EXPECT_EQ(MaxAllWithIndex(x).indices.Item(), 4);
  const std::vector<float> g =
      MaxBackward(Tensor::FromVector({10, 20}, {2}), MaxWithIndices(x, 1).indices, x.shape(), 1)
          .ToVector<float>();
  EXPECT_EQ(g, std::vector<float>({0, 10, 0, 0, 20, 0, 0, 0}));
  const Tensor n = Tensor::FromVector({1, NAN, 7, NAN}, {4});
  const MaxResult m = MaxAllWithIndex(n);
  EXPECT_TRUE(std::isnan(m.values.Item()));
  EXPECT_EQ(m.indices.Item(), 1);
}

TEST(ReduceTest, LowPrecisionMatchesF32) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    SCOPED_TRACE(DtypeName(dtype));
    const Tensor x = RandomTensor({6, 200, 7}, 50, 0, 1, dtype);  // positive: no cancellation
    const Tensor xf = x.To(Dtype::kF32);
    const double rtol = dtype == Dtype::kBF16 ? 8e-3 : 1e-3;  // one output rounding
    for (int dim = 0; dim < 3; ++dim) {
      const Tensor s = Sum(x, dim);
      EXPECT_EQ(s.dtype(), dtype);
      EXPECT_TRUE(AllClose(s, Sum(xf, dim), 0, rtol));
      EXPECT_TRUE(AllClose(Mean(x, dim), Mean(xf, dim), 0, rtol));
      EXPECT_TRUE(AllClose(Max(x, dim), Max(xf, dim), 0, 0));
    }
    EXPECT_NEAR(SumSquares(x), SumSquares(xf), 1e-9 * SumSquares(xf));
    const Tensor w = RandomTensor({6, 7}, 51, -1, 1, dtype);
    EXPECT_TRUE(AllClose(MeanBackward(w, x.shape(), 1),
                         MeanBackward(w.To(Dtype::kF32), x.shape(), 1), 0, rtol));
  }
}

TEST(ReduceTest, ReduceToShape) {
  const Tensor x = RandomTensor({2, 3, 4}, 60);
  const std::vector<float> v = x.ToVector<float>();
  const std::vector<Shape> targets = {{4},       {3, 1}, {1, 3, 1}, {},
                                      {2, 1, 4}, {1},    {2, 3, 1}, {3, 4}};
  for (const Shape& target : targets) {
    SCOPED_TRACE(target.ToString());
    std::vector<double> ref(target.numel(), 0.0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      // Index of x's element i in the target, dims aligned at the end.
      int64_t rest = i, src = 0, stride = 1;
      for (int d = 2; d >= 0; --d) {
        const int64_t idx = rest % x.dim(d);
        rest /= x.dim(d);
        const int td = d - (3 - target.rank());
        if (td < 0) continue;
        if (target[td] != 1) src += idx * stride;
        stride *= target[td];
      }
      ref[src] += v[i];
    }
    const Tensor got = ReduceToShape(x, target);
    EXPECT_EQ(got.shape(), target);
    EXPECT_TRUE(AllClose(
        got, Tensor::FromVector(std::vector<float>(ref.begin(), ref.end()), target), 1e-6, 1e-6));
  }
  EXPECT_TRUE(ReduceToShape(x, x.shape()).SharesStorageWith(x));
  // Into: accumulate, bf16 into f32.
  const Tensor out = Tensor::Full({4}, 2.0);
  ReduceToShapeInto(x.To(Dtype::kBF16), out, /*accumulate=*/true);
  const Tensor expected = ReduceToShape(x.To(Dtype::kBF16).To(Dtype::kF32), {4});
  std::vector<float> e = expected.ToVector<float>();
  for (float& f : e) f += 2;
  EXPECT_TRUE(AllClose(out, Tensor::FromVector(e, {4}), 1e-6, 1e-6));
}

TEST(ReduceTest, NormsAndEmptyReductions) {
  const Tensor a = RandomTensor({10, 10}, 70);
  const Tensor b = RandomTensor({33}, 71, -1, 1, Dtype::kBF16);
  double ref = 0;
  for (float f : a.ToVector<float>()) ref += static_cast<double>(f) * f;
  for (float f : b.ToVector<float>()) ref += static_cast<double>(f) * f;
  EXPECT_NEAR(L2Norm({a, b}), std::sqrt(ref), 1e-12);
  EXPECT_NEAR(SumSquares(a.Transpose(0, 1)), SumSquares(a), 1e-12);
  const Tensor inf = Tensor::FromVector({1, INFINITY}, {2});
  EXPECT_TRUE(std::isinf(L2Norm({a, inf})));
  const Tensor empty = Tensor::Zeros({3, 0});
  EXPECT_EQ(Sum(empty, 1).ToVector<float>(), std::vector<float>({0, 0, 0}));
  EXPECT_TRUE(std::isnan(Mean(empty, 1).ToVector<float>()[0]));
  EXPECT_EQ(Sum(empty, 0).shape(), Shape({0}));
  EXPECT_EQ(SumAll(empty).Item(), 0);
}

TEST(ReduceTest, ErrorMessages) {
  const Tensor x = Tensor::Zeros({2, 3});
  ExpectOpError([&] { Sum(x, 2); }, "[sum] dim 2 out of range for shape (2,3) (rank 2)");
  ExpectOpError([&] { Mean(x, -3); }, "[mean] dim -3 out of range for shape (2,3) (rank 2)");
  ExpectOpError(
      [&] {
        Max(Tensor::Zeros({2, 0}), 1);
      },
      "[max] cannot take the max over dim 1 of size 0 of x (2,0) f32");
  ExpectOpError([&] { SumAll(Tensor::Zeros({2}, Dtype::kI64)); },
                "[sum] dtype i64 of tensor (2) is not supported");
  ExpectOpError(
      [&] {
        SumBackward(Tensor::Zeros({3}), {2, 3}, 1);
      },
      "[sum_backward] grad_out (3) does not match the output shape (2) of reducing "
      "(2,3) over dim 1");
  ExpectOpError(
      [&] {
        MaxBackward(Tensor::Zeros({2}), Tensor::Zeros({2}), {2, 3}, 1);
      },
      "[max_backward] expected i64 indices of shape (2), got indices (2) f32");
  ExpectOpError([&] { ReduceToShape(x, {4}); },
                "[reduce_to_shape] cannot reduce shape (2,3) to (4)");
  ExpectOpError(
      [&] {
        MaxBackward(Tensor::Zeros({2}), Tensor::Full({2}, 5, Dtype::kI64), {2, 3}, 1);
      },
      "[max_backward] index 5 out of range for a dimension of size 3");
}

}  // namespace
}  // namespace tensor
