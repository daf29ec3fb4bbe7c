// Shapes and strides of tensors (element counts, row-major by default).
#ifndef TENSOR_SHAPE_H_
#define TENSOR_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace tensor {

using Dims = absl::InlinedVector<int64_t, 6>;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(absl::Span<const int64_t> dims) : dims_(dims.begin(), dims.end()) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  // Negative indices count from the end: dim(-1) is the last dimension.
  int64_t dim(int i) const { return dims_[i < 0 ? i + rank() : i]; }
  // The product of the dims; throws OpError when it does not fit in int64_t
  // (see CheckedNumel).
  int64_t numel() const;
  const Dims& dims() const { return dims_; }
  absl::Span<const int64_t> span() const { return dims_; }
  void push_back(int64_t d) { dims_.push_back(d); }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  // "(2,3,4)"; a scalar prints "()".
  std::string ToString() const;

 private:
  Dims dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

// The element count of `dims`, or nullopt when a dim is negative or the
// nonzero dims multiply past int64_t (then no row-major stride fits either):
// the check for shapes read from files.
std::optional<int64_t> CheckedNumel(absl::Span<const int64_t> dims);

// Row-major strides of a contiguous tensor of this shape.
Dims ContiguousStrides(const Shape& shape);

}  // namespace tensor

#endif  // TENSOR_SHAPE_H_
