// Elementwise reductions over several host buffers, blocked so that the
// accumulator stays in L1 and each input streams through once.
#include "dist/cpu_reduce.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "glog/logging.h"

namespace dist {
namespace internal {
namespace {

using tensor::bf16;
using tensor::Dtype;
using tensor::f16;

// Accumulator type: f32 for the floating types, int64 for the integers.
template <typename T>
using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, float>;

template <typename T>
inline Acc<T> Load(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return tensor::ToFloat(v);
  }
}

template <typename T>
inline T Store(Acc<T> v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);  // Wraps (two's complement) for sums that overflow.
  } else {
    return tensor::FromFloat<T>(v);
  }
}

struct SumOp {
  static float Combine(float a, float b) { return a + b; }
  static int64_t Combine(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};
struct MaxOp {
  static float Combine(float a, float b) { return (b > a || std::isnan(b)) ? b : a; }
  static int64_t Combine(int64_t a, int64_t b) { return std::max(a, b); }
};
struct MinOp {
  static float Combine(float a, float b) { return (b < a || std::isnan(b)) ? b : a; }
  static int64_t Combine(int64_t a, int64_t b) { return std::min(a, b); }
};

template <typename T, typename Op>
void ReduceTyped(absl::Span<const void* const> inputs, absl::Span<void* const> outputs,
                 int64_t count, bool average) {
  constexpr int64_t kBlock = 1024;
  Acc<T> acc[kBlock];
  const size_t n = inputs.size();
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t len = std::min(kBlock, count - begin);
    const T* first = static_cast<const T*>(inputs[0]) + begin;
    for (int64_t i = 0; i < len; ++i) acc[i] = Load(first[i]);
    for (size_t j = 1; j < n; ++j) {
      const T* in = static_cast<const T*>(inputs[j]) + begin;
      for (int64_t i = 0; i < len; ++i) acc[i] = Op::Combine(acc[i], Load(in[i]));
    }
    if constexpr (!std::is_integral_v<T>) {
      if (average) {
        const float divisor = static_cast<float>(n);
        for (int64_t i = 0; i < len; ++i) acc[i] /= divisor;
      }
    }
    for (void* out_ptr : outputs) {
      T* out = static_cast<T*>(out_ptr) + begin;
      for (int64_t i = 0; i < len; ++i) out[i] = Store<T>(acc[i]);
    }
  }
}

template <typename T>
void ReduceWithOp(ReduceOp op, absl::Span<const void* const> inputs,
                  absl::Span<void* const> outputs, int64_t count) {
  switch (op) {
    case ReduceOp::kSum:
      return ReduceTyped<T, SumOp>(inputs, outputs, count, false);
    case ReduceOp::kAvg:
      CHECK(!std::is_integral_v<T>) << "avg needs a floating-point dtype";
      return ReduceTyped<T, SumOp>(inputs, outputs, count, true);
    case ReduceOp::kMax:
      return ReduceTyped<T, MaxOp>(inputs, outputs, count, false);
    case ReduceOp::kMin:
      return ReduceTyped<T, MinOp>(inputs, outputs, count, false);
  }
}

}  // namespace

void ReduceBuffers(Dtype dtype, ReduceOp op, absl::Span<const void* const> inputs,
                   absl::Span<void* const> outputs, int64_t count) {
  CHECK(!inputs.empty());
  if (count <= 0) return;
  switch (dtype) {
    case Dtype::kF32:
      return ReduceWithOp<float>(op, inputs, outputs, count);
    case Dtype::kF16:
      return ReduceWithOp<f16>(op, inputs, outputs, count);
    case Dtype::kBF16:
      return ReduceWithOp<bf16>(op, inputs, outputs, count);
    case Dtype::kI32:
      return ReduceWithOp<int32_t>(op, inputs, outputs, count);
    case Dtype::kI64:
      return ReduceWithOp<int64_t>(op, inputs, outputs, count);
    case Dtype::kU8:
      return ReduceWithOp<uint8_t>(op, inputs, outputs, count);
  }
}

}  // namespace internal
}  // namespace dist
