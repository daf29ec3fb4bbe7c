// ReadFile: a file's bytes (an empty file too, and binary bytes), and an
// error of its own for a missing path, a folder, a file over the bound and
// one that cannot be opened.
#include "tensor/read_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tensor {
namespace {

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(ReadFileTest, ReadsEveryByteOfAFileEmptyOrNot) {
  const std::string empty = Dir() + "/empty";
  Write(empty, "");
  absl::StatusOr<std::string> got = ReadFile(empty);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
  std::string bytes(200000, 'x');  // over one read's buffer
  bytes[7] = '\0';
  bytes[199999] = '\xff';
  const std::string big = Dir() + "/big";
  Write(big, bytes);
  got = ReadFile(big);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, bytes);
  EXPECT_TRUE(ReadFile(big, 200000).ok());
}

TEST(ReadFileTest, EachProblemHasItsOwnError) {
  absl::StatusOr<std::string> got = ReadFile(Dir() + "/none");
  EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
  EXPECT_EQ(got.status().message(), Dir() + "/none: no such file");
  got = ReadFile(Dir());
  EXPECT_TRUE(absl::IsFailedPrecondition(got.status())) << got.status();
  EXPECT_EQ(got.status().message(), Dir() + ": is a folder, not a file");
  const std::string five = Dir() + "/five";
  Write(five, "12345");
  got = ReadFile(five, 4);
  EXPECT_TRUE(absl::IsFailedPrecondition(got.status())) << got.status();
  EXPECT_EQ(got.status().message(), five + ": is 5 bytes, more than the 4 read at most");
  // A device has no size to check first: read up to the bound.
  got = ReadFile("/dev/zero", 100000);
  EXPECT_TRUE(absl::IsFailedPrecondition(got.status())) << got.status();
  EXPECT_EQ(got.status().message(), "/dev/zero: holds more than the 100000 bytes read at most");
  if (::geteuid() != 0) {  // root reads anything
    const std::string locked = Dir() + "/locked";
    Write(locked, "secret");
    ::chmod(locked.c_str(), 0);
    got = ReadFile(locked);
    EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
    EXPECT_EQ(got.status().message(), locked + ": cannot open it: Permission denied");
  }
}

}  // namespace
}  // namespace tensor
