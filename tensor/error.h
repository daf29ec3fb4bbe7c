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
#include <utility>

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

// A failure that already has a status (a collective that timed out, a peer
// that died) thrown through code that reports by exceptions. An OpError, so
// callers that catch those catch it too; where it becomes a status again its
// code is kept (StatusOfCurrentException returns it, and the threads engine's
// ranks), so a timeout still reads as DeadlineExceeded, not bad input.
class StatusError : public OpError {
 public:
  explicit StatusError(absl::Status status)
      : OpError(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Throws StatusError with the message "[op] pieces...: <status.ToString()>"
// unless `status` is OK. Its code is `status`'s, but InvalidArgument (a
// collective's tensors that do not match a peer's) becomes Internal: the
// program's fault there, not its command line's.
template <typename... Args>
void ThrowIfError(const absl::Status& status, const char* op, const Args&... pieces) {
  if (status.ok()) return;
  const absl::StatusCode code = status.code() == absl::StatusCode::kInvalidArgument
                                    ? absl::StatusCode::kInternal
                                    : status.code();
  throw StatusError(
      absl::Status(code, absl::StrCat("[", op, "] ", pieces..., ": ", status.ToString())));
}

// The status of the exception being handled; call it inside a catch block.
// A StatusError keeps its code; running out of memory (a std::bad_alloc; an
// OutOfMemoryError says where and how much) is ResourceExhausted, any other
// exception Internal. The message is `context` followed by the exception's.
inline absl::Status StatusOfCurrentException(absl::string_view context = {}) {
  try {
    throw;
  } catch (const StatusError& e) {
    return absl::Status(e.status().code(), absl::StrCat(context, e.status().message()));
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
