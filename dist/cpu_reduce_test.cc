// Tests of the host reduction kernels: op semantics at the edges (NaN,
// integer wrap-around, rounding once for half types, aliasing, block edges).
#include "dist/cpu_reduce.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace dist {
namespace internal {
namespace {

using tensor::bf16;
using tensor::Dtype;

TEST(CpuReduceTest, SumAcrossBlockEdgesWithOutputAliasingAnInput) {
  const int64_t n = 2500;  // more than two blocks, not a multiple of one
  std::vector<float> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = i;
    b[i] = 2 * i;
    c[i] = -0.5f * i;
  }
  std::vector<float> out(n, -1);
  const void* ins[] = {a.data(), b.data(), c.data()};
  void* outs[] = {a.data(), out.data()};  // in place into a, and a copy
  ReduceBuffers(Dtype::kF32, ReduceOp::kSum, ins, outs, n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i], 2.5f * i) << i;
    ASSERT_EQ(out[i], 2.5f * i) << i;
  }
}

TEST(CpuReduceTest, AvgMaxMinF32) {
  std::vector<float> a = {1, -3, 5}, b = {3, 4, -5};
  const void* ins[] = {a.data(), b.data()};
  const std::vector<std::pair<ReduceOp, std::vector<float>>> cases = {
      {ReduceOp::kAvg, {2, 0.5, 0}}, {ReduceOp::kMax, {3, 4, 5}}, {ReduceOp::kMin, {1, -3, -5}}};
  for (const auto& [op, want] : cases) {
    std::vector<float> out(3);
    void* outs[] = {out.data()};
    ReduceBuffers(Dtype::kF32, op, ins, outs, 3);
    EXPECT_EQ(out, want) << ReduceOpName(op);
  }
}

TEST(CpuReduceTest, MaxAndMinPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {nan, 1}, b = {2, nan};
  const void* ins[] = {a.data(), b.data()};
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<float> out(2);
    void* outs[] = {out.data()};
    ReduceBuffers(Dtype::kF32, op, ins, outs, 2);
    EXPECT_TRUE(std::isnan(out[0])) << ReduceOpName(op);
    EXPECT_TRUE(std::isnan(out[1])) << ReduceOpName(op);
  }
}

TEST(CpuReduceTest, IntegerSumsWrapAndMaxIsExact) {
  std::vector<int32_t> a = {std::numeric_limits<int32_t>::max(), -7};
  std::vector<int32_t> b = {1, 3};
  const void* ins[] = {a.data(), b.data()};
  std::vector<int32_t> out(2);
  void* outs[] = {out.data()};
  ReduceBuffers(Dtype::kI32, ReduceOp::kSum, ins, outs, 2);
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(out[1], -4);
  std::vector<int64_t> x = {int64_t{1} << 60, -1}, y = {(int64_t{1} << 60) + 1, -2};
  const void* ins64[] = {x.data(), y.data()};
  std::vector<int64_t> out64(2);
  void* outs64[] = {out64.data()};
  ReduceBuffers(Dtype::kI64, ReduceOp::kMax, ins64, outs64, 2);
  EXPECT_EQ(out64[0], (int64_t{1} << 60) + 1);  // not representable in f32/f64-rounded paths
  EXPECT_EQ(out64[1], -1);
}

TEST(CpuReduceTest, Bf16RoundsOnce) {
  // 1 + 3*2^-10 + 3*2^-10 = 1 + 0.75 * 2^-7 in f32 rounds to 1 + 2^-7 in bf16;
  // rounding each partial sum to bf16 would give 1.
  std::vector<bf16> a = {tensor::FloatToBf16(1.0f)};
  std::vector<bf16> b = {tensor::FloatToBf16(3.0f / 1024)};
  const void* ins[] = {a.data(), b.data(), b.data()};
  std::vector<bf16> out(1);
  void* outs[] = {out.data()};
  ReduceBuffers(Dtype::kBF16, ReduceOp::kSum, ins, outs, 1);
  EXPECT_EQ(tensor::Bf16ToFloat(out[0]), 1.0078125f);
}

}  // namespace
}  // namespace internal
}  // namespace dist
