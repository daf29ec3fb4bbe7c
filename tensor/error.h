// Errors raised by tensor ops on bad input. Messages start with the op name in
// brackets and show the shapes involved: "[matmul] shapes (2,3) and (4,5) ...".
// Ops throw OpError (a std::invalid_argument) instead of aborting, so a caller
// can report the problem and keep its state.
#ifndef TENSOR_ERROR_H_
#define TENSOR_ERROR_H_

#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"

namespace tensor {

class OpError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Throws OpError("[op] " + pieces...).
template <typename... Args>
[[noreturn]] void ThrowOpError(const char* op, const Args&... pieces) {
  throw OpError(absl::StrCat("[", op, "] ", pieces...));
}

}  // namespace tensor

// OP_CHECK(cond, op, pieces...): throws OpError when cond is false.
#define OP_CHECK(cond, op, ...)                          \
  do {                                                   \
    if (!(cond)) ::tensor::ThrowOpError(op, __VA_ARGS__); \
  } while (0)

#endif  // TENSOR_ERROR_H_
