// Shape helpers.
#include "tensor/shape.h"

#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace tensor {

int64_t Shape::numel() const {
  // The nonzero dims multiplied with an overflow check (a zero dim makes 0).
  int64_t n = 1;
  bool zero = false;
  for (int64_t d : dims_) {
    if (d == 0) {
      zero = true;
    } else if (__builtin_mul_overflow(n, d, &n)) {
      ThrowOpError("numel", "shape ", ToString(), " has more than 2^63-1 elements");
    }
  }
  return zero ? 0 : n;
}

std::optional<int64_t> CheckedNumel(absl::Span<const int64_t> dims) {
  int64_t n = 1;
  bool zero = false;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      zero = true;
    } else if (__builtin_mul_overflow(n, d, &n)) {
      return std::nullopt;
    }
  }
  return zero ? 0 : n;
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
