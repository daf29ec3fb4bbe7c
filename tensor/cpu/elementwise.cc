// CPU elementwise kernels: a broadcasting, strided iteration over up to four
// operands (dims coalesced, elements split into chunks across the thread
// pool) and per-op row loops over blocks of 8 floats, written with GCC vector
// extensions so they compile to AVX2 at -O2 whatever the auto-vectorizer's
// cost model decides (tensor/cpu/vec8.h, which also has the exp GELU uses).
#include "tensor/cpu/elementwise.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/base/attributes.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;      // elements per task for cheap ops
constexpr int64_t kGeluGrain = 1 << 12;  // GELU costs ~30 flops per element

using vec::AnyStride;
using vec::F8;
using vec::FullBlock;
using vec::kLanes;
using vec::Load;
using vec::Splat;
using vec::Store;
using vec::UnitStride;
using vec::ZeroStride;

// ---------------------------------------------------------------------------
// Iteration layout.
// ---------------------------------------------------------------------------

// Operands seen over one iteration shape with size-1 dims dropped and
// adjacent dims merged where every operand allows it. Operand 0 is the
// output; a stride of 0 repeats an element (broadcasting).
template <int N>
struct Layout {
  Dims shape;                   // rank >= 1
  std::array<Dims, N> strides;  // per operand, same rank as shape
  int64_t numel = 1;
};

// Strides of `t` broadcast to `shape` (dims aligned at the end; 0 on dims that
// t lacks or has as size 1).
Dims BroadcastStrides(const Tensor& t, const Shape& shape) {
  const int rank = shape.rank();
  const int offset = rank - t.rank();
  Dims strides(rank, 0);
  for (int d = std::max(offset, 0); d < rank; ++d) {
    if (t.dim(d - offset) != 1) strides[d] = t.strides()[d - offset];
  }
  return strides;
}

template <int N>
Layout<N> MakeLayout(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  std::array<Dims, N> full;
  for (int k = 0; k < N; ++k) full[k] = BroadcastStrides(*operands[k], shape);
  Layout<N> l;
  l.numel = shape.numel();
  for (int d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !l.shape.empty();
    for (int k = 0; k < N && merge; ++k) {
      merge = l.strides[k].back() == full[k][d] * shape[d];
    }
    if (merge) {
      l.shape.back() *= shape[d];
      for (int k = 0; k < N; ++k) l.strides[k].back() = full[k][d];
    } else {
      l.shape.push_back(shape[d]);
      for (int k = 0; k < N; ++k) l.strides[k].push_back(full[k][d]);
    }
  }
  if (l.shape.empty()) {  // a single element
    l.shape.push_back(1);
    for (int k = 0; k < N; ++k) l.strides[k].push_back(0);
  }
  return l;
}

// Splits the layout's elements into chunks over the thread pool and calls
// row(offsets, n) for each run of n elements along the innermost dim, where
// offsets[k] is the element offset of operand k at the run's start.
template <int N, typename RowFn>
void ParallelRows(const Layout<N>& l, int64_t grain, const RowFn& row) {
  const int rank = static_cast<int>(l.shape.size());
  const int64_t inner = l.shape[rank - 1];
  ParallelFor(l.numel, grain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end) {
      int64_t rest = i / inner;
      const int64_t col = i % inner;
      const int64_t n = std::min(inner - col, end - i);
      std::array<int64_t, N> offsets;
      for (int k = 0; k < N; ++k) offsets[k] = col * l.strides[k][rank - 1];
      for (int d = rank - 2; d >= 0 && rest > 0; --d) {
        const int64_t idx = rest % l.shape[d];
        rest /= l.shape[d];
        for (int k = 0; k < N; ++k) offsets[k] += idx * l.strides[k][d];
      }
      row(offsets, n);
      i += n;
    }
  });
}

template <typename Fn>
void WithStrides(int64_t so, int64_t sa, const Fn& fn) {
  if (so == 1 && sa == 1) return fn(UnitStride{}, UnitStride{});
  fn(AnyStride{so}, AnyStride{sa});
}

template <typename Fn>
void WithStrides(int64_t so, int64_t sa, int64_t sb, const Fn& fn) {
  if (so == 1 && sa == 1 && sb == 1) return fn(UnitStride{}, UnitStride{}, UnitStride{});
  if (so == 1 && sa == 1 && sb == 0) return fn(UnitStride{}, UnitStride{}, ZeroStride{});
  if (so == 1 && sa == 0 && sb == 1) return fn(UnitStride{}, ZeroStride{}, UnitStride{});
  fn(AnyStride{so}, AnyStride{sa}, AnyStride{sb});
}

template <typename Fn>
void WithStrides(int64_t so, int64_t sa, int64_t sb, int64_t sc, const Fn& fn) {
  if (so == 1 && sa == 1 && sb == 1 && (sc == 1 || sc == 0)) {
    if (sc == 1) return fn(UnitStride{}, UnitStride{}, UnitStride{}, UnitStride{});
    return fn(UnitStride{}, UnitStride{}, UnitStride{}, ZeroStride{});
  }
  fn(AnyStride{so}, AnyStride{sa}, AnyStride{sb}, AnyStride{sc});
}

template <int N>
std::array<int64_t, N> InnerStrides(const Layout<N>& l) {
  std::array<int64_t, N> s;
  for (int k = 0; k < N; ++k) s[k] = l.strides[k].back();
  return s;
}

// ---------------------------------------------------------------------------
// Row loops and math.
// ---------------------------------------------------------------------------

// out[so(j)] for j in [0, n) from f(j0, m), which returns the 8 lanes of the
// block starting at j0 with m valid elements (FullBlock for whole blocks).
template <typename T, typename SO, typename BlockFn>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void MapRow(T* out, SO so, int64_t n, const BlockFn& f) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(out + so(j), so, FullBlock{}, f(j, FullBlock{}));
  if (j < n) Store(out + so(j), so, n - j, f(j, n - j));
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// GELU through 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^{-2u}), which has
// no cancellation in the negative tail (unlike 1 + tanh(u) in float):
//   gelu(h)  = h s,  s = sigmoid(2u),  u = sqrt(2/pi) (h + 0.044715 h^3)
//   gelu'(h) = s + 2 h s (1 - s) du/dh,  1 - s = e^{-2u} s when that is small.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 Gelu(F8 h) {
  const F8 u = kSqrt2OverPi * (h + kGeluCoeff * h * h * h);
  return h / (1.0f + vec::Exp(-2.0f * u));
}

// g * d/dh gelu(h). Beyond |h| = 10 the derivative is 0 or 1 to float
// precision (|gelu'(-10)| < 1e-35), so h is clamped there: h^3 cannot overflow.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline F8 GeluGrad(F8 g, F8 h) {
  h = h < -10.0f ? Splat(-10.0f) : h;
  h = h > 10.0f ? Splat(10.0f) : h;
  const F8 h2 = h * h;
  const F8 u = kSqrt2OverPi * (h + kGeluCoeff * h * h2);
  const F8 e = vec::Exp(-2.0f * u);
  const F8 s = 1.0f / (1.0f + e);
  const F8 one_minus_s = e < 1.0f ? e * s : 1.0f - s;  // also right when e overflows
  const F8 du = kSqrt2OverPi * (1.0f + (3.0f * kGeluCoeff) * h2);
  return g * (s + 2.0f * h * s * one_minus_s * du);
}

struct AddFn {
  F8 operator()(F8 a, F8 b) const { return a + b; }
};
struct SubFn {
  F8 operator()(F8 a, F8 b) const { return a - b; }
};
struct MulFn {
  F8 operator()(F8 a, F8 b) const { return a * b; }
};

// ---------------------------------------------------------------------------
// Typed kernels.
// ---------------------------------------------------------------------------

template <typename T, typename Op>
void BinaryTyped(const Tensor& a, const Tensor& b, const Tensor& out, Op op) {
  const Layout<3> l = MakeLayout<3>(out.shape(), {&out, &a, &b});
  const auto s = InnerStrides(l);
  T* po = static_cast<T*>(out.raw_data());
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  ParallelRows(l, kGrain, [&](const std::array<int64_t, 3>& off, int64_t n) {
    WithStrides(s[0], s[1], s[2], [&](auto so, auto sa, auto sb) {
      const T* x = pa + off[1];
      const T* y = pb + off[2];
      MapRow(po + off[0], so, n,
             [&](int64_t j, auto m) { return op(Load(x + sa(j), sa, m), Load(y + sb(j), sb, m)); });
    });
  });
}

template <typename T>
void ScaleTyped(const Tensor& x, float alpha, const Tensor& out) {
  const Layout<2> l = MakeLayout<2>(out.shape(), {&out, &x});
  const auto s = InnerStrides(l);
  T* po = static_cast<T*>(out.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  ParallelRows(l, kGrain, [&](const std::array<int64_t, 2>& off, int64_t n) {
    WithStrides(s[0], s[1], [&](auto so, auto sx) {
      const T* xr = px + off[1];
      MapRow(po + off[0], so, n,
             [&](int64_t j, auto m) { return alpha * Load(xr + sx(j), sx, m); });
    });
  });
}

template <typename TY, typename TX>
void AxpyTyped(float alpha, const Tensor& x, const Tensor& y) {
  const Layout<2> l = MakeLayout<2>(y.shape(), {&y, &x});
  const auto s = InnerStrides(l);
  TY* py = static_cast<TY*>(y.raw_data());
  const TX* px = static_cast<const TX*>(x.raw_data());
  ParallelRows(l, kGrain, [&](const std::array<int64_t, 2>& off, int64_t n) {
    WithStrides(s[0], s[1], [&](auto sy, auto sx) {
      TY* yr = py + off[0];
      const TX* xr = px + off[1];
      MapRow(yr, sy, n, [&](int64_t j, auto m) {
        return Load(yr + sy(j), sy, m) + alpha * Load(xr + sx(j), sx, m);
      });
    });
  });
}

template <typename T>
void BiasGeluTyped(const Tensor& x, const Tensor& bias, const Tensor& out) {
  T* po = static_cast<T*>(out.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  if (!bias.defined()) {
    const Layout<2> l = MakeLayout<2>(out.shape(), {&out, &x});
    const auto s = InnerStrides(l);
    ParallelRows(l, kGeluGrain, [&](const std::array<int64_t, 2>& off, int64_t n) {
      WithStrides(s[0], s[1], [&](auto so, auto sx) {
        const T* xr = px + off[1];
        MapRow(po + off[0], so, n,
               [&](int64_t j, auto m) { return Gelu(Load(xr + sx(j), sx, m)); });
      });
    });
    return;
  }
  const T* pb = static_cast<const T*>(bias.raw_data());
  const Layout<3> l = MakeLayout<3>(out.shape(), {&out, &x, &bias});
  const auto s = InnerStrides(l);
  ParallelRows(l, kGeluGrain, [&](const std::array<int64_t, 3>& off, int64_t n) {
    WithStrides(s[0], s[1], s[2], [&](auto so, auto sx, auto sb) {
      const T* xr = px + off[1];
      const T* br = pb + off[2];
      MapRow(po + off[0], so, n, [&](int64_t j, auto m) {
        return Gelu(Load(xr + sx(j), sx, m) + Load(br + sb(j), sb, m));
      });
    });
  });
}

template <typename T>
void BiasGeluBackwardTyped(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                           const Tensor& grad_in) {
  T* pgi = static_cast<T*>(grad_in.raw_data());
  const T* pg = static_cast<const T*>(grad_out.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  if (!bias.defined()) {
    const Layout<3> l = MakeLayout<3>(grad_in.shape(), {&grad_in, &grad_out, &x});
    const auto s = InnerStrides(l);
    ParallelRows(l, kGeluGrain, [&](const std::array<int64_t, 3>& off, int64_t n) {
      WithStrides(s[0], s[1], s[2], [&](auto so, auto sg, auto sx) {
        const T* gr = pg + off[1];
        const T* xr = px + off[2];
        MapRow(pgi + off[0], so, n, [&](int64_t j, auto m) {
          return GeluGrad(Load(gr + sg(j), sg, m), Load(xr + sx(j), sx, m));
        });
      });
    });
    return;
  }
  const T* pb = static_cast<const T*>(bias.raw_data());
  const Layout<4> l = MakeLayout<4>(grad_in.shape(), {&grad_in, &grad_out, &x, &bias});
  const auto s = InnerStrides(l);
  ParallelRows(l, kGeluGrain, [&](const std::array<int64_t, 4>& off, int64_t n) {
    WithStrides(s[0], s[1], s[2], s[3], [&](auto so, auto sg, auto sx, auto sb) {
      const T* gr = pg + off[1];
      const T* xr = px + off[2];
      const T* br = pb + off[3];
      MapRow(pgi + off[0], so, n, [&](int64_t j, auto m) {
        return GeluGrad(Load(gr + sg(j), sg, m), Load(xr + sx(j), sx, m) + Load(br + sb(j), sb, m));
      });
    });
  });
}

template <typename T>
void ReluTyped(const Tensor& x, const Tensor& out) {
  const Layout<2> l = MakeLayout<2>(out.shape(), {&out, &x});
  const auto s = InnerStrides(l);
  T* po = static_cast<T*>(out.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  ParallelRows(l, kGrain, [&](const std::array<int64_t, 2>& off, int64_t n) {
    WithStrides(s[0], s[1], [&](auto so, auto sx) {
      const T* xr = px + off[1];
      MapRow(po + off[0], so, n, [&](int64_t j, auto m) {
        const F8 v = Load(xr + sx(j), sx, m);
        return v < 0.0f ? Splat(0.0f) : v;  // NaN fails the test and passes through
      });
    });
  });
}

template <typename T>
void ReluBackwardTyped(const Tensor& grad_out, const Tensor& x, const Tensor& grad_in) {
  const Layout<3> l = MakeLayout<3>(grad_in.shape(), {&grad_in, &grad_out, &x});
  const auto s = InnerStrides(l);
  T* po = static_cast<T*>(grad_in.raw_data());
  const T* pg = static_cast<const T*>(grad_out.raw_data());
  const T* px = static_cast<const T*>(x.raw_data());
  ParallelRows(l, kGrain, [&](const std::array<int64_t, 3>& off, int64_t n) {
    WithStrides(s[0], s[1], s[2], [&](auto so, auto sg, auto sx) {
      const T* gr = pg + off[1];
      const T* xr = px + off[2];
      MapRow(po + off[0], so, n, [&](int64_t j, auto m) {
        return Load(xr + sx(j), sx, m) > 0.0f ? Load(gr + sg(j), sg, m) : Splat(0.0f);
      });
    });
  });
}

}  // namespace

void Binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DispatchFloating("binary", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    switch (op) {
      case BinaryOp::kAdd:
        return BinaryTyped<T>(a, b, out, AddFn{});
      case BinaryOp::kSub:
        return BinaryTyped<T>(a, b, out, SubFn{});
      case BinaryOp::kMul:
        return BinaryTyped<T>(a, b, out, MulFn{});
    }
  });
}

void Scale(const Tensor& x, float alpha, const Tensor& out) {
  DispatchFloating("scale", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ScaleTyped<T>(x, alpha, out);
  });
}

void Axpy(float alpha, const Tensor& x, const Tensor& y) {
  DispatchFloating("axpy", x.dtype(), [&](auto* tag) {
    using TX = std::remove_pointer_t<decltype(tag)>;
    if (y.dtype() == x.dtype()) {
      AxpyTyped<TX, TX>(alpha, x, y);
    } else {
      OP_CHECK(y.dtype() == Dtype::kF32, "axpy", "cannot accumulate ", DtypeName(x.dtype()),
               " into ", DtypeName(y.dtype()));
      AxpyTyped<float, TX>(alpha, x, y);
    }
  });
}

void BiasGelu(const Tensor& x, const Tensor& bias, const Tensor& out) {
  DispatchFloating("gelu", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BiasGeluTyped<T>(x, bias, out);
  });
}

void BiasGeluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                      const Tensor& grad_in) {
  DispatchFloating("gelu_backward", grad_in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BiasGeluBackwardTyped<T>(grad_out, x, bias, grad_in);
  });
}

void Relu(const Tensor& x, const Tensor& out) {
  DispatchFloating("relu", out.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ReluTyped<T>(x, out);
  });
}

void ReluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& grad_in) {
  DispatchFloating("relu_backward", grad_in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ReluBackwardTyped<T>(grad_out, x, grad_in);
  });
}

}  // namespace cpu
}  // namespace tensor
