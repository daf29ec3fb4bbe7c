// Tensor: construction, views, strided copies with dtype conversion, printing.
#include "tensor/tensor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/vec8.h"
#include "tensor/cuda_backend.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace {

template <typename T>
constexpr bool kIsHalfLike = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
template <typename T>
constexpr bool kIsFloating = kIsHalfLike<T> || std::is_same_v<T, float>;

template <typename Dst, typename Src>
inline Dst Convert(Src s) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return s;
  } else if constexpr (kIsHalfLike<Src>) {
    return FromFloat<Dst>(ToFloat(s));
  } else if constexpr (kIsHalfLike<Dst>) {
    return FromFloat<Dst>(static_cast<float>(s));
  } else if constexpr (std::is_integral_v<Dst> && std::is_floating_point_v<Src>) {
    return SaturatingCast<Dst>(s);
  } else {
    return static_cast<Dst>(s);
  }
}

// Calls fn(T*) with the C++ type of `dtype` (a null pointer of that type).
template <typename Fn>
void DispatchAll(Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kF32: return fn(static_cast<float*>(nullptr));
    case Dtype::kF16: return fn(static_cast<f16*>(nullptr));
    case Dtype::kBF16: return fn(static_cast<bf16*>(nullptr));
    case Dtype::kI32: return fn(static_cast<int32_t*>(nullptr));
    case Dtype::kI64: return fn(static_cast<int64_t*>(nullptr));
    case Dtype::kU8: return fn(static_cast<uint8_t*>(nullptr));
  }
}

int NormalizeDim(int dim, int rank, const char* op) {
  const int d = dim < 0 ? dim + rank : dim;
  OP_CHECK(d >= 0 && d < rank, op, "dimension ", dim, " out of range for rank ", rank);
  return d;
}

// Resolves a single -1 in `shape` so that it has `numel` elements.
Shape InferShape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.rank(); ++i) {
    if (out[i] == -1) {
      OP_CHECK(infer < 0, op, "only one dimension can be -1, got ", shape.ToString());
      infer = i;
    } else {
      OP_CHECK(out[i] >= 0, op, "negative dimension in ", shape.ToString());
      known *= out[i];
    }
  }
  if (infer >= 0) {
    OP_CHECK(known != 0 && numel % known == 0, op, "cannot reshape ", from.ToString(), " to ",
             shape.ToString());
    out[infer] = numel / known;
  }
  OP_CHECK(out.numel() == numel, op, "cannot reshape ", from.ToString(), " (", numel,
           " elements) to ", shape.ToString());
  return out;
}

// Strides for viewing (shape, strides) as new_shape without a copy, if possible
// (the algorithm of numpy/PyTorch: each group of old dims that maps onto a group
// of new dims must be contiguous within itself).
bool ViewStrides(const Shape& shape, const Dims& strides, const Shape& new_shape, Dims* out) {
  out->assign(new_shape.rank(), 0);
  if (shape.rank() == 0) {  // one element: every new dim is 1 (the caller checked numel)
    out->assign(new_shape.rank(), 1);
    return true;
  }
  if (shape.numel() == 0) {
    *out = ContiguousStrides(new_shape);
    return true;
  }
  int view_d = new_shape.rank() - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        (*out)[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

template <typename Dst, typename Src>
void CopyKernel(const Tensor& src, const Tensor& dst) {
  const Src* s = static_cast<const Src*>(src.raw_data());
  Dst* d = static_cast<Dst*>(dst.raw_data());
  const int64_t n = src.numel();
  if (src.is_contiguous() && dst.is_contiguous()) {
    if constexpr (std::is_same_v<Dst, Src>) {
      ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
        std::memcpy(d + b, s + b, (e - b) * sizeof(Src));
      });
    } else if constexpr (kIsFloating<Src> && kIsFloating<Dst>) {
      // 8 at a time (F16C / bit tricks), bit-identical to Convert.
      ParallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
        cpu::vec::ForEachBlock(e - b, [&](int64_t i, auto k) {
          cpu::vec::StoreAs(d + b + i, cpu::vec::LoadAs(s + b + i, k), k);
        });
      });
    } else {
      ParallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = Convert<Dst>(s[i]);
      });
    }
    return;
  }
  // General case: walk rows of the last dimension.
  const int rank = src.rank();
  const int64_t inner = rank == 0 ? 1 : src.dim(-1);
  const int64_t s_inner = rank == 0 ? 1 : src.strides()[rank - 1];
  const int64_t d_inner = rank == 0 ? 1 : dst.strides()[rank - 1];
  const int64_t rows = inner == 0 ? 0 : n / inner;
  ParallelFor(rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(inner, 1)),
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  int64_t so = 0, dO = 0, rem = r;
                  for (int k = rank - 2; k >= 0; --k) {
                    const int64_t idx = rem % src.dim(k);
                    rem /= src.dim(k);
                    so += idx * src.strides()[k];
                    dO += idx * dst.strides()[k];
                  }
                  const Src* sp = s + so;
                  Dst* dp = d + dO;
                  for (int64_t i = 0; i < inner; ++i) dp[i * d_inner] = Convert<Dst>(sp[i * s_inner]);
                }
              });
}

template <typename T>
void AppendElement(std::string* out, T v) {
  if constexpr (std::is_integral_v<T>) {
    absl::StrAppend(out, static_cast<int64_t>(v));
  } else {
    absl::StrAppendFormat(out, "%.6g", static_cast<double>(ToFloat(v)));
  }
}

// The bytes of a contiguous `shape` of `dtype`; OpError naming `op` for a
// negative dim or a size past int64_t.
int64_t CheckedBytes(const Shape& shape, Dtype dtype, const char* op) {
  for (int64_t d : shape.dims()) {
    OP_CHECK(d >= 0, op, "negative dimension in shape ", shape.ToString());
  }
  const std::optional<int64_t> numel = CheckedNumel(shape.span());
  int64_t bytes = 0;
  OP_CHECK(numel.has_value() && !__builtin_mul_overflow(*numel, DtypeSize(dtype), &bytes), op,
           "shape ", shape.ToString(), " of ", DtypeName(dtype), " is more than 2^63-1 bytes");
  return bytes;
}

// The element range [lo, hi) that `t` reaches in its storage (empty: lo == hi).
std::pair<int64_t, int64_t> ElementSpan(const Tensor& t) {
  if (t.numel() == 0) return {t.offset(), t.offset()};
  int64_t lo = t.offset(), hi = t.offset();
  for (int i = 0; i < t.rank(); ++i) {
    const int64_t reach = (t.dim(i) - 1) * t.strides()[i];
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi + 1};
}

// Whether writing `dst` may change elements of `src` before they are read:
// the same storage and intersecting byte ranges (not exactly the same view).
enum class Alias { kNone, kSameView, kOverlap };
Alias AliasOf(const Tensor& src, const Tensor& dst) {
  if (!src.defined() || !src.SharesStorageWith(dst)) return Alias::kNone;
  if (src.offset() == dst.offset() && src.strides() == dst.strides() &&
      src.dtype() == dst.dtype()) {
    return Alias::kSameView;
  }
  const auto [s_lo, s_hi] = ElementSpan(src);
  const auto [d_lo, d_hi] = ElementSpan(dst);
  if (s_lo == s_hi || d_lo == d_hi) return Alias::kNone;
  const bool apart = s_hi * src.element_size() <= d_lo * dst.element_size() ||
                     d_hi * dst.element_size() <= s_lo * src.element_size();
  return apart ? Alias::kNone : Alias::kOverlap;
}

}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, const Shape& shape, const Dims& strides,
               int64_t offset, Dtype dtype)
    : storage_(std::move(storage)), shape_(shape), strides_(strides), offset_(offset),
      dtype_(dtype) {
  OP_CHECK(strides_.size() == static_cast<size_t>(shape_.rank()), "tensor", "shape ",
           shape_.ToString(), " has rank ", shape_.rank(), " but ", strides_.size(), " strides");
}

Tensor Tensor::Empty(const Shape& shape, Dtype dtype, Device device) {
  auto storage = Storage::Allocate(CheckedBytes(shape, dtype, "empty"), device);
  return Tensor(std::move(storage), shape, ContiguousStrides(shape), 0, dtype);
}

Tensor Tensor::EmptyPinned(const Shape& shape, Dtype dtype) {
  Allocator* pinned = cuda::PinnedHostAllocator();
  const int64_t bytes = CheckedBytes(shape, dtype, "empty_pinned");
  if (pinned == nullptr) return Empty(shape, dtype);
  auto storage = Storage::Allocate(bytes, Device::Cpu(), *pinned);
  return Tensor(std::move(storage), shape, ContiguousStrides(shape), 0, dtype);
}

Tensor Tensor::Zeros(const Shape& shape, Dtype dtype, Device device) {
  return Full(shape, 0.0, dtype, device);
}

Tensor Tensor::Full(const Shape& shape, double value, Dtype dtype, Device device) {
  if (device.is_cuda()) {  // filled on the device: no host buffer, no copy, no wait
    Tensor t = Empty(shape, dtype, device);
    DispatchAll(dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T v = Convert<T>(value);
      cuda::FillOnDevice(t.raw_data(), t.numel(), &v, sizeof(T), device.index);
    });
    return t;
  }
  Tensor cpu = Empty(shape, dtype, Device::Cpu());
  DispatchAll(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T v = Convert<T>(value);
    T* p = cpu.data<T>();
    ParallelFor(cpu.numel(), 1 << 16, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
  });
  return cpu.To(device);
}

Tensor Tensor::FromVector(const std::vector<float>& values, const Shape& shape, Dtype dtype) {
  return FromData<float>(values, shape).To(dtype);
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::Cpu(); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

int64_t Tensor::RowStride() const {
  const int r = rank();
  if (r == 0) return -1;
  const int64_t cols = shape_[r - 1];
  if (cols != 1 && strides_[r - 1] != 1) return -1;
  // The row stride: the innermost leading dim that is not 1 decides it.
  int64_t ld = cols;
  int d = r - 2;
  while (d >= 0 && shape_[d] == 1) --d;
  if (d < 0) return ld;  // one row
  ld = strides_[d];
  if (ld < cols) return -1;
  int64_t expected = ld * shape_[d];
  for (--d; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return -1;
    expected *= shape_[d];
  }
  return ld;
}

void* Tensor::raw_data() const {
  OP_CHECK(defined(), "data", "tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_ * element_size();
}

Tensor Tensor::View(const Shape& shape) const {
  const Shape target = InferShape(shape, numel(), "view", shape_);
  Dims strides;
  OP_CHECK(ViewStrides(shape_, strides_, target, &strides), "view", "cannot view shape ",
           shape_.ToString(), " with strides (", absl::StrJoin(strides_, ","), ") as ",
           target.ToString(), " without a copy; use Reshape");
  return Tensor(storage_, target, strides, offset_, dtype_);
}

Tensor Tensor::Reshape(const Shape& shape) const {
  const Shape target = InferShape(shape, numel(), "reshape", shape_);
  Dims strides;
  if (ViewStrides(shape_, strides_, target, &strides)) {
    return Tensor(storage_, target, strides, offset_, dtype_);
  }
  return Contiguous().View(target);
}

Tensor Tensor::Transpose(int dim0, int dim1) const {
  const int a = NormalizeDim(dim0, rank(), "transpose");
  const int b = NormalizeDim(dim1, rank(), "transpose");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::Narrow(int dim, int64_t start, int64_t length) const {
  const int d = NormalizeDim(dim, rank(), "narrow");
  // length <= size - start: start + length could overflow.
  OP_CHECK(start >= 0 && length >= 0 && start <= shape_[d] && length <= shape_[d] - start,
           "narrow", "start ", start, " and length ", length, " out of bounds for dimension ", d,
           " of shape ", shape_.ToString());
  Tensor t = *this;
  t.shape_[d] = length;
  t.offset_ = offset_ + start * strides_[d];
  return t;
}

Tensor Tensor::Select(int dim, int64_t index) const {
  const int d = NormalizeDim(dim, rank(), "select");
  OP_CHECK(index >= 0 && index < shape_[d], "select", "index ", index,
           " out of range for dimension ", d, " of shape ", shape_.ToString());
  Shape shape;
  Dims strides;
  for (int i = 0; i < rank(); ++i) {
    if (i == d) continue;
    shape.push_back(shape_[i]);
    strides.push_back(strides_[i]);
  }
  return Tensor(storage_, shape, strides, offset_ + index * strides_[d], dtype_);
}

Tensor Tensor::Unsqueeze(int dim) const {
  const int d = dim < 0 ? dim + rank() + 1 : dim;
  OP_CHECK(d >= 0 && d <= rank(), "unsqueeze", "dimension ", dim, " out of range for rank ",
           rank());
  Shape shape;
  Dims strides;
  for (int i = 0; i <= rank(); ++i) {
    if (i == d) {
      shape.push_back(1);
      strides.push_back(i < rank() ? strides_[i] * shape_[i] : 1);
    }
    if (i < rank()) {
      shape.push_back(shape_[i]);
      strides.push_back(strides_[i]);
    }
  }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::Contiguous() const {
  if (is_contiguous()) return *this;
  return Clone();
}

Tensor Tensor::Clone() const {
  Tensor out = Empty(shape_, dtype_, device());
  out.CopyFrom(*this);
  return out;
}

Tensor Tensor::To(Dtype dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = Empty(shape_, dtype, device());
  out.CopyFrom(*this);
  return out;
}

namespace {

// Whether src casts into a `dtype` buffer on its device in a batched launch.
bool BatchCastable(const Tensor& src, Dtype dtype) {
  return src.device().is_cuda() && src.is_contiguous() && src.dtype() != dtype &&
         IsFloatingPoint(src.dtype()) && IsFloatingPoint(dtype);
}

}  // namespace

std::vector<Tensor> CastAll(const std::vector<Tensor>& tensors, Dtype dtype) {
  std::vector<Tensor> out(tensors.size());
  std::vector<Tensor> src, dst;  // the batched casts, into fresh buffers
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!BatchCastable(t, dtype)) {
      out[i] = t.To(dtype);
      continue;
    }
    out[i] = Tensor::Empty(t.shape(), dtype, t.device());
    src.push_back(t);
    dst.push_back(out[i]);
  }
  CastAllInto(src, dst);
  return out;
}

void CastAllInto(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  OP_CHECK(src.size() == dst.size(), "cast", src.size(), " sources for ", dst.size(),
           " destinations");
  // Casts on a device in one go, by (device, source dtype, destination dtype).
  std::map<std::tuple<int, Dtype, Dtype>, std::vector<cuda::CastPair>> batches;
  for (size_t i = 0; i < src.size(); ++i) {
    const Tensor& s = src[i];
    Tensor d = dst[i];  // a handle: CopyFrom writes its buffer
    OP_CHECK(s.shape() == d.shape(), "cast", "source shape ", s.shape().ToString(),
             " does not match destination shape ", d.shape().ToString());
    if (!BatchCastable(s, d.dtype()) || !d.is_contiguous() || d.device() != s.device()) {
      d.CopyFrom(s);
      continue;
    }
    batches[{s.device().index, s.dtype(), d.dtype()}].push_back(
        {s.raw_data(), d.raw_data(), s.numel()});
  }
  for (const auto& [key, pairs] : batches) {
    const auto& [device, from, to] = key;
    cuda::CastManyOnDevice(pairs, from, to, device);
  }
}

Tensor Tensor::To(Device device) const {
  if (device == this->device()) return *this;
  Tensor src = Contiguous();
  Tensor out = Empty(shape_, dtype_, device);
  cuda::CopyBytes(out.raw_data(), device, src.raw_data(), src.device(), nbytes());
  return out;
}

Tensor Tensor::ToQueued(Device device) const {
  if (!(device.is_cuda() && this->device().is_cpu()) || cuda::PinnedHostAllocator() == nullptr) {
    return To(device);  // nothing to queue, or no GPU to queue it on (To names why)
  }
  Tensor out = Empty(shape_, dtype_, device);
  // The staging block is the copy's, held past the caller's scope until the
  // copy has run (maybe past the ledger the caller charges): not charged, as
  // the allocators' cached blocks are not.
  const int64_t bytes = nbytes();
  cuda::CopyToDeviceQueued(out.raw_data(), bytes, device.index, [&](void* staging) {
    Tensor staged(Storage::Wrap(staging, bytes, Device::Cpu(), [] {}), shape_,
                  ContiguousStrides(shape_), 0, dtype_);
    staged.CopyFrom(*this);
  });
  return out;
}

void Tensor::CopyFrom(const Tensor& src) {
  OP_CHECK(src.shape() == shape_, "copy", "source shape ", src.shape().ToString(),
           " does not match destination shape ", shape_.ToString());
  switch (AliasOf(src, *this)) {
    case Alias::kSameView: return;  // every element onto itself
    case Alias::kOverlap: return CopyFrom(src.Clone());  // read all before writing any
    case Alias::kNone: break;
  }
  if (src.device() != device()) {
    OP_CHECK(src.dtype() == dtype_ && is_contiguous(), "copy",
             "a copy across devices needs the same dtype and a contiguous destination");
    Tensor s = src.Contiguous();
    cuda::CopyBytes(raw_data(), device(), s.raw_data(), s.device(), nbytes());
    return;
  }
  if (device().is_cuda()) {
    OP_CHECK(shape_.rank() <= cuda::kMaxCopyDims, "copy", "tensors of rank ", shape_.rank(),
             " (at most ", cuda::kMaxCopyDims, " on CUDA)");
    cuda::DeviceView s, d;
    s.data = src.raw_data();
    s.dtype = src.dtype();
    d.data = raw_data();
    d.dtype = dtype_;
    s.rank = d.rank = shape_.rank();
    for (int i = 0; i < shape_.rank(); ++i) {
      s.sizes[i] = d.sizes[i] = shape_[i];
      s.strides[i] = src.strides()[i];
      d.strides[i] = strides()[i];
    }
    cuda::CopyStridedOnDevice(s, d, device().index);
    return;
  }
  CopyStrided(src, *this);
}

void CopyStrided(const Tensor& src, const Tensor& dst) {
  OP_CHECK(src.shape() == dst.shape(), "copy", "shapes ", src.shape().ToString(), " and ",
           dst.shape().ToString(), " differ");
  switch (AliasOf(src, dst)) {
    case Alias::kSameView: return;
    case Alias::kOverlap: return CopyStrided(src.Clone(), dst);
    case Alias::kNone: break;
  }
  DispatchAll(src.dtype(), [&](auto* s_tag) {
    using S = std::remove_pointer_t<decltype(s_tag)>;
    DispatchAll(dst.dtype(), [&](auto* d_tag) {
      using D = std::remove_pointer_t<decltype(d_tag)>;
      CopyKernel<D, S>(src, dst);
    });
  });
}

double Tensor::Item() const {
  OP_CHECK(numel() == 1, "item", "tensor of shape ", shape_.ToString(), " has ", numel(),
           " elements, expected 1");
  Tensor c = To(Device::Cpu());
  double v = 0;
  DispatchAll(dtype_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    v = Convert<double>(*c.data<T>());
  });
  return v;
}

std::string Tensor::ToString(int64_t max_per_dim) const {
  std::string out = absl::StrCat("Tensor(shape=", shape_.ToString(), ", dtype=",
                                 DtypeName(dtype_), ", device=", device().ToString(), ")");
  if (!defined()) return out + " undefined";
  Tensor c = To(Device::Cpu()).Contiguous();
  out += "\n";
  DispatchAll(dtype_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* p = c.data<T>();
    const Dims strides = ContiguousStrides(shape_);
    const int64_t keep = std::max<int64_t>(max_per_dim, 2);  // first and last at least
    // Recursive printer over dimension d at element offset base.
    auto print = [&](auto&& self, int d, int64_t base) -> void {
      if (d == rank()) {
        AppendElement(&out, p[base]);
        return;
      }
      out += "[";
      const int64_t n = shape_[d];
      for (int64_t i = 0; i < n; ++i) {
        if (n > keep && i == keep / 2) {
          out += "..., ";
          i = n - keep / 2;
        }
        self(self, d + 1, base + i * strides[d]);
        if (i + 1 < n) out += d + 1 == rank() ? ", " : ",\n";
      }
      out += "]";
    };
    print(print, 0, 0);
  });
  return out;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.ToString(); }

}  // namespace tensor
