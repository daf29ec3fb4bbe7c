// MappedFile: contents, empty files, and errors naming the path.
#include "models/data/mapped_file.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace data {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
}

TEST(MappedFileTest, MapsTheBytes) {
  const std::string path = TempPath("mapped.bin");
  const std::string bytes("abc\0\xff xyz", 9);
  WriteBytes(path, bytes);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 9);
  EXPECT_EQ((*file)->bytes(), bytes);
  EXPECT_EQ((*file)->data()[4], 0xff);
  EXPECT_EQ((*file)->path(), path);
}

TEST(MappedFileTest, EmptyFileIsAnEmptyView) {
  const std::string path = TempPath("empty.bin");
  WriteBytes(path, "");
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 0);
  EXPECT_TRUE((*file)->bytes().empty());
}

TEST(MappedFileTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = TempPath("does_not_exist.bin");
  auto file = MappedFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find(path), absl::string_view::npos) << file.status();
}

TEST(MappedFileTest, DirectoryIsRefused) {
  const std::string dir = TempPath("");
  auto file = MappedFile::Open(dir);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not a regular file"), absl::string_view::npos)
      << file.status();
}

}  // namespace
}  // namespace data
