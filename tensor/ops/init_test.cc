// Tests of the initializers: constant fills (every dtype, strided views), the
// moments of uniform / normal / truncated normal draws against their formulas,
// bounds, determinism per seed, filling in slices versus in one call, strided
// views, low-precision storage, thread-count independence and errors.
#include "tensor/ops/init.h"

#include <algorithm>
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

void ExpectOpError(const std::function<void()>& fn, const std::string& prefix) {
  try {
    fn();
    ADD_FAILURE() << "expected an OpError starting with: " << prefix;
  } catch (const OpError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, prefix.size()), prefix) << e.what();
  }
}

struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};

Moments MomentsOf(const Tensor& t) {
  const std::vector<float> v = t.ToVector<float>();
  Moments m;
  for (float f : v) {
    m.mean += f;
    m.min = std::min<double>(m.min, f);
    m.max = std::max<double>(m.max, f);
  }
  m.mean /= v.size();
  for (float f : v) m.var += (f - m.mean) * (f - m.mean);
  m.var /= v.size() - 1;
  return m;
}

double Pdf(double x) { return std::isinf(x) ? 0.0 : std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double Cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

TEST(InitTest, FillEveryDtypeAndViews) {
  for (Dtype dtype :
       {Dtype::kF32, Dtype::kBF16, Dtype::kF16, Dtype::kI32, Dtype::kI64, Dtype::kU8}) {
    SCOPED_TRACE(DtypeName(dtype));
    const Tensor t = Tensor::Empty({3, 70001}, dtype);
    Fill(t, 5);
    const std::vector<float> v = t.ToVector<float>();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float f) { return f == 5; }));
    Zero(t.Narrow(1, 1, 2));  // a strided view: only its elements change
    const std::vector<float> w = t.ToVector<float>();
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < 5; ++c) {
        EXPECT_EQ(w[r * 70001 + c], (c == 1 || c == 2) ? 0 : 5) << r << "," << c;
      }
    }
  }
  const Tensor h = Tensor::Empty({4}, Dtype::kBF16);
  Fill(h, 0.1);
  EXPECT_EQ(h.ToVector<float>()[0], Bf16ToFloat(FloatToBf16(0.1f)));
}

// Zeroing a large tensor takes non-temporal stores for the aligned middle of
// each chunk: every element of views starting and ending at any byte offset
// becomes 0, and nothing around them changes.
TEST(InitTest, LargeZeroFillsExactlyTheirElements) {
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16, Dtype::kU8}) {
    for (int64_t offset : {0, 1, 3, 17}) {
      SCOPED_TRACE(::testing::Message() << DtypeName(dtype) << " offset " << offset);
      const int64_t n = (int64_t{3} << 20) / DtypeSize(dtype) + 5;  // over 3 MiB, not 32-aligned
      const Tensor all = Tensor::Empty({n + 2 * offset + 8}, dtype);
      Fill(all, 7);
      Zero(all.Narrow(0, offset + 4, n));
      const std::vector<float> v = all.ToVector<float>();
      for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
        const bool inside = i >= offset + 4 && i < offset + 4 + n;
        if (v[i] != (inside ? 0.0f : 7.0f)) {
          ADD_FAILURE() << "element " << i << " is " << v[i];
          break;
        }
      }
    }
  }
}

TEST(InitTest, UniformMoments) {
  const int64_t n = 400000;
  const Tensor t = Tensor::Empty({n});
  Generator gen(1);
  UniformInit(t, gen, -2, 3);
  const Moments m = MomentsOf(t);
  const double var = 25.0 / 12;
  EXPECT_NEAR(m.mean, 0.5, 5 * std::sqrt(var / n));
  EXPECT_NEAR(m.var, var, 0.01 * var);
  EXPECT_GE(m.min, -2);
  EXPECT_LT(m.max, 3);
  EXPECT_LT(m.min, -1.99);
  EXPECT_GT(m.max, 2.99);
  EXPECT_EQ(gen.offset(), static_cast<uint64_t>(n));  // one counter per element
}

TEST(InitTest, NormalMoments) {
  const int64_t n = 400000;
  const Tensor t = Tensor::Empty({400, 1000});
  Generator gen(2);
  NormalInit(t, gen, 1.5, 0.5);
  const Moments m = MomentsOf(t);
  EXPECT_NEAR(m.mean, 1.5, 5 * 0.5 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(m.var), 0.5, 0.005);
  // Shape of the distribution: the mass within one and two sigmas.
  const std::vector<float> v = t.ToVector<float>();
  const double in1 =
      std::count_if(v.begin(), v.end(), [](float f) { return std::fabs(f - 1.5) < 0.5; });
  const double in2 =
      std::count_if(v.begin(), v.end(), [](float f) { return std::fabs(f - 1.5) < 1.0; });
  EXPECT_NEAR(in1 / n, 0.682689, 0.004);
  EXPECT_NEAR(in2 / n, 0.954500, 0.002);
}

TEST(InitTest, TruncatedNormalBoundsAndMoments) {
  struct Case {
    double mean, std, a, b;
  };
  const std::vector<Case> cases = {
      {0, 1, -2, 2},           // PyTorch's default trunc_normal_
      {0, 0.02, -0.04, 0.04},  // GPT-style init
      {0.5, 2, 1, 3},          // interval above the mean (mirrored sampling)
      {0, 1, 3, INFINITY},     // far upper tail
      {0, 1, -INFINITY, -4},   // far lower tail
      {1, 1, 0.9, 0.95},       // a narrow interval
  };
  const int64_t n = 200000;
  uint64_t seed = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("mean ", c.mean, " std ", c.std, " [", c.a, ", ", c.b, "]"));
    const Tensor t = Tensor::Empty({n});
    Generator gen(seed++);
    TruncatedNormalInit(t, gen, c.mean, c.std, c.a, c.b);
    const Moments m = MomentsOf(t);
    EXPECT_GE(m.min, static_cast<float>(c.a));
    EXPECT_LE(m.max, static_cast<float>(c.b));
    const double alpha = (c.a - c.mean) / c.std, beta = (c.b - c.mean) / c.std;
    const double z = Cdf(beta) - Cdf(alpha);
    const double d = (Pdf(alpha) - Pdf(beta)) / z;
    const double ab =
        (std::isinf(alpha) ? 0 : alpha * Pdf(alpha)) - (std::isinf(beta) ? 0 : beta * Pdf(beta));
    const double mean = c.mean + c.std * d;
    const double var = c.std * c.std * (1 + ab / z - d * d);
    EXPECT_NEAR(m.mean, mean, 5 * std::sqrt(var / n) + 1e-6 * std::fabs(mean));
    EXPECT_NEAR(m.var, var, 0.02 * var);
  }
}

TEST(InitTest, SameSeedSameValuesAndSlicesEqualOneCall) {
  const Tensor a = Tensor::Empty({10, 7}), b = Tensor::Empty({10, 7});
  Generator g1(42), g2(42);
  NormalInit(a, g1, 0, 1);
  NormalInit(b, g2, 0, 1);
  EXPECT_TRUE(AllClose(a, b, 0, 0));
  // The next call continues the counter stream: different values.
  NormalInit(b, g2, 0, 1);
  EXPECT_FALSE(AllClose(a, b, 0, 0));
  // Another seed: different values.
  Generator g3(43);
  NormalInit(b, g3, 0, 1);
  EXPECT_FALSE(AllClose(a, b, 0, 0));

  // Filling rows [0,4) then [4,10) with one generator equals one call.
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    auto init = [&](const Tensor& t, Generator& g) {
      if (kind == 0) UniformInit(t, g, -1, 1);
      if (kind == 1) NormalInit(t, g, 0, 1);
      if (kind == 2) TruncatedNormalInit(t, g, 0, 1, -1, 1.5);
    };
    const Tensor whole = Tensor::Empty({10, 7}), halves = Tensor::Empty({10, 7});
    Generator gw(7), gh(7);
    init(whole, gw);
    init(halves.Narrow(0, 0, 4), gh);
    init(halves.Narrow(0, 4, 6), gh);
    EXPECT_TRUE(AllClose(whole, halves, 0, 0));
    EXPECT_EQ(gw.offset(), gh.offset());
    // A strided view gets the values a contiguous tensor of its shape would.
    const Tensor contiguous = Tensor::Empty({7, 10});
    const Tensor storage = Tensor::Empty({10, 7});
    Generator gc(8), gv(8);
    init(contiguous, gc);
    init(storage.Transpose(0, 1), gv);
    EXPECT_TRUE(AllClose(storage.Transpose(0, 1), contiguous, 0, 0));
  }
}

TEST(InitTest, LowPrecisionIsTheRoundedF32Draw) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    SCOPED_TRACE(DtypeName(dtype));
    const Tensor low = Tensor::Empty({1000}, dtype), ref = Tensor::Empty({1000});
    Generator g1(9), g2(9);
    NormalInit(low, g1, 0, 0.02);
    NormalInit(ref, g2, 0, 0.02);
    EXPECT_TRUE(AllClose(low, ref.To(dtype), 0, 0));
    EXPECT_TRUE(AllClose(low, ref, 1e-6, dtype == Dtype::kBF16 ? 4e-3 : 5e-4));
  }
}

std::string Fingerprint() {
  const Tensor u = Tensor::Empty({333, 1001}), n = Tensor::Empty({1001, 333});
  const Tensor tn = Tensor::Empty({300, 500}, Dtype::kBF16);
  Generator gen(11);
  UniformInit(u, gen, -1, 1);
  NormalInit(n.Transpose(0, 1), gen, 0, 1);
  TruncatedNormalInit(tn, gen, 0, 1, -2, 2);
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& t : {u, n, tn.To(Dtype::kF32)}) {
    for (float f : t.ToVector<float>()) {
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      h = (h ^ bits) * 1099511628211ull;
    }
  }
  return absl::StrCat(h);
}

TEST(InitDeathTest, ValuesDoNotDependOnThreadCount) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The parent records its fingerprint; each child (a fresh process whose
  // default pool has FSDP_NUM_THREADS threads) compares with it.
  if (std::getenv("INIT_TEST_EXPECTED") == nullptr) {
    setenv("INIT_TEST_EXPECTED", Fingerprint().c_str(), 1);
  }
  const std::string expected = std::getenv("INIT_TEST_EXPECTED");
  for (const char* threads : {"1", "3", "8"}) {
    setenv("FSDP_NUM_THREADS", threads, 1);
    EXPECT_EXIT(std::exit(Fingerprint() == expected ? 0 : 1), ::testing::ExitedWithCode(0), "")
        << "threads " << threads;
  }
  unsetenv("FSDP_NUM_THREADS");
}

TEST(InitTest, ErrorMessages) {
  const Tensor t = Tensor::Empty({2});
  Generator gen(0);
  ExpectOpError([&] { UniformInit(t, gen, 1, 0); },
                "[uniform_init] bounds must be finite with lo <= hi, got lo 1 and hi 0 for "
                "tensor (2)");
  ExpectOpError([&] { NormalInit(Tensor::Empty({2}, Dtype::kI32), gen, 0, 1); },
                "[normal_init] dtype i32 of tensor (2) is not supported");
  ExpectOpError([&] { NormalInit(t, gen, 0, -1); }, "[normal_init] mean must be finite");
  ExpectOpError([&] { TruncatedNormalInit(t, gen, 0, 1, 2, -2); },
                "[truncated_normal_init] need finite mean, finite std > 0 and a < b, got mean 0, "
                "std 1, [2, -2] for tensor (2)");
  ExpectOpError([&] { Fill(Tensor(), 1); }, "[fill] got an undefined tensor");
  EXPECT_EQ(gen.offset(), 0u);  // failed calls reserve no counters
}

}  // namespace
}  // namespace tensor

namespace tensor {
namespace {

TEST(ArangeTest, CountsFromZeroInI32AndI64) {
  EXPECT_EQ(Arange(5).ToVector<int64_t>(), std::vector<int64_t>({0, 1, 2, 3, 4}));
  const Tensor i32 = Arange(3, Dtype::kI32);
  EXPECT_EQ(i32.dtype(), Dtype::kI32);
  EXPECT_EQ(i32.shape(), Shape({3}));
  EXPECT_EQ(i32.ToVector<int32_t>(), std::vector<int32_t>({0, 1, 2}));
  EXPECT_EQ(Arange(0).numel(), 0);
  EXPECT_THROW(Arange(-1), OpError);
  EXPECT_THROW(Arange(3, Dtype::kF32), OpError);
  // i32 holds values up to 2^31 - 1: a longer range is refused before it is
  // allocated (it would wrap to negative ids), and names the dtype to use.
  try {
    Arange(int64_t{1} << 32, Dtype::kI32);
    ADD_FAILURE() << "a range past i32 was accepted";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit i32 (its last value would be 4294967295); "
                                         "use i64"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tensor
