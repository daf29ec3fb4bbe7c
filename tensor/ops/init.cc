// Initialization kernels: a strided walk over a tensor's elements in row-major
// order, split into chunks across the thread pool, writing either a constant or
// a function of each element's Philox counter.
#include "tensor/ops/init.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda_backend.h"
#include "tensor/ops/check.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace {

constexpr int64_t kFillGrain = 1 << 16;
// Zero fills of tensors at least this large use non-temporal stores
// (ZeroStreaming); smaller ones are likely read again soon, from the cache.
constexpr int64_t kStreamingZeroBytes = int64_t{1} << 20;
constexpr int64_t kRandomGrain = 1 << 12;  // a Philox draw per element
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kSqrt2Pi = 2.50662827463100050242;

// Zeroes `bytes` bytes at p with non-temporal stores for the 32-byte aligned
// middle: a large fill (zeroing gradients, which the optimizer just read)
// then writes without first reading each cache line in. Ordered before the
// chunk's completion by the fence. Without AVX2: memset.
void ZeroStreaming(void* p, int64_t bytes) {
#ifndef __AVX2__
  std::memset(p, 0, bytes);
#else
  char* c = static_cast<char*>(p);
  const int64_t head = std::min<int64_t>(bytes, (32 - reinterpret_cast<uintptr_t>(c) % 32) % 32);
  std::memset(c, 0, head);
  c += head;
  bytes -= head;
  const __m256i zero = _mm256_setzero_si256();
  const int64_t body = bytes / 32 * 32;
  for (int64_t i = 0; i < body; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(c + i), zero);
  }
  std::memset(c + body, 0, bytes - body);
  _mm_sfence();
#endif
}

template <typename T>
T FromDouble(double v) {
  if constexpr (std::is_integral_v<T>) {
    return SaturatingCast<T>(v);
  } else {
    return FromFloat<T>(static_cast<float>(v));
  }
}

// Calls fn(T*) with the C++ type of any dtype (a null pointer of that type).
template <typename Fn>
void DispatchAny(Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kF32:
      return fn(static_cast<float*>(nullptr));
    case Dtype::kF16:
      return fn(static_cast<f16*>(nullptr));
    case Dtype::kBF16:
      return fn(static_cast<bf16*>(nullptr));
    case Dtype::kI32:
      return fn(static_cast<int32_t*>(nullptr));
    case Dtype::kI64:
      return fn(static_cast<int64_t*>(nullptr));
    case Dtype::kU8:
      return fn(static_cast<uint8_t*>(nullptr));
  }
}

// Calls run(p, stride, first, n) for runs of n elements of t along its last
// dim: p points at the first, consecutive elements are `stride` apart, and
// `first` is the row-major index of the first element. Runs are chunks of
// [0, numel) spread over the thread pool.
template <typename T, typename RunFn>
void ParallelRuns(const Tensor& t, int64_t grain, const RunFn& run) {
  T* base = static_cast<T*>(t.raw_data());
  if (t.is_contiguous()) {
    ParallelFor(t.numel(), grain, [&](int64_t b, int64_t e) { run(base + b, 1, b, e - b); });
    return;
  }
  const int rank = t.rank();
  const int64_t inner = t.dim(-1);
  const int64_t inner_stride = t.strides()[rank - 1];
  ParallelFor(t.numel(), grain, [&](int64_t b, int64_t e) {
    int64_t i = b;
    while (i < e) {
      int64_t rest = i / inner;
      const int64_t col = i % inner;
      const int64_t n = std::min(inner - col, e - i);
      int64_t offset = col * inner_stride;
      for (int d = rank - 2; d >= 0; --d) {
        offset += (rest % t.dim(d)) * t.strides()[d];
        rest /= t.dim(d);
      }
      run(base + offset, inner_stride, i, n);
      i += n;
    }
  });
}

// Writes value(counter) to each element, element i using counter base + i.
template <typename ValueFn>
void FillRandom(const char* op, const Tensor& t, Generator& gen, const ValueFn& value) {
  CheckCpu(op, {&t});
  CheckFloating(op, t);
  const uint64_t base = gen.Reserve(static_cast<uint64_t>(t.numel()));
  DispatchFloating(op, t.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ParallelRuns<T>(t, kRandomGrain, [&](T* p, int64_t stride, int64_t first, int64_t n) {
      for (int64_t j = 0; j < n; ++j) {
        p[j * stride] = FromFloat<T>(value(base + static_cast<uint64_t>(first + j)));
      }
    });
  });
}

// Standard normal CDF, accurate in the lower tail.
double NormalCdf(double x) { return 0.5 * std::erfc(-x * kSqrtHalf); }

// Inverse of NormalCdf for p in (0, 1): Acklam's rational approximation
// (relative error 1.2e-9) and one Halley step, which brings it to about
// double precision.
double NormalQuantile(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  double x;
  if (p < kLow) {
    const double q = std::sqrt(-2.0 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  } else if (p <= 1.0 - kLow) {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  } else {
    const double q = std::sqrt(-2.0 * std::log1p(-p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  }
  // Halley refinement: e = Phi(x) - p, u = e / phi(x).
  const double e = NormalCdf(x) - p;
  const double u = e * kSqrt2Pi * std::exp(0.5 * x * x);
  return std::isfinite(u) ? x - u / (1.0 + 0.5 * x * u) : x;
}

// A uniform double in the open interval (0, 1) from the 53 top bits of two words.
inline double OpenUniform(const std::array<uint32_t, 4>& w) {
  const uint64_t bits = (static_cast<uint64_t>(w[0]) << 21) | (w[1] >> 11);
  return (static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace

void Fill(const Tensor& t, double value) {
  if (t.device().is_cuda()) {
    OP_CHECK(t.is_contiguous(), "fill", "a CUDA tensor must be contiguous here");
    DispatchAny(t.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T v = FromDouble<T>(value);
      cuda::FillOnDevice(t.raw_data(), t.numel(), &v, sizeof(T), t.device().index);
    });
    return;
  }
  CheckCpu("fill", {&t});
  DispatchAny(t.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T v = FromDouble<T>(value);
    T zero{};
    const bool stream_zeros =
        std::memcmp(&v, &zero, sizeof(T)) == 0 && t.nbytes() >= kStreamingZeroBytes;
    ParallelRuns<T>(t, kFillGrain, [&](T* p, int64_t stride, int64_t, int64_t n) {
      if (stride == 1 && stream_zeros) {
        ZeroStreaming(p, n * static_cast<int64_t>(sizeof(T)));
      } else if (stride == 1) {
        std::fill(p, p + n, v);
      } else {
        for (int64_t j = 0; j < n; ++j) p[j * stride] = v;
      }
    });
  });
}

void Zero(const Tensor& t) { Fill(t, 0.0); }

void UniformInit(const Tensor& t, Generator& gen, double lo, double hi) {
  OP_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "uniform_init",
           "bounds must be finite with lo <= hi, got lo ", lo, " and hi ", hi, " for tensor ",
           t.shape().ToString());
  const float flo = static_cast<float>(lo);
  const float width = static_cast<float>(hi - lo);
  FillRandom("uniform_init", t, gen, [&](uint64_t c) { return flo + width * gen.Uniform(c); });
}

void NormalInit(const Tensor& t, Generator& gen, double mean, double std) {
  OP_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal_init",
           "mean must be finite and std finite and >= 0, got mean ", mean, " and std ", std,
           " for tensor ", t.shape().ToString());
  const float fmean = static_cast<float>(mean);
  const float fstd = static_cast<float>(std);
  FillRandom("normal_init", t, gen, [&](uint64_t c) { return fmean + fstd * gen.Normal(c); });
}

Tensor Arange(int64_t n, Dtype dtype, Device device) {
  OP_CHECK(n >= 0, "arange", "n must be >= 0, got ", n);
  OP_CHECK(dtype == Dtype::kI32 || dtype == Dtype::kI64, "arange", "dtype must be i32 or i64, not ",
           DtypeName(dtype));
  // Values 0 .. n-1 must fit the dtype (checked before anything is allocated).
  OP_CHECK(dtype != Dtype::kI32 || n <= int64_t{std::numeric_limits<int32_t>::max()} + 1,
           "arange", "n = ", n, " does not fit i32 (its last value would be ", n - 1,
           "); use i64");
  Tensor t = Tensor::Empty({n}, dtype, device);
  if (device.is_cuda()) {
    cuda::IotaOnDevice(t.raw_data(), dtype, n, device.index);
  } else if (dtype == Dtype::kI32) {
    std::iota(t.data<int32_t>(), t.data<int32_t>() + n, 0);
  } else {
    std::iota(t.data<int64_t>(), t.data<int64_t>() + n, int64_t{0});
  }
  return t;
}

void TruncatedNormalInit(const Tensor& t, Generator& gen, double mean, double std, double a,
                         double b) {
  OP_CHECK(std::isfinite(mean) && std::isfinite(std) && std > 0 && a < b, "truncated_normal_init",
           "need finite mean, finite std > 0 and a < b, got mean ", mean, ", std ", std, ", [", a,
           ", ", b, "] for tensor ", t.shape().ToString());
  // Sample the standard normal truncated to [alpha, beta]. An interval in the
  // upper half is mirrored to the lower one, where the CDF has full precision.
  double alpha = (a - mean) / std;
  double beta = (b - mean) / std;
  const bool mirror = alpha > 0;
  if (mirror) {
    std::swap(alpha, beta);
    alpha = -alpha;
    beta = -beta;
  }
  const double cdf_lo = NormalCdf(alpha);
  const double cdf_width = NormalCdf(beta) - cdf_lo;
  FillRandom("truncated_normal_init", t, gen, [&](uint64_t c) {
    const double p = cdf_lo + cdf_width * OpenUniform(gen.Bits(c));
    double z = NormalQuantile(std::min(std::max(p, 1e-300), 1.0 - 1e-16));
    if (mirror) z = -z;
    return static_cast<float>(std::min(std::max(mean + std * z, a), b));
  });
}

}  // namespace tensor
