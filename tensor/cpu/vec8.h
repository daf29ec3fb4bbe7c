// Blocks of 8 floats for the CPU kernels (elementwise, reductions, softmax,
// norms, embedding, loss, dropout): GCC/Clang vector extension types (AVX2 at
// -march=x86-64-v3, plain code on other targets); loads and stores that
// convert f32 / bf16 / f16 to and from float, for whole blocks, a block's
// first k elements, or any stride; a vector exp; and float rows reduced in a
// fixed order.
//
// The hot loops are written on these vectors instead of being left to the
// auto-vectorizer, whose -O2 cost model skips loops that need a tail or alias
// checks. bf16 and f16 convert exactly as ToFloat / FromFloat<T> do (round to
// nearest even, NaN kept quiet), eight at a time. Row loops run whole blocks
// and then one padded tail block, so results depend only on the row length:
// never on threads or alignment. Private to tensor/cpu and tensor/ops.
#ifndef TENSOR_CPU_VEC8_H_
#define TENSOR_CPU_VEC8_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "absl/base/attributes.h"
#include "tensor/dtype.h"

namespace tensor {
namespace cpu {
namespace vec {

inline constexpr int64_t kLanes = 8;  // floats per vector

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef uint16_t H8 __attribute__((vector_size(16)));
typedef double D4 __attribute__((vector_size(32)));

// The size of a whole block, as a type (so a whole block's loads and stores
// compile to plain vector moves); a partial block passes an int64_t k < 8.
using FullBlock = std::integral_constant<int64_t, kLanes>;
template <typename K>
inline constexpr bool kIsFullBlock = std::is_same_v<K, FullBlock>;

inline F8 Splat(float v) { return F8{v, v, v, v, v, v, v, v}; }

// Calls f(i, k) for i = 0, 8, 16, ... with k = min(8, n - i): whole blocks get
// k as FullBlock, the one partial block at the end an int64_t.
template <typename F>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void ForEachBlock(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, FullBlock{});
  if (i < n) f(i, n - i);
}

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

// The 16-bit patterns of v converted to T (bf16 or f16), as FromFloat<T> does.
template <typename T>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline H8 ToHalfBits(F8 v) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  H8 h;
  if constexpr (std::is_same_v<T, bf16>) {  // FloatToBf16, lane by lane
    U8 u;
    std::memcpy(&u, &v, sizeof(u));
    const U8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U8 quiet_nan = (u >> 16) | 0x40u;
    const U8 r = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    h = __builtin_convertvector(r, H8);
  } else {
#if defined(__F16C__)
    __m256 f;
    std::memcpy(&f, &v, sizeof(f));
    const __m128i hi = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    std::memcpy(&h, &hi, sizeof(h));
#else
    float buf[kLanes];
    std::memcpy(buf, &v, sizeof(buf));
    for (int k = 0; k < kLanes; ++k) h[k] = FromFloat<f16>(buf[k]).bits;
#endif
  }
  return h;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreUnit(float* p, F8 v) {
  std::memcpy(p, &v, sizeof(v));
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreUnit(bf16* p, F8 v) {
  const H8 h = ToHalfBits<bf16>(v);
  std::memcpy(p, &h, sizeof(h));
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreUnit(f16* p, F8 v) {
  const H8 h = ToHalfBits<f16>(v);
  std::memcpy(p, &h, sizeof(h));
}

// ---- The first k of 8 consecutive elements (k = FullBlock: all 8) ----
// Partial blocks of floats use AVX2 masked loads and stores (no store-to-load
// forwarding stall through a buffer, nothing touched past p[k - 1]); 16-bit
// types go through a small buffer.

// Lanes 0 .. k - 1 set (k <= 8).
ABSL_ATTRIBUTE_ALWAYS_INLINE inline I8 FirstLanes(int64_t k) {
  return I8{0, 1, 2, 3, 4, 5, 6, 7} < static_cast<int32_t>(k);
}

// p[0] .. p[k - 1] as floats; lanes k.. hold `fill`.
template <typename T, typename K>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 LoadAs(const T* p, K k, float fill = 0.0f) {
  if constexpr (kIsFullBlock<K>) {
    return LoadUnit(p);
  } else {
    const I8 mask = FirstLanes(k);
    F8 v;
    if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX2__)
      v = (F8)_mm256_maskload_ps(p, (__m256i)mask);
#else
      float buf[kLanes] = {};
      for (int64_t j = 0; j < k; ++j) buf[j] = p[j];
      v = LoadUnit(buf);
#endif
    } else {
      T buf[kLanes] = {};
      std::memcpy(buf, p, k * sizeof(T));
      v = LoadUnit(buf);
    }
    return mask ? v : Splat(fill);
  }
}

// Lanes 0 .. k - 1 of v to p[0] .. p[k - 1] as T (rounded as FromFloat<T>).
template <typename T, typename K>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void StoreAs(T* p, F8 v, K k) {
  if constexpr (kIsFullBlock<K>) {
    StoreUnit(p, v);
  } else if constexpr (std::is_same_v<T, float>) {
#if defined(__AVX2__)
    _mm256_maskstore_ps(p, (__m256i)FirstLanes(k), (__m256)v);
#else
    for (int64_t j = 0; j < k; ++j) p[j] = v[j];
#endif
  } else {
    const H8 h = ToHalfBits<T>(v);
    std::memcpy(p, &h, k * sizeof(T));
  }
}

// ---- Strided blocks of m <= 8 elements ----
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

// p[s(0)] .. p[s(m - 1)] as floats; lanes m.. are 0 (a zero stride repeats p[0]).
template <typename T, typename S, typename M>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Load(const T* p, S s, M m) {
  if constexpr (std::is_same_v<S, ZeroStride>) {
    return Splat(ToFloat(*p));
  } else if constexpr (std::is_same_v<S, UnitStride>) {
    return LoadAs(p, m);
  } else {
    float buf[kLanes] = {};
    for (int64_t k = 0; k < m; ++k) buf[k] = ToFloat(p[s(k)]);
    return LoadUnit(buf);
  }
}

// Lanes 0..m-1 of v to p[s(0)] .. p[s(m - 1)].
template <typename T, typename S, typename M>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void Store(T* p, S s, M m, F8 v) {
  if constexpr (std::is_same_v<S, UnitStride>) {
    StoreAs(p, v, m);
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
// a > b ? a : b and a < b ? a : b per lane (so a NaN in b passes through): the
// semantics of vmaxps / vminps, which GCC does not pick for the ternary itself.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Max(F8 a, F8 b) {
#if defined(__AVX__)
  return (F8)_mm256_max_ps((__m256)a, (__m256)b);
#else
  return a > b ? a : b;
#endif
}
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Min(F8 a, F8 b) {
#if defined(__AVX__)
  return (F8)_mm256_min_ps((__m256)a, (__m256)b);
#else
  return a < b ? a : b;
#endif
}

// Horizontal reductions in a fixed order.
inline float HSum(F8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
inline float HMax(F8 v) {
  float m = v[0];
  for (int j = 1; j < kLanes; ++j) m = v[j] > m ? v[j] : m;
  return m;
}

// e^x per lane (Cephes expf: range reduction by ln 2 and a degree-6
// polynomial, at most ~1 ulp). Exactly 0 below -87.33654 (~ ln(FLT_MIN)) and
// for -inf: no subnormal results. +inf for x >= ~88.3763 (where round(x / ln 2)
// reaches 128) and for +inf: e^x in (2.4e38, FLT_MAX] near the top of the float
// range comes out as +inf too, which saves the ops of a two-step 2^n in this
// hot loop (softmax and cross-entropy only take x <= 0). NaN stays NaN.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Exp(F8 x) {
  const I8 underflow = x < Splat(-87.33654f);  // these lanes are zeroed at the end
  // Clamped so that the exponent arithmetic below stays in range; NaN passes through.
  const F8 c = Max(Splat(-88.0f), Min(Splat(88.72284f), x));
  // n = round(c / ln 2) by the 1.5 * 2^23 trick (exact under round-to-nearest).
  const F8 magic = Splat(12582912.0f);
  const F8 n = (c * Splat(1.44269504088896341f) + magic) - magic;
  const F8 r = (c - n * Splat(0.693359375f)) + n * Splat(2.12194440e-4f);
  F8 p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * (r * r) + r + Splat(1.0f);
  // 2^n through the exponent bits: n is in [-127, 128] after the clamps; 128
  // gives the bits of +inf, -127 gives 0 (those lanes are zeroed anyway).
  const I8 ni = __builtin_convertvector(n, I8);
  const F8 result = p * (F8)((U8)(ni + 127) << 23);
  return underflow ? Splat(0.0f) : result;
}

// ---- Rows of any floating element type as float ----

// Copies n elements of T into dst as float.
template <typename T>
inline void LoadRow(const T* src, float* dst, int64_t n) {
  ForEachBlock(n, [&](int64_t i, auto k) { StoreAs(dst + i, LoadAs(src + i, k), k); });
}
// Stores n floats as T.
template <typename T>
inline void StoreRow(const float* src, T* dst, int64_t n) {
  ForEachBlock(n, [&](int64_t i, auto k) { StoreAs(dst + i, LoadAs(src + i, k), k); });
}
// The row as float: src itself for float, else converted into scratch (n floats).
template <typename T>
inline const float* RowAsFloat(const T* src, int64_t n, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    LoadRow(src, scratch, n);
    return scratch;
  }
}
// Where a kernel keeps a float row bound for dst: dst itself for float, else
// scratch (to be stored with StoreRow / StoreRowScaled).
template <typename T>
inline float* OutRowAsFloat(T* dst, float* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return dst;
  } else {
    return scratch;
  }
}

// ---- Row reductions (fixed order for a given n) ----

inline float RowDot(const float* a, const float* b, int64_t n) {
  F8 acc = Splat(0.0f);
  ForEachBlock(n, [&](int64_t i, auto k) { acc += LoadAs(a + i, k) * LoadAs(b + i, k); });
  return HSum(acc);
}
// The row as float (src itself for float, else converted into scratch, n
// floats) and, in the same pass, max over i of scale * src[i] (-inf for n == 0;
// a NaN element may or may not win).
template <typename T>
inline const float* RowAsFloatScaledMax(const T* src, int64_t n, float* scratch, float scale,
                                        float* max) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const F8 s = Splat(scale);
  F8 acc = Splat(ninf);
  ForEachBlock(n, [&](int64_t i, auto k) {
    const F8 x = LoadAs(src + i, k);
    if constexpr (!std::is_same_v<T, float>) StoreAs(scratch + i, x, k);
    F8 v = x * s;
    if constexpr (!kIsFullBlock<decltype(k)>) {
      for (int64_t j = k; j < kLanes; ++j) v[j] = ninf;  // padding never wins
    }
    acc = Max(acc, v);
  });
  *max = HMax(acc);
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    return scratch;
  }
}

// The row as float (as above) and the sum of its elements, in one pass.
template <typename T>
inline const float* RowAsFloatSum(const T* src, int64_t n, float* scratch, float* sum) {
  F8 acc = Splat(0.0f);
  ForEachBlock(n, [&](int64_t i, auto k) {
    const F8 x = LoadAs(src + i, k);
    if constexpr (!std::is_same_v<T, float>) StoreAs(scratch + i, x, k);
    acc += x;
  });
  *sum = HSum(acc);
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    return scratch;
  }
}

// y[i] = exp(scale * x[i] - shift) for i < n; returns the sum of the y[i].
// y may alias x.
inline float RowExpSum(const float* x, float scale, float shift, float* y, int64_t n) {
  const F8 s = Splat(scale);
  const F8 b = Splat(shift);
  F8 acc = Splat(0.0f);
  ForEachBlock(n, [&](int64_t i, auto k) {
    F8 e = Exp(LoadAs(x + i, k) * s - b);
    if constexpr (!kIsFullBlock<decltype(k)>) {
      for (int64_t j = k; j < kLanes; ++j) e[j] = 0.0f;
    }
    StoreAs(y + i, e, k);
    acc += e;
  });
  return HSum(acc);
}

// The sum of exp(scale * x[i] - shift) for i < n, without storing the terms.
inline float RowExpSumOnly(const float* x, float scale, float shift, int64_t n) {
  const F8 s = Splat(scale);
  const F8 b = Splat(shift);
  F8 acc = Splat(0.0f);
  ForEachBlock(n, [&](int64_t i, auto k) {
    F8 e = Exp(LoadAs(x + i, k) * s - b);
    if constexpr (!kIsFullBlock<decltype(k)>) {
      for (int64_t j = k; j < kLanes; ++j) e[j] = 0.0f;
    }
    acc += e;
  });
  return HSum(acc);
}

// dst[i] = T(src[i] * s); dst may be src (float).
template <typename T>
inline void StoreRowScaled(const float* src, float s, T* dst, int64_t n) {
  const F8 v = Splat(s);
  ForEachBlock(n, [&](int64_t i, auto k) { StoreAs(dst + i, LoadAs(src + i, k) * v, k); });
}

// n elements of T set to zero (T's zero is all-zero bits for every floating type).
template <typename T>
inline void ZeroRow(T* dst, int64_t n) {
  if (n > 0) std::memset(dst, 0, n * sizeof(T));
}

// Rows per ParallelFor chunk so that a chunk holds about `elements` elements.
inline int64_t RowGrain(int64_t row_len, int64_t elements = 32768) {
  return row_len <= 0 ? 1024 : (elements + row_len - 1) / row_len;
}

}  // namespace vec
}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_VEC8_H_
