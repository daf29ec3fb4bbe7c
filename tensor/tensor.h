// Tensor: a shared Storage seen through a shape, strides (in elements), an
// element offset and a dtype. Views (Reshape when possible, Transpose, Narrow,
// Select, Unsqueeze) share the storage and copy nothing; Contiguous(), To()
// and Clone() copy.
#ifndef TENSOR_TENSOR_H_
#define TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tensor/allocator.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/shape.h"

namespace tensor {

class Tensor {
 public:
  // An undefined tensor (no storage); defined() is false.
  Tensor() = default;

  // Uninitialized memory, charged to the calling thread's ledger and category.
  // OpError for a negative dim or a size of more than 2^63-1 bytes.
  static Tensor Empty(const Shape& shape, Dtype dtype = Dtype::kF32,
                      Device device = Device::Cpu());
  // A CPU tensor in page-locked host memory when this binary has CUDA and the
  // machine a GPU (copies to and from GPUs run without a staging copy);
  // ordinary host memory otherwise. Charged to the ledger as CPU memory.
  static Tensor EmptyPinned(const Shape& shape, Dtype dtype = Dtype::kF32);
  static Tensor Zeros(const Shape& shape, Dtype dtype = Dtype::kF32,
                      Device device = Device::Cpu());
  static Tensor Full(const Shape& shape, double value, Dtype dtype = Dtype::kF32,
                     Device device = Device::Cpu());
  // A CPU tensor holding a copy of `values` (values.size() must equal shape.numel()).
  template <typename T>
  static Tensor FromData(absl::Span<const T> values, const Shape& shape);
  // A CPU f32 tensor from floats, converted to `dtype`.
  static Tensor FromVector(const std::vector<float>& values, const Shape& shape,
                           Dtype dtype = Dtype::kF32);
  // A tensor over existing storage (for views built elsewhere, e.g. a flat parameter).
  Tensor(std::shared_ptr<Storage> storage, const Shape& shape, const Dims& strides,
         int64_t offset, Dtype dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t numel() const { return shape_.numel(); }
  Dtype dtype() const { return dtype_; }
  Device device() const;
  const Dims& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t element_size() const { return DtypeSize(dtype_); }
  int64_t nbytes() const { return numel() * element_size(); }
  bool is_contiguous() const;
  // When the tensor is a stack of rows of its last dimension -- unit stride
  // in it, and the leading dimensions laid out as one run of rows a uniform
  // stride >= dim(-1) apart (a contiguous tensor, or a row-padded view such
  // as Empty({N, ld}).Narrow(1, 0, V)) -- the elements between consecutive
  // rows; -1 otherwise. Rank 0: -1.
  int64_t RowStride() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool SharesStorageWith(const Tensor& other) const { return storage_ == other.storage_; }

  // Pointer to the first element. data<T>() checks that T matches dtype().
  void* raw_data() const;
  template <typename T>
  T* data() const {
    OP_CHECK(DtypeOf<T>() == dtype_, "data", "tensor has dtype ", DtypeName(dtype_),
             ", asked for ", DtypeName(DtypeOf<T>()));
    return static_cast<T*>(raw_data());
  }

  // ---- Views (no copy) ----
  // Same elements in a new shape; one dimension may be -1. A view when the
  // strides allow it, otherwise a contiguous copy.
  Tensor Reshape(const Shape& shape) const;
  // Like Reshape but never copies: throws when the strides do not allow a view.
  Tensor View(const Shape& shape) const;
  Tensor Transpose(int dim0, int dim1) const;
  // Elements [start, start + length) of dimension dim.
  Tensor Narrow(int dim, int64_t start, int64_t length) const;
  // Index `index` of dimension dim, which is removed.
  Tensor Select(int dim, int64_t index) const;
  Tensor Unsqueeze(int dim) const;
  // The whole tensor as one dimension (a view when contiguous).
  Tensor Flatten() const { return Reshape({numel()}); }

  // ---- Copies ----
  // This tensor if already contiguous, else a contiguous copy.
  Tensor Contiguous() const;
  // This tensor if already `dtype`, else a converted contiguous copy.
  Tensor To(Dtype dtype) const;
  // A copy on `device` (this tensor if already there).
  Tensor To(Device device) const;
  // To(device), except that a copy from the CPU to a GPU does not make the
  // host wait for the GPU: the bytes are staged in page-locked memory and the
  // copy is queued on the calling thread's stream, where later work sees them
  // (PyTorch's pin_memory() then to(device, non_blocking=True)). This tensor
  // may change or be freed at once. A training step's batch, uploaded while
  // the GPU still runs the previous step.
  Tensor ToQueued(Device device) const;
  Tensor Clone() const;
  // Copies src's elements into this tensor (same shape; dtype converted). src
  // may overlap this tensor (a view of the same storage): it is read whole first.
  void CopyFrom(const Tensor& src);

  // Elements as a vector of T (converted from dtype()); CPU tensors only.
  template <typename T>
  std::vector<T> ToVector() const;
  // The single element of a one-element tensor, as double.
  double Item() const;

  // "Tensor(shape=(2,3), dtype=f32, device=cpu)\n[[...]]", eliding the middle of big tensors:
  // a dim longer than max_per_dim (at least 2) shows its first and last max_per_dim / 2.
  std::string ToString(int64_t max_per_dim = 6) const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Dims strides_;
  int64_t offset_ = 0;  // in elements
  Dtype dtype_ = Dtype::kF32;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Every tensor .To(dtype), with the same values; contiguous floating CUDA
// tensors of one device and dtype cast in one launch per 64 tensors instead
// of one each (mixed precision's per-step casts of every parameter).
std::vector<Tensor> CastAll(const std::vector<Tensor>& tensors, Dtype dtype);
// dst[i].CopyFrom(src[i]) for every i (same shapes, any dtypes), batched as
// CastAll: into existing buffers (an optimizer's low-precision copies).
void CastAllInto(const std::vector<Tensor>& src, const std::vector<Tensor>& dst);

// Copies between tensors of the same shape, any strides and dtypes, on the CPU
// (overlapping ones too, through a copy of src).
void CopyStrided(const Tensor& src, const Tensor& dst);

template <typename T>
Tensor Tensor::FromData(absl::Span<const T> values, const Shape& shape) {
  OP_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_data", "got ",
           values.size(), " values for shape ", shape.ToString());
  Tensor t = Empty(shape, DtypeOf<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <typename T>
std::vector<T> Tensor::ToVector() const {
  Tensor c = To(Device::Cpu()).To(DtypeOf<T>()).Contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace tensor

#endif  // TENSOR_TENSOR_H_
