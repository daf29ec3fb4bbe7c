// Blocks of 8 floats for the elementwise and reduction kernels: GCC vector
// extension types (AVX2 at -march=x86-64-v3, plain code on other targets),
// loads and stores of f32 / bf16 / f16 rows with unit, zero (broadcast) or any
// stride, and a vector exp.
//
// The hot loops are written on these vectors instead of being left to the
// auto-vectorizer, whose -O2 cost model skips loops that need a tail or alias
// checks. bf16 and f16 convert exactly as ToFloat / FromFloat<T> do (round to
// nearest even, NaN kept quiet), eight at a time. Private to tensor/cpu.
#ifndef TENSOR_CPU_VEC8_H_
#define TENSOR_CPU_VEC8_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "absl/base/attributes.h"
#include "tensor/dtype.h"

namespace tensor {
namespace cpu {
namespace vec {

inline constexpr int kLanes = 8;

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef uint16_t H8 __attribute__((vector_size(16)));
typedef double D4 __attribute__((vector_size(32)));

// The block size of a whole block, as a type (so a full block's loads and
// stores compile to plain vector moves); a partial block passes an int64_t.
using FullBlock = std::integral_constant<int64_t, kLanes>;

inline F8 Splat(float v) { return F8{v, v, v, v, v, v, v, v}; }

// Index maps of a row: unit and zero strides are compile-time so that row
// loops on them vectorize; anything else is a runtime stride.
struct UnitStride {
  int64_t operator()(int64_t j) const { return j; }
};
struct ZeroStride {
  int64_t operator()(int64_t) const { return 0; }
};
struct AnyStride {
  int64_t s;
  int64_t operator()(int64_t j) const { return j * s; }
};

// ---- 8 consecutive elements ----
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 LoadUnit(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 LoadUnit(const bf16* p) {
  H8 h;
  std::memcpy(&h, p, sizeof(h));
  const U8 bits = __builtin_convertvector(h, U8) << 16;
  F8 v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 LoadUnit(const f16* p) {
#if defined(__F16C__)
  const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  F8 v;
  std::memcpy(&v, &f, sizeof(v));
  return v;
#else
  float buf[kLanes];
  for (int k = 0; k < kLanes; ++k) buf[k] = ToFloat(p[k]);
  F8 v;
  std::memcpy(&v, buf, sizeof(v));
  return v;
#endif
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreUnit(float* p, F8 v) {
  std::memcpy(p, &v, sizeof(v));
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreUnit(bf16* p, F8 v) {  // FloatToBf16, lane by lane
  U8 u;
  std::memcpy(&u, &v, sizeof(u));
  const U8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U8 quiet_nan = (u >> 16) | 0x40u;
  const U8 r = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
  const H8 h = __builtin_convertvector(r, H8);
  std::memcpy(p, &h, sizeof(h));
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreUnit(f16* p, F8 v) {
#if defined(__F16C__)
  __m256 f;
  std::memcpy(&f, &v, sizeof(f));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  float buf[kLanes];
  std::memcpy(buf, &v, sizeof(buf));
  for (int k = 0; k < kLanes; ++k) p[k] = FromFloat<f16>(buf[k]);
#endif
}

// ---- Strided blocks of m <= 8 elements ----
// p[s(0)] .. p[s(m - 1)] as floats; lanes m.. are 0 (a zero stride repeats p[0]).
template <typename T, typename S, typename M>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Load(const T* p, S s, M m) {
  if constexpr (std::is_same_v<S, ZeroStride>) {
    return Splat(ToFloat(*p));
  } else if constexpr (std::is_same_v<S, UnitStride> && std::is_same_v<M, FullBlock>) {
    return LoadUnit(p);
  } else {
    float buf[kLanes] = {};
    for (int64_t k = 0; k < m; ++k) buf[k] = ToFloat(p[s(k)]);
    F8 v;
    std::memcpy(&v, buf, sizeof(v));
    return v;
  }
}

// Lanes 0..m-1 of v to p[s(0)] .. p[s(m - 1)].
template <typename T, typename S, typename M>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Store(T* p, S s, M m, F8 v) {
  if constexpr (std::is_same_v<S, UnitStride> && std::is_same_v<M, FullBlock>) {
    StoreUnit(p, v);
  } else {
    float buf[kLanes];
    std::memcpy(buf, &v, sizeof(buf));
    for (int64_t k = 0; k < m; ++k) p[s(k)] = FromFloat<T>(buf[k]);
  }
}

// The low and high 4 lanes of v as doubles.
inline D4 LowHalf(F8 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), D4);
}
inline D4 HighHalf(F8 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), D4);
}

// ---- Math ----
// e^x (Cephes expf polynomial, ~2 ulp): 0 below -87, +inf above 88, NaN stays NaN.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Exp(F8 x) {
  F8 c = x < -87.0f ? Splat(-87.0f) : x;
  c = c > 88.0f ? Splat(88.0f) : c;
  const F8 t = c * 1.44269504088896341f;
  const I8 ni = __builtin_convertvector(t + (t < 0.0f ? Splat(-0.5f) : Splat(0.5f)), I8);
  const F8 n = __builtin_convertvector(ni, F8);
  F8 r = c - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  F8 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const U8 bits = (__builtin_convertvector(ni, U8) + 127u) << 23;
  F8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x > 88.0f ? Splat(__builtin_inff()) : p * scale;
}

}  // namespace vec
}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_VEC8_H_
