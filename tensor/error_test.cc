// Tests of StatusOfCurrentException (the status code follows what was thrown)
// and of Guarded.
#include "tensor/error.h"

#include <new>
#include <stdexcept>

#include "gtest/gtest.h"
#include "tensor/allocator.h"
#include "tensor/guarded.h"

namespace tensor {
namespace {

template <typename Throw>
absl::Status StatusOf(Throw&& thrower, absl::string_view context = {}) {
  try {
    thrower();
  } catch (...) {
    return StatusOfCurrentException(context);
  }
  return absl::OkStatus();
}

TEST(StatusOfCurrentExceptionTest, OutOfMemoryIsResourceExhausted) {
  absl::Status s = StatusOf([] { throw std::bad_alloc(); }, "staging: ");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message().substr(0, 9), "staging: ");
  s = StatusOf([] { throw OutOfMemoryError("out of memory on cuda:0: 2 GiB"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "out of memory on cuda:0: 2 GiB");
}

TEST(StatusOfCurrentExceptionTest, OtherExceptionsAreInternal) {
  absl::Status s = StatusOf([] { ThrowOpError("matmul", "shapes (2,3) and (4,5)"); }, "step: ");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "step: [matmul] shapes (2,3) and (4,5)");
  s = StatusOf([] { throw 42; });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "an exception of unknown type");
}

// Guarded gives fn's own Status or StatusOr, or what fn threw as a status.
TEST(GuardedTest, ResultOrThrownStatus) {
  absl::StatusOr<int> got = Guarded([]() -> absl::StatusOr<int> { return 7; });
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 7);
  got = Guarded([]() -> absl::StatusOr<int> { throw std::bad_alloc(); }, "staging: ");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(got.status().message().substr(0, 9), "staging: ");
  const absl::Status own = Guarded([] { return absl::NotFoundError("no file"); });
  EXPECT_EQ(own, absl::NotFoundError("no file"));
  const absl::Status thrown = Guarded([]() -> absl::Status { ThrowOpError("add", "bad"); });
  EXPECT_EQ(thrown, absl::InternalError("[add] bad"));
}

}  // namespace
}  // namespace tensor
