// Tests of the crash-safe file writes (durable_file.h).
#include "tensor/durable_file.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tensor {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

TEST(DurableFileTest, WritesPartsAndReplacesLeavingNoTemporaryFile) {
  const std::string dir = ::testing::TempDir() + "/durable";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/a.txt";
  ASSERT_TRUE(WriteFileDurably(path, "first").ok());
  EXPECT_EQ(Read(path), "first");
  const std::string binary("\0\x01\xff", 3);
  const absl::string_view parts[] = {"head ", binary, "", " tail"};
  ASSERT_TRUE(WriteFileDurably(path, parts).ok());
  EXPECT_EQ(Read(path), "head " + binary + " tail");
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"a.txt"});
}

TEST(DurableFileTest, AFailureNamesTheFileAndLeavesTheOldContents) {
  const std::string dir = ::testing::TempDir() + "/durable_fail";
  std::filesystem::create_directories(dir);
  absl::Status s = WriteFileDurably(dir + "/no/such/folder/x", "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cannot create '" + dir + "/no/such/folder/x.tmp."), std::string::npos)
      << s;
  // Renaming onto a folder fails after the bytes were written: the folder is
  // untouched and the temporary file is gone.
  std::filesystem::create_directories(dir + "/taken");
  std::ofstream(dir + "/taken/keep") << "kept";
  s = WriteFileDurably(dir + "/taken", "data");
  EXPECT_NE(s.message().find("cannot rename onto '" + dir + "/taken'"), std::string::npos) << s;
  EXPECT_EQ(Read(dir + "/taken/keep"), "kept");
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"taken"});
}

// Piece by piece: appended bytes, one overwritten in place, nothing at
// `path` until Commit; a writer dropped unfinished leaves `path` as it was.
TEST(DurableFileTest, WriterAppendsOverwritesAndCommitsOrLeavesNothing) {
  const std::string dir = ::testing::TempDir() + "/durable_writer";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/f";
  {
    auto w = DurableFileWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append("header ????").ok());
    ASSERT_TRUE((*w)->Append(" data").ok());
    EXPECT_EQ((*w)->size(), 16);
    EXPECT_FALSE(std::filesystem::exists(path));
    ASSERT_TRUE((*w)->WriteAt(7, "crc!").ok());
    const absl::Status outside = (*w)->WriteAt(14, "xyz");
    EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;
    ASSERT_TRUE((*w)->Commit().ok());
  }
  EXPECT_EQ(Read(path), "header crc! data");
  {
    auto w = DurableFileWriter::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append("half of a new file").ok());
  }  // dropped without Commit
  EXPECT_EQ(Read(path), "header crc! data");
  EXPECT_EQ(Entries(dir), std::vector<std::string>{"f"});
}

// Two writers of one path at once (threads of one process) each write their
// own temporary file: each Commit publishes a whole file, the last one's. A
// file a dead process of this pid left at the first name is not cut.
TEST(DurableFileTest, TwoWritersOfOnePathEachCommitAWholeFile) {
  const std::string dir = ::testing::TempDir() + "/durable_two";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/f";
  const std::string stale = path + ".tmp." + std::to_string(::getpid());
  std::ofstream(stale) << "left by a crash";
  auto first = DurableFileWriter::Create(path);
  auto second = DurableFileWriter::Create(path);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE((*first)->Append("first, ").ok());
  ASSERT_TRUE((*second)->Append("second").ok());
  ASSERT_TRUE((*first)->Append("whole").ok());
  ASSERT_TRUE((*first)->Commit().ok());
  EXPECT_EQ(Read(path), "first, whole");
  ASSERT_TRUE((*second)->WriteAt(0, "S").ok());
  const absl::Status committed = (*second)->Commit();
  ASSERT_TRUE(committed.ok()) << committed;
  EXPECT_EQ(Read(path), "Second");
  EXPECT_EQ(Read(stale), "left by a crash");
  std::vector<std::string> names = Entries(dir);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"f", stale.substr(dir.size() + 1)}));
}

// A folder moves onto a new name, then replaces an older folder as a whole
// (none of the old one's files stay); a missing source names the target.
TEST(DurableFileTest, ParentFolder) {
  EXPECT_EQ(ParentFolder("ck/step_000010"), "ck");
  EXPECT_EQ(ParentFolder("/tmp/a/b"), "/tmp/a");
  EXPECT_EQ(ParentFolder("/ck"), "/");
  EXPECT_EQ(ParentFolder("ck"), ".");
}

TEST(DurableFileTest, ReplaceFolderDurablyRenamesOrSwaps) {
  namespace fs = std::filesystem;
  const std::string root = ::testing::TempDir() + "/durable_folder";
  fs::remove_all(root);
  fs::create_directories(root + "/tmp");
  ASSERT_TRUE(WriteFileDurably(root + "/tmp/a", "1").ok());
  ASSERT_TRUE(ReplaceFolderDurably(root + "/tmp", root + "/dir", "t").ok());
  EXPECT_EQ(Read(root + "/dir/a"), "1");
  fs::create_directories(root + "/tmp");
  ASSERT_TRUE(WriteFileDurably(root + "/tmp/b", "2").ok());
  ASSERT_TRUE(ReplaceFolderDurably(root + "/tmp", root + "/dir", "t").ok());
  EXPECT_EQ(Entries(root + "/dir"), std::vector<std::string>{"b"});
  EXPECT_EQ(Entries(root), std::vector<std::string>{"dir"});
  absl::Status missing = ReplaceFolderDurably(root + "/none", root + "/other", "t");
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(missing.message().find(root + "/other"), std::string::npos) << missing;
}

}  // namespace
}  // namespace tensor
