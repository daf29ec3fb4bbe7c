// Errors raised by tensor ops on bad input. Messages start with the op name in
// brackets and show the shapes involved: "[matmul] shapes (2,3) and (4,5) ...".
// Ops throw OpError (a std::invalid_argument) instead of aborting, so a caller
// can report the problem and keep its state.
#ifndef TENSOR_ERROR_H_
#define TENSOR_ERROR_H_

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

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

// The status of the exception being handled; call it inside a catch block.
// Running out of memory (a std::bad_alloc; an OutOfMemoryError says where and
// how much) is ResourceExhausted, any other exception Internal. The message is
// `context` followed by the exception's.
inline absl::Status StatusOfCurrentException(absl::string_view context = {}) {
  try {
    throw;
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(absl::StrCat(context, e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, e.what()));
  } catch (...) {
    return absl::UnknownError(absl::StrCat(context, "an exception of unknown type"));
  }
}

}  // namespace tensor

// OP_CHECK(cond, op, pieces...): throws OpError when cond is false.
#define OP_CHECK(cond, op, ...)                          \
  do {                                                   \
    if (!(cond)) ::tensor::ThrowOpError(op, __VA_ARGS__); \
  } while (0)

#endif  // TENSOR_ERROR_H_
