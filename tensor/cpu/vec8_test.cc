// The 8-float vector helpers: conversions match ToFloat / FromFloat<T> bit for
// bit for whole blocks, partial blocks and strides; exp is accurate over the
// float range and handles its ends (0, +inf, NaN); row reductions pad safely.
#include "tensor/cpu/vec8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tensor {
namespace cpu {
namespace vec {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

// Values over many magnitudes (f16 subnormals to overflow), with NaN, inf, -0.
std::vector<float> Mixed(int n) {
  std::vector<float> v;
  uint64_t s = 12345;
  for (int i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2 - 1;
    v.push_back(std::ldexp(u, -30 + i % 50));
  }
  v[3] = std::nanf("");
  v[10] = kInf;
  v[17] = -kInf;
  v[21] = -0.0f;
  v[30] = 65519.0f;  // rounds to f16 inf
  return v;
}

template <typename T>
uint16_t Bits(T v) {
  return v.bits;
}

template <typename T>
void CheckConversions() {
  const std::vector<float> f = Mixed(64);
  std::vector<T> t(f.size());
  for (size_t i = 0; i < f.size(); ++i) t[i] = FromFloat<T>(f[i]);
  for (int64_t k = 1; k <= kLanes; ++k) {
    for (size_t base = 0; base + kLanes <= f.size(); base += kLanes) {
      // Stores: vector rounding equals FromFloat<T>, only k lanes written.
      std::vector<T> out(kLanes, FromFloat<T>(7.0f));
      if (k == kLanes) {
        StoreAs(out.data(), LoadUnit(f.data() + base), FullBlock{});
      } else {
        StoreAs(out.data(), LoadUnit(f.data() + base), k);
      }
      for (int64_t j = 0; j < kLanes; ++j) {
        const uint16_t want = Bits(j < k ? t[base + j] : FromFloat<T>(7.0f));
        ASSERT_EQ(Bits(out[j]), want) << "k=" << k << " lane " << j << " value " << f[base + j];
      }
      // Loads: ToFloat per lane, `fill` in lanes k..
      const F8 v =
          k == kLanes ? LoadAs(t.data() + base, FullBlock{}) : LoadAs(t.data() + base, k, -3.0f);
      for (int64_t j = 0; j < kLanes; ++j) {
        const float want = j < k ? ToFloat(t[base + j]) : -3.0f;
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(v[j]));
        } else {
          EXPECT_EQ(v[j], want) << "k=" << k << " lane " << j;
        }
      }
    }
  }
}

TEST(Vec8Test, PartialFloatBlocksTouchOnlyTheirLanes) {
  std::vector<float> src(16), dst(16, -1.0f);
  for (int i = 0; i < 16; ++i) src[i] = 1.5f * i;
  for (int64_t k = 1; k < kLanes; ++k) {
    const F8 v = LoadAs(src.data() + 4, k, 9.0f);
    for (int j = 0; j < kLanes; ++j) EXPECT_EQ(v[j], j < k ? src[4 + j] : 9.0f) << k;
    std::fill(dst.begin(), dst.end(), -1.0f);
    StoreAs(dst.data() + 4, Splat(5.0f), k);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(dst[i], (i >= 4 && i < 4 + k) ? 5.0f : -1.0f) << k;
  }
}

TEST(Vec8Test, Bf16ConversionsMatchScalar) { CheckConversions<bf16>(); }
TEST(Vec8Test, F16ConversionsMatchScalar) { CheckConversions<f16>(); }

TEST(Vec8Test, StridedLoadsAndStores) {
  std::vector<bf16> src(40);
  for (int i = 0; i < 40; ++i) src[i] = FromFloat<bf16>(0.5f * i);
  const F8 v = Load(src.data(), AnyStride{5}, int64_t{6});
  for (int j = 0; j < kLanes; ++j) EXPECT_EQ(v[j], j < 6 ? 2.5f * j : 0.0f);
  const F8 z = Load(src.data() + 3, ZeroStride{}, FullBlock{});
  for (int j = 0; j < kLanes; ++j) EXPECT_EQ(z[j], 1.5f);
  const F8 u = Load(src.data() + 8, UnitStride{}, int64_t{3});
  for (int j = 0; j < kLanes; ++j) EXPECT_EQ(u[j], j < 3 ? 0.5f * (8 + j) : 0.0f);
  std::vector<float> dst(20, -1.0f);
  Store(dst.data(), AnyStride{3}, int64_t{5}, Splat(2.0f));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(dst[i], (i % 3 == 0 && i < 15) ? 2.0f : -1.0f) << i;
}

TEST(Vec8Test, ExpIsAccurateOverTheFloatRange) {
  double max_ulp = 0;
  for (float x = -87.33654f; x < 88.37f; x += 0.0137f) {
    const float got = Exp(Splat(x))[3];
    const double want = std::exp(static_cast<double>(x));
    int e;
    std::frexp(want, &e);
    max_ulp = std::max(max_ulp, std::fabs(got - want) / std::ldexp(1.0, e - 24));
  }
  EXPECT_LE(max_ulp, 2.0);
  // Finite up to x = 88.37, then +inf (documented: from ~88.3763, a little
  // before float's own overflow at 88.7228).
  const double e88 = std::exp(static_cast<double>(88.37f));
  EXPECT_NEAR(Exp(Splat(88.37f))[0], e88, 1e-6 * e88);
  EXPECT_EQ(Exp(Splat(88.38f))[0], kInf);
  EXPECT_EQ(Exp(Splat(88.72284f))[0], kInf);
  EXPECT_EQ(Exp(Splat(200.0f))[0], kInf);
  EXPECT_EQ(Exp(Splat(kInf))[0], kInf);
  // Below the normal range: exactly 0.
  EXPECT_GT(Exp(Splat(-87.33654f))[0], 0.0f);
  EXPECT_EQ(Exp(Splat(-87.3366f))[0], 0.0f);
  EXPECT_EQ(Exp(Splat(-87.5f))[0], 0.0f);
  EXPECT_EQ(Exp(Splat(-1000.0f))[0], 0.0f);
  EXPECT_EQ(Exp(Splat(-kInf))[0], 0.0f);
  EXPECT_TRUE(std::isnan(Exp(Splat(std::nanf("")))[0]));
  EXPECT_EQ(Exp(Splat(0.0f))[0], 1.0f);
}

TEST(Vec8Test, RowHelpersPadTheTail) {
  for (int64_t n : {1, 7, 8, 9, 21}) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = -0.25f * i;
    float m;
    std::vector<float> scratch(n);
    RowAsFloatScaledMax(x.data(), n, scratch.data(), 2.0f, &m);
    EXPECT_EQ(m, 0.0f) << n;  // padding (-inf) never wins
    std::vector<float> y(n);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += std::exp(2.0 * x[i] - 1.0);
    EXPECT_NEAR(RowExpSum(x.data(), 2.0f, 1.0f, y.data(), n), want, 1e-6 * want) << n;
    EXPECT_NEAR(RowExpSumOnly(x.data(), 2.0f, 1.0f, n), want, 1e-6 * want) << n;
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += double{x[i]} * y[i];
    EXPECT_NEAR(RowDot(x.data(), y.data(), n), dot, 1e-5) << n;
  }
}

}  // namespace
}  // namespace vec
}  // namespace cpu
}  // namespace tensor
