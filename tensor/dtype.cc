// Dtype names and sizes, and the IEEE half conversions.
#include "tensor/dtype.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tensor {

absl::string_view DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return "f32";
    case Dtype::kF16: return "f16";
    case Dtype::kBF16: return "bf16";
    case Dtype::kI32: return "i32";
    case Dtype::kI64: return "i64";
    case Dtype::kU8: return "u8";
  }
  return "?";
}

absl::StatusOr<Dtype> DtypeFromName(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return Dtype::kF32;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return Dtype::kF16;
  if (n == "bf16" || n == "bfloat16") return Dtype::kBF16;
  if (n == "i32" || n == "int32") return Dtype::kI32;
  if (n == "i64" || n == "int64") return Dtype::kI64;
  if (n == "u8" || n == "uint8") return Dtype::kU8;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "'; expected one of f32, f16, bf16, i32, i64, u8"));
}

int64_t DtypeSize(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return 4;
    case Dtype::kF16: return 2;
    case Dtype::kBF16: return 2;
    case Dtype::kI32: return 4;
    case Dtype::kI64: return 8;
    case Dtype::kU8: return 1;
  }
  return 0;
}

bool IsFloatingPoint(Dtype dtype) {
  return dtype == Dtype::kF32 || dtype == Dtype::kF16 || dtype == Dtype::kBF16;
}

std::ostream& operator<<(std::ostream& os, Dtype dtype) {
  return os << DtypeName(dtype);
}

f16 FloatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet.
    return f16{static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to inf (also inf itself).
    return f16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // Below the smallest normal half (2^-14): subnormal or zero.
    if (abs < 0x33000000u) return f16{sign};  // < 2^-25 rounds to zero.
    const int exp = static_cast<int>(abs >> 23);   // biased float exponent
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - exp;  // 14 + 23 - 10 + (127 - exp) - 24 ... = 126 - exp
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return f16{static_cast<uint16_t>(sign | half_mant)};
  }
  // Normal: rebias exponent (127 -> 15) and round the mantissa to 10 bits.
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return f16{static_cast<uint16_t>(sign | h)};
}

float F16ToFloat(f16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);  // inf, or NaN made quiet (as F16C does)
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    out = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    out = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

}  // namespace tensor
