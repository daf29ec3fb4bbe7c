// Runfiles lookup: the shipped text through the test's runfiles, another
// workspace name, RUNFILES_DIR, BUILD_WORKSPACE_DIRECTORY, and a clear NotFound.
#include "models/data/runfiles.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace data {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

void MakeDirs(const std::string& path) {
  std::string prefix;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
  }
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_;
  std::string old_;
};

TEST(RunfilesTest, FindsTheShippedText) {
  auto path = ResolveRunfile("models/data/text/newton_opticks.txt");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(FileSize(*path), 567198) << *path;
  EXPECT_FALSE(RunfilesDirs().empty());
}

TEST(RunfilesTest, MissingFileListsWhereItLooked) {
  auto path = ResolveRunfile("models/data/no_such_file.txt");
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(path.status().message());
  EXPECT_NE(msg.find("cannot find models/data/no_such_file.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/fsdp/models/data/no_such_file.txt"), std::string::npos) << msg;
}

TEST(RunfilesTest, FindsFilesUnderAnotherWorkspaceName) {
  const std::string root = TempDir() + "/rf_other";
  MakeDirs(root + "/my_fsdp_checkout/models/data");
  WriteFile(root + "/my_fsdp_checkout/models/data/only_there.txt", "hello");
  ScopedEnv env("RUNFILES_DIR", root);
  auto path = ResolveRunfile("models/data/only_there.txt");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, root + "/my_fsdp_checkout/models/data/only_there.txt");
}

TEST(RunfilesTest, RunfilesDirComesFirst) {
  const std::string root = TempDir() + "/rf_first";
  MakeDirs(root + "/fsdp/models/data/text");
  WriteFile(root + "/fsdp/models/data/text/newton_opticks.txt", "shadow");
  ScopedEnv env("RUNFILES_DIR", root);
  auto path = ResolveRunfile("models/data/text/newton_opticks.txt");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, root + "/fsdp/models/data/text/newton_opticks.txt");
}

TEST(RunfilesTest, FallsBackToTheWorkspaceDirectory) {
  const std::string ws = TempDir() + "/workspace";
  MakeDirs(ws + "/data");
  WriteFile(ws + "/data/in_workspace.txt", "x");
  ScopedEnv env("BUILD_WORKSPACE_DIRECTORY", ws);
  auto path = ResolveRunfile("data/in_workspace.txt");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, ws + "/data/in_workspace.txt");
}

TEST(RunfilesTest, AbsolutePaths) {
  const std::string file = TempDir() + "/absolute.txt";
  WriteFile(file, "x");
  auto found = ResolveRunfile(file);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, file);
  auto missing = ResolveRunfile(TempDir() + "/absent.txt");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ResolveRunfile("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace data
