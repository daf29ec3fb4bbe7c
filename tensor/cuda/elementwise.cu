// CUDA elementwise kernels: one broadcasting, strided map over up to four
// operands. The host merges dims where every operand allows it (as the CPU
// kernels do); a layout that is one contiguous run for every operand runs a
// plain indexed kernel, anything else (bias (C) against (.., C), scalars,
// transposed views) computes per-element offsets from the merged dims.
#include <array>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/elementwise.h"

namespace tensor {
namespace cuda {
namespace {

constexpr int kMaxDims = 8;

// Operands over one iteration shape (row-major), size-1 dims dropped and
// adjacent dims merged; operand 0 is the output. A stride of 0 repeats an
// element (broadcasting). Passed to kernels by value.
template <int N>
struct Layout {
  int rank = 0;
  int64_t numel = 1;
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];
};

// Strides of t broadcast to `shape` (dims aligned at the end; 0 on dims that t
// lacks or has as size 1).
Dims BroadcastStrides(const Tensor& t, const Shape& shape) {
  const int rank = shape.rank();
  const int offset = rank - t.rank();
  Dims strides(rank, 0);
  for (int d = offset > 0 ? offset : 0; d < rank; ++d) {
    if (t.dim(d - offset) != 1) strides[d] = t.strides()[d - offset];
  }
  return strides;
}

template <int N>
Layout<N> MakeLayout(const char* op, const Shape& shape,
                     const std::array<const Tensor*, N>& operands) {
  std::array<Dims, N> full;
  for (int k = 0; k < N; ++k) full[k] = BroadcastStrides(*operands[k], shape);
  Dims dims;
  std::array<Dims, N> strides;
  for (int d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (int k = 0; k < N && merge; ++k) merge = strides[k].back() == full[k][d] * shape[d];
    if (merge) {
      dims.back() *= shape[d];
      for (int k = 0; k < N; ++k) strides[k].back() = full[k][d];
    } else {
      dims.push_back(shape[d]);
      for (int k = 0; k < N; ++k) strides[k].push_back(full[k][d]);
    }
  }
  if (dims.empty()) {  // a single element (or none)
    dims.push_back(1);
    for (int k = 0; k < N; ++k) strides[k].push_back(0);
  }
  OP_CHECK(dims.size() <= kMaxDims, op, "on CUDA at most ", kMaxDims,
           " dims remain after merging adjacent dims of the operands; output ", shape.ToString(),
           " needs ", dims.size());
  Layout<N> l;
  l.rank = static_cast<int>(dims.size());
  l.numel = shape.numel();
  for (int d = 0; d < l.rank; ++d) {
    l.shape[d] = dims[d];
    for (int k = 0; k < N; ++k) l.strides[k][d] = strides[k][d];
  }
  return l;
}

template <int N>
bool AllUnitStride(const Layout<N>& l) {
  if (l.rank != 1) return false;
  for (int k = 0; k < N; ++k) {
    if (l.strides[k][0] != 1) return false;
  }
  return true;
}

// Every operand one contiguous run: operand k's element i is at offset i.
template <int N, typename Fn>
__global__ void ContiguousMapKernel(int64_t n, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i;
    fn(off);
  }
}

// General layout: offsets from the merged dims; Idx is uint32_t when the
// element count allows (cheaper division), else uint64_t.
template <int N, typename Idx, typename Fn>
__global__ void StridedMapKernel(Layout<N> l, Idx n, Fn fn) {
  for (Idx i = blockIdx.x * Idx{blockDim.x} + threadIdx.x; i < n;
       i += Idx{gridDim.x} * blockDim.x) {
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    Idx rest = i;
    for (int d = l.rank - 1; d >= 0; --d) {
      const Idx size = static_cast<Idx>(l.shape[d]);
      const Idx idx = rest % size;
      rest /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(idx) * l.strides[k][d];
    }
    fn(off);
  }
}

// Runs fn(offsets) for every element of out's shape over `operands` (operand 0
// is the output, the others broadcast to it).
template <int N, typename Fn>
void Map(const char* op, const std::array<const Tensor*, N>& operands, const Fn& fn) {
  const Tensor& out = *operands[0];
  const Layout<N> l = MakeLayout<N>(op, out.shape(), operands);
  if (l.numel == 0) return;
  SetDevice(out, op);
  if (AllUnitStride(l)) {
    ContiguousMapKernel<N><<<Blocks(l.numel), kThreads, 0, ComputeStream()>>>(l.numel, fn);
  } else if (l.numel < (int64_t{1} << 31)) {
    StridedMapKernel<N, uint32_t>
        <<<Blocks(l.numel), kThreads, 0, ComputeStream()>>>(l, static_cast<uint32_t>(l.numel), fn);
  } else {
    StridedMapKernel<N, uint64_t>
        <<<Blocks(l.numel), kThreads, 0, ComputeStream()>>>(l, static_cast<uint64_t>(l.numel), fn);
  }
  CheckLaunch(op);
}

// ---------------------------------------------------------------------------
// Math (float; separately rounded operations, as the CPU kernels compute).
// ---------------------------------------------------------------------------

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// gelu(h) = h sigmoid(2u), u = sqrt(2/pi) (h + 0.044715 h^3): the CPU's form,
// with no cancellation in the negative tail.
__device__ __forceinline__ float GeluF(float h) {
  const float u = kSqrt2OverPi * (h + kGeluCoeff * h * h * h);
  return h / (1.0f + expf(-2.0f * u));
}

// g * gelu'(h), h clamped to [-10, 10] (beyond, gelu' is 0 or 1 in float).
__device__ __forceinline__ float GeluGradF(float g, float h) {
  h = fminf(fmaxf(h, -10.0f), 10.0f);
  const float h2 = h * h;
  const float u = kSqrt2OverPi * (h + kGeluCoeff * h * h2);
  const float e = expf(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  const float one_minus_s = e < 1.0f ? e * s : 1.0f - s;
  const float du = kSqrt2OverPi * (1.0f + (3.0f * kGeluCoeff) * h2);
  return g * (s + 2.0f * h * s * one_minus_s * du);
}

struct AddOp {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct SubOp {
  __device__ float operator()(float a, float b) const { return __fsub_rn(a, b); }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return __fmul_rn(a, b); }
};

// ---------------------------------------------------------------------------
// Per-element functors: pointers are the operands' first elements, offsets
// come from Map.
// ---------------------------------------------------------------------------

template <typename T, typename Op>
struct BinaryFn {
  T* out;
  const T* a;
  const T* b;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = FromF<T>(Op()(ToF(a[off[1]]), ToF(b[off[2]])));
  }
};

template <typename T>
struct ScaleFn {
  T* out;
  const T* x;
  float alpha;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = FromF<T>(__fmul_rn(alpha, ToF(x[off[1]])));
  }
};

template <typename TY, typename TX>
struct AxpyFn {
  TY* y;
  const TX* x;
  float alpha;
  __device__ void operator()(const int64_t* off) const {
    y[off[0]] = FromF<TY>(__fmaf_rn(alpha, ToF(x[off[1]]), ToF(y[off[0]])));
  }
};

template <typename T>
struct GeluFn {
  T* out;
  const T* x;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = FromF<T>(GeluF(ToF(x[off[1]])));
  }
};

template <typename T>
struct BiasGeluFn {
  T* out;
  const T* x;
  const T* bias;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = FromF<T>(GeluF(__fadd_rn(ToF(x[off[1]]), ToF(bias[off[2]]))));
  }
};

template <typename T>
struct GeluGradFn {
  T* grad_in;
  const T* grad_out;
  const T* x;
  __device__ void operator()(const int64_t* off) const {
    grad_in[off[0]] = FromF<T>(GeluGradF(ToF(grad_out[off[1]]), ToF(x[off[2]])));
  }
};

template <typename T>
struct BiasGeluGradFn {
  T* grad_in;
  const T* grad_out;
  const T* x;
  const T* bias;
  __device__ void operator()(const int64_t* off) const {
    const float h = __fadd_rn(ToF(x[off[2]]), ToF(bias[off[3]]));
    grad_in[off[0]] = FromF<T>(GeluGradF(ToF(grad_out[off[1]]), h));
  }
};

template <typename T>
struct ReluFn {
  T* out;
  const T* x;
  __device__ void operator()(const int64_t* off) const {
    const float v = ToF(x[off[1]]);
    out[off[0]] = FromF<T>(v < 0.0f ? 0.0f : v);  // NaN fails the test and passes through
  }
};

template <typename T>
struct ReluGradFn {
  T* grad_in;
  const T* grad_out;
  const T* x;
  __device__ void operator()(const int64_t* off) const {
    grad_in[off[0]] = FromF<T>(ToF(x[off[2]]) > 0.0f ? ToF(grad_out[off[1]]) : 0.0f);
  }
};

// An operand of SumAsFn: its first element and dtype (the same branch for
// every thread: no divergence).
struct AnyFloat {
  const void* p;
  Dtype dtype;
  __device__ float At(int64_t i) const {
    switch (dtype) {
      case Dtype::kF32:
        return static_cast<const float*>(p)[i];
      case Dtype::kBF16:
        return ToF(static_cast<const __nv_bfloat16*>(p)[i]);
      default:
        return ToF(static_cast<const __half*>(p)[i]);
    }
  }
};

// out = x[0] + x[1] + ... + x[count - 1], in float from left to right.
template <typename T>
struct SumAsFn {
  T* out;
  AnyFloat x[4];
  int count;
  __device__ void operator()(const int64_t* off) const {
    float sum = x[0].At(off[1]);
#pragma unroll
    for (int k = 1; k < 4; ++k) {
      if (k < count) sum = __fadd_rn(sum, x[k].At(off[k + 1]));
    }
    out[off[0]] = FromF<T>(sum);
  }
};

template <typename T, typename Op>
void LaunchBinary(const Tensor& a, const Tensor& b, const Tensor& out) {
  Map<3>("binary", {&out, &a, &b}, BinaryFn<T, Op>{Ptr<T>(out), Ptr<T>(a), Ptr<T>(b)});
}

}  // namespace

void Binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DispatchFloat(out.dtype(), "binary", [&](auto zero) {
    using T = decltype(zero);
    switch (op) {
      case BinaryOp::kAdd:
        return LaunchBinary<T, AddOp>(a, b, out);
      case BinaryOp::kSub:
        return LaunchBinary<T, SubOp>(a, b, out);
      case BinaryOp::kMul:
        return LaunchBinary<T, MulOp>(a, b, out);
    }
  });
}

void SumAs(const std::vector<Tensor>& xs, const Tensor& out) {
  OP_CHECK(xs.size() >= 2 && xs.size() <= 4, "sum_as", "takes 2 to 4 tensors, got ", xs.size());
  DispatchFloat(out.dtype(), "sum_as", [&](auto zero) {
    using T = decltype(zero);
    SumAsFn<T> fn{Ptr<T>(out), {}, static_cast<int>(xs.size())};
    // Missing operands repeat the first (the layout's; never read).
    std::array<const Tensor*, 5> operands{&out, &xs[0], &xs[0], &xs[0], &xs[0]};
    for (size_t k = 0; k < 4; ++k) {
      const Tensor& x = xs[k < xs.size() ? k : 0];
      operands[k + 1] = &x;
      fn.x[k] = AnyFloat{x.raw_data(), x.dtype()};
    }
    Map<5>("sum_as", operands, fn);
  });
}

void Scale(const Tensor& x, float alpha, const Tensor& out) {
  DispatchFloat(out.dtype(), "scale", [&](auto zero) {
    using T = decltype(zero);
    Map<2>("scale", {&out, &x}, ScaleFn<T>{Ptr<T>(out), Ptr<T>(x), alpha});
  });
}

void Axpy(float alpha, const Tensor& x, const Tensor& y) {
  DispatchFloat(x.dtype(), "axpy", [&](auto zero) {
    using TX = decltype(zero);
    if (y.dtype() == x.dtype()) {
      Map<2>("axpy", {&y, &x}, AxpyFn<TX, TX>{Ptr<TX>(y), Ptr<TX>(x), alpha});
    } else {
      OP_CHECK(y.dtype() == Dtype::kF32, "axpy", "cannot accumulate ", DtypeName(x.dtype()),
               " into ", DtypeName(y.dtype()));
      Map<2>("axpy", {&y, &x}, AxpyFn<float, TX>{Ptr<float>(y), Ptr<TX>(x), alpha});
    }
  });
}

void BiasGelu(const Tensor& x, const Tensor& bias, const Tensor& out) {
  DispatchFloat(out.dtype(), "gelu", [&](auto zero) {
    using T = decltype(zero);
    if (!bias.defined()) {
      Map<2>("gelu", {&out, &x}, GeluFn<T>{Ptr<T>(out), Ptr<T>(x)});
    } else {
      Map<3>("bias_gelu", {&out, &x, &bias}, BiasGeluFn<T>{Ptr<T>(out), Ptr<T>(x), Ptr<T>(bias)});
    }
  });
}

void BiasGeluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& bias,
                      const Tensor& grad_in) {
  DispatchFloat(grad_in.dtype(), "gelu_backward", [&](auto zero) {
    using T = decltype(zero);
    if (!bias.defined()) {
      Map<3>("gelu_backward", {&grad_in, &grad_out, &x},
             GeluGradFn<T>{Ptr<T>(grad_in), Ptr<T>(grad_out), Ptr<T>(x)});
    } else {
      Map<4>("bias_gelu_backward", {&grad_in, &grad_out, &x, &bias},
             BiasGeluGradFn<T>{Ptr<T>(grad_in), Ptr<T>(grad_out), Ptr<T>(x), Ptr<T>(bias)});
    }
  });
}

void Relu(const Tensor& x, const Tensor& out) {
  DispatchFloat(out.dtype(), "relu", [&](auto zero) {
    using T = decltype(zero);
    Map<2>("relu", {&out, &x}, ReluFn<T>{Ptr<T>(out), Ptr<T>(x)});
  });
}

void ReluBackward(const Tensor& grad_out, const Tensor& x, const Tensor& grad_in) {
  DispatchFloat(grad_in.dtype(), "relu_backward", [&](auto zero) {
    using T = decltype(zero);
    Map<3>("relu_backward", {&grad_in, &grad_out, &x},
           ReluGradFn<T>{Ptr<T>(grad_in), Ptr<T>(grad_out), Ptr<T>(x)});
  });
}

}  // namespace cuda
}  // namespace tensor
