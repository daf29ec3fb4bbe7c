// 8-wide float vectors and row helpers shared by the nn kernels (softmax, norm,
// embedding, loss, dropout): loads and stores that convert bf16 / f16 rows to
// float, a vectorized exp, and row reductions in a fixed order.
//
// The vectors are GCC/Clang vector extensions, so the hot loops compile to
// AVX2 (-march=x86-64-v3) without relying on the auto-vectorizer's cost model
// (which at -O2 skips loops that need a tail) and fall back to plain code on
// other targets. Every loop runs full vectors and then one padded tail vector,
// so results depend only on the row length: never on threads or alignment.
#ifndef TENSOR_CPU_NN_SIMD_H_
#define TENSOR_CPU_NN_SIMD_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "tensor/dtype.h"

namespace tensor {
namespace cpu {
namespace simd {

inline constexpr int64_t kW = 8;  // floats per vector

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef uint16_t H8 __attribute__((vector_size(16)));

inline F8 Splat(float s) { return F8{s, s, s, s, s, s, s, s}; }
inline F8 Load(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, F8 v) { std::memcpy(p, &v, sizeof(v)); }
// The first k (< kW) elements at p; the other lanes are `fill`.
inline F8 LoadN(const float* p, int64_t k, float fill) {
  float buf[kW];
  for (int64_t j = 0; j < kW; ++j) buf[j] = j < k ? p[j] : fill;
  return Load(buf);
}
inline void StoreN(float* p, F8 v, int64_t k) {
  float buf[kW];
  Store(buf, v);
  for (int64_t j = 0; j < k; ++j) p[j] = buf[j];
}
// Full vector when k is the compile-time kW (the hot loop), padded otherwise.
template <typename K>
inline F8 LoadK(const float* p, K k, float fill = 0.0f) {
  if constexpr (std::is_same_v<K, std::integral_constant<int64_t, kW>>) {
    return Load(p);
  } else {
    return k == kW ? Load(p) : LoadN(p, k, fill);
  }
}
template <typename K>
inline void StoreK(float* p, F8 v, K k) {
  if constexpr (std::is_same_v<K, std::integral_constant<int64_t, kW>>) {
    Store(p, v);
  } else {
    StoreN(p, v, k);
  }
}

// Calls f(i, k) for i = 0, kW, 2 kW, ... with k = min(kW, n - i): full blocks get
// k as std::integral_constant<int64_t, kW> (so LoadK/StoreK compile to plain
// vector moves), the one partial block at the end an int64_t.
template <typename F>
inline void ForEachBlock(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) f(i, std::integral_constant<int64_t, kW>{});
  if (i < n) f(i, n - i);
}

// a > b ? a : b and a < b ? a : b per lane (so a NaN in b passes through): the
// semantics of vmaxps / vminps, which GCC does not pick for the ternary itself.
inline F8 Max(F8 a, F8 b) {
#if defined(__AVX__)
  return (F8)_mm256_max_ps((__m256)a, (__m256)b);
#else
  return a > b ? a : b;
#endif
}
inline F8 Min(F8 a, F8 b) {
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
  for (int j = 1; j < kW; ++j) m = v[j] > m ? v[j] : m;
  return m;
}

// exp(x) per lane (Cephes expf: range reduction by ln 2 and a degree-6
// polynomial, about 1 ulp). Exactly 0 below -87.33 (and for -inf); saturates at
// exp(88) above 88; NaN stays NaN.
inline F8 Exp(F8 x) {
  const I8 underflow = x < Splat(-87.33654f);  // zeroed at the end
  x = Max(Splat(-88.0f), Min(Splat(88.0f), x));  // NaN passes through
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (exact under round-to-nearest).
  const F8 magic = Splat(12582912.0f);
  const F8 n = (x * Splat(1.44269504088896341f) + magic) - magic;
  const F8 r = (x - n * Splat(0.693359375f)) + n * Splat(2.12194440e-4f);
  F8 p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * (r * r) + r + Splat(1.0f);
  // 2^n through the exponent bits: n is in [-127, 127] after the clamps (and
  // >= -126 in every lane that is not zeroed), so the biased exponent is >= 0.
  const I8 ni = __builtin_convertvector(n, I8);
  const F8 pow2n = (F8)((U8)(ni + 127) << 23);
  const F8 result = p * pow2n;
  return underflow ? Splat(0.0f) : result;
}

// ---- Rows of any floating element type as float ----

// Converts 8 elements of T at p to float (k < 8: the first k, the rest `fill`).
template <typename T, typename K>
inline F8 LoadAs(const T* p, K k, float fill = 0.0f) {
  if constexpr (std::is_same_v<T, float>) {
    return LoadK(p, k, fill);
  } else {
    H8 h;
    if constexpr (std::is_same_v<K, std::integral_constant<int64_t, kW>>) {
      std::memcpy(&h, p, sizeof(h));
    } else {
      uint16_t buf[kW] = {};
      std::memcpy(buf, p, k * sizeof(uint16_t));
      std::memcpy(&h, buf, sizeof(h));
    }
    F8 v;
    if constexpr (std::is_same_v<T, bf16>) {
      v = (F8)(__builtin_convertvector(h, U8) << 16);
    } else {
#if defined(__F16C__)
      __m128i hi;
      std::memcpy(&hi, &h, sizeof(hi));
      v = (F8)_mm256_cvtph_ps(hi);
#else
      for (int j = 0; j < kW; ++j) v[j] = F16ToFloat(f16{h[j]});
#endif
    }
    if constexpr (!std::is_same_v<K, std::integral_constant<int64_t, kW>>) {
      for (int64_t j = k; j < kW; ++j) v[j] = fill;
    }
    return v;
  }
}

// Converts a vector to T (round to nearest even, as FromFloat<T>) and stores k lanes.
template <typename T, typename K>
inline void StoreAs(T* p, F8 v, K k) {
  if constexpr (std::is_same_v<T, float>) {
    StoreK(p, v, k);
  } else {
    H8 h;
    if constexpr (std::is_same_v<T, bf16>) {
      const U8 u = (U8)v;
      const U8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      const U8 quiet_nan = (u >> 16) | 0x40u;
      const U8 bits = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
      h = __builtin_convertvector(bits, H8);
    } else {
#if defined(__F16C__)
      const __m128i hi = _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT);
      std::memcpy(&h, &hi, sizeof(h));
#else
      for (int j = 0; j < kW; ++j) h[j] = FloatToF16(v[j]).bits;
#endif
    }
    if constexpr (std::is_same_v<K, std::integral_constant<int64_t, kW>>) {
      std::memcpy(p, &h, sizeof(h));
    } else {
      uint16_t buf[kW];
      std::memcpy(buf, &h, sizeof(h));
      std::memcpy(p, buf, k * sizeof(uint16_t));
    }
  }
}

// Copies n elements of T into dst as float.
template <typename T>
inline void LoadRow(const T* src, float* dst, int64_t n) {
  ForEachBlock(n, [&](int64_t i, auto k) { StoreK(dst + i, LoadAs(src + i, k), k); });
}
// Stores n floats as T.
template <typename T>
inline void StoreRow(const float* src, T* dst, int64_t n) {
  ForEachBlock(n, [&](int64_t i, auto k) { StoreAs(dst + i, LoadK(src + i, k), k); });
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
  ForEachBlock(n, [&](int64_t i, auto k) { acc += LoadK(a + i, k) * LoadK(b + i, k); });
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
    if constexpr (!std::is_same_v<T, float>) StoreK(scratch + i, x, k);
    F8 v = x * s;
    if constexpr (std::is_same_v<decltype(k), int64_t>) {
      for (int64_t j = k; j < kW; ++j) v[j] = ninf;  // padding never wins
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
    if constexpr (!std::is_same_v<T, float>) StoreK(scratch + i, x, k);
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
    F8 e = Exp(LoadK(x + i, k) * s - b);
    if constexpr (std::is_same_v<decltype(k), int64_t>) {
      for (int64_t j = k; j < kW; ++j) e[j] = 0.0f;
    }
    StoreK(y + i, e, k);
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
    F8 e = Exp(LoadK(x + i, k) * s - b);
    if constexpr (std::is_same_v<decltype(k), int64_t>) {
      for (int64_t j = k; j < kW; ++j) e[j] = 0.0f;
    }
    acc += e;
  });
  return HSum(acc);
}

// dst[i] = T(src[i] * s); dst may be src (float).
template <typename T>
inline void StoreRowScaled(const float* src, float s, T* dst, int64_t n) {
  const F8 v = Splat(s);
  ForEachBlock(n, [&](int64_t i, auto k) { StoreAs(dst + i, LoadK(src + i, k) * v, k); });
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

}  // namespace simd
}  // namespace cpu
}  // namespace tensor

#endif  // TENSOR_CPU_NN_SIMD_H_
