// Dtype names, sizes and conversions, including edge values.
#include "tensor/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace tensor {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DtypeTest, NamesAndSizesRoundTrip) {
  const Dtype all[] = {Dtype::kF32, Dtype::kF16, Dtype::kBF16, Dtype::kI32, Dtype::kI64, Dtype::kU8};
  const int64_t sizes[] = {4, 2, 2, 4, 8, 1};
  for (int i = 0; i < kNumDtypes; ++i) {
    EXPECT_EQ(DtypeSize(all[i]), sizes[i]);
    auto parsed = DtypeFromName(DtypeName(all[i]));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, all[i]);
  }
  EXPECT_EQ(*DtypeFromName("bfloat16"), Dtype::kBF16);
  EXPECT_EQ(*DtypeFromName("FP16"), Dtype::kF16);
  auto bad = DtypeFromName("f8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown dtype 'f8'"), std::string::npos);
}

TEST(DtypeTest, DtypeOfTrait) {
  static_assert(DtypeOf<float>() == Dtype::kF32);
  static_assert(DtypeOf<bf16>() == Dtype::kBF16);
  static_assert(DtypeOf<f16>() == Dtype::kF16);
  static_assert(DtypeOf<int32_t>() == Dtype::kI32);
  static_assert(DtypeOf<int64_t>() == Dtype::kI64);
  static_assert(DtypeOf<uint8_t>() == Dtype::kU8);
  EXPECT_TRUE(IsFloatingPoint(Dtype::kBF16));
  EXPECT_FALSE(IsFloatingPoint(Dtype::kI64));
}

TEST(Bf16Test, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(FromBits(0x3f808001u))), FromBits(0x3f810000u));
}

TEST(Bf16Test, EdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(inf)), inf);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  // A NaN whose payload sits only in the low 16 bits must not become inf.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0xff800001u)))));
  EXPECT_EQ(Bits(Bf16ToFloat(FloatToBf16(-0.0f))), 0x80000000u);
  // The largest float rounds to inf in bf16 (it is above the largest bf16 + half ulp).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::max())), inf);
  // Largest finite bf16 survives.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(FromBits(0x7f7f0000u))), FromBits(0x7f7f0000u));
  // Subnormals keep their top bits.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(FromBits(0x00010000u))), FromBits(0x00010000u));
}

TEST(Bf16Test, EveryBf16SurvivesARoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const bf16 h{static_cast<uint16_t>(b)};
    const float f = Bf16ToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
      continue;
    }
    ASSERT_EQ(FloatToBf16(f).bits, h.bits) << b;
  }
}

TEST(F16Test, EveryHalfSurvivesARoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const f16 h{static_cast<uint16_t>(b)};
    const float f = F16ToFloat(h);
    // Hardware conversion (F16C) as the reference for half -> float.
    ASSERT_EQ(Bits(f), Bits(_cvtsh_ss(static_cast<uint16_t>(b)))) << b;
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToF16(f).bits, h.bits) << b;
  }
}

TEST(F16Test, MatchesHardwareRoundingOnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = rng();
    const float f = FromBits(u);
    const uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(FloatToF16(f).bits, want) << std::hex << u;
  }
}

TEST(F16Test, EdgeValues) {
  EXPECT_EQ(F16ToFloat(FloatToF16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(F16ToFloat(FloatToF16(65520.0f))));  // halfway to 65536: ties to inf
  EXPECT_EQ(F16ToFloat(FloatToF16(65519.0f)), 65504.0f);
  EXPECT_EQ(F16ToFloat(FloatToF16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // min subnormal
  EXPECT_EQ(F16ToFloat(FloatToF16(std::ldexp(1.0f, -25))), 0.0f);  // tie -> even (zero)
  EXPECT_EQ(F16ToFloat(FloatToF16(std::ldexp(1.5f, -25))), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(FloatToF16(std::ldexp(1.0f, -14))), std::ldexp(1.0f, -14));  // min normal
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(std::nanf("")))));
  EXPECT_EQ(FloatToF16(-0.0f).bits, 0x8000u);
  EXPECT_EQ(FloatToF16(-std::numeric_limits<float>::infinity()).bits, 0xfc00u);
}

}  // namespace
}  // namespace tensor
