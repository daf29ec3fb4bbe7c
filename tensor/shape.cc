// Shape helpers.
#include "tensor/shape.h"

#include "absl/strings/str_join.h"

namespace tensor {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::string Shape::ToString() const {
  return "(" + absl::StrJoin(dims_, ",") + ")";
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) {
  return os << shape.ToString();
}

Dims ContiguousStrides(const Shape& shape) {
  Dims strides(shape.rank());
  int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

}  // namespace tensor
