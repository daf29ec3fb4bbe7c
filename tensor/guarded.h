// Guarded(fn, context): fn's absl::Status or absl::StatusOr, or what fn threw
// as a status (StatusOfCurrentException: out of memory is ResourceExhausted,
// anything else Internal), for code whose failure must reach its caller (or
// the other ranks' next exchange) as a status rather than unwind past it.
#ifndef TENSOR_GUARDED_H_
#define TENSOR_GUARDED_H_

#include "absl/strings/string_view.h"
#include "tensor/error.h"

namespace tensor {

template <typename Fn>
auto Guarded(Fn&& fn, absl::string_view context = {}) -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    return StatusOfCurrentException(context);
  }
}

}  // namespace tensor

#endif  // TENSOR_GUARDED_H_
