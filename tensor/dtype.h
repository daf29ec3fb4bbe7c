// Element types of tensors: a closed enum with names, sizes, a C++ type trait,
// and the float <-> half / bfloat16 conversions every kernel shares.
#ifndef TENSOR_DTYPE_H_
#define TENSOR_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tensor {

enum class Dtype : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8 };

inline constexpr int kNumDtypes = 6;

// Stable names: "f32", "f16", "bf16", "i32", "i64", "u8".
absl::string_view DtypeName(Dtype dtype);
// Parses a name above (also accepts "float32", "float16", "bfloat16", "fp32",
// "fp16", "int32", "int64", "uint8").
absl::StatusOr<Dtype> DtypeFromName(absl::string_view name);
int64_t DtypeSize(Dtype dtype);
bool IsFloatingPoint(Dtype dtype);
std::ostream& operator<<(std::ostream& os, Dtype dtype);

// IEEE 754 binary16, stored as raw bits.
struct f16 {
  uint16_t bits;
};
// bfloat16 (the top half of an IEEE binary32), stored as raw bits.
struct bf16 {
  uint16_t bits;
};

// float -> bfloat16 with round-to-nearest-even; NaN stays NaN (quiet), inf stays inf.
inline bf16 FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet payload.
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

inline float Bf16ToFloat(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// float -> IEEE half with round-to-nearest-even, subnormals, overflow to inf,
// NaN preserved (quiet).
f16 FloatToF16(float f);
float F16ToFloat(f16 h);

// DtypeOf<T>(): the Dtype of a C++ element type.
template <typename T>
constexpr Dtype DtypeOf();
template <>
constexpr Dtype DtypeOf<float>() { return Dtype::kF32; }
template <>
constexpr Dtype DtypeOf<f16>() { return Dtype::kF16; }
template <>
constexpr Dtype DtypeOf<bf16>() { return Dtype::kBF16; }
template <>
constexpr Dtype DtypeOf<int32_t>() { return Dtype::kI32; }
template <>
constexpr Dtype DtypeOf<int64_t>() { return Dtype::kI64; }
template <>
constexpr Dtype DtypeOf<uint8_t>() { return Dtype::kU8; }

// Conversions between any element type and float (the compute type of CPU kernels).
template <typename T>
inline float ToFloat(T v) { return static_cast<float>(v); }
template <>
inline float ToFloat<bf16>(bf16 v) { return Bf16ToFloat(v); }
template <>
inline float ToFloat<f16>(f16 v) { return F16ToFloat(v); }

// A floating value as the integer type T: truncated toward zero as
// static_cast does, but saturated at T's range and 0 for NaN, where the cast
// itself is undefined (NaN, -1, 1e10 to u8: 0, 0, 255).
template <typename T, typename F>
inline T SaturatingCast(F v) {
  static_assert(std::is_integral_v<T> && std::is_floating_point_v<F>);
  if (v != v) return 0;  // NaN
  if (v <= static_cast<F>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  // T's max as F is exact or rounds up: anything below it truncates into T.
  if (v >= static_cast<F>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

template <typename T>
inline T FromFloat(float v) {
  if constexpr (std::is_integral_v<T>) {
    return SaturatingCast<T>(v);
  } else {
    return static_cast<T>(v);
  }
}
template <>
inline bf16 FromFloat<bf16>(float v) { return FloatToBf16(v); }
template <>
inline f16 FromFloat<f16>(float v) { return FloatToF16(v); }

}  // namespace tensor

#endif  // TENSOR_DTYPE_H_
