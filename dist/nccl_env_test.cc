// nccl_env.h: which of NCCL's configuration files set a variable.
#include "dist/nccl_env.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace dist {
namespace nccl {
namespace {

std::string TmpDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

GetEnv Fake(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(NcclEnvTest, AConfigurationFileThatSetsTheVariableIsFound) {
  const std::string home = TmpDir() + "/home";
  std::remove((home + "/.nccl.conf").c_str());
  std::filesystem::create_directories(home);
  EXPECT_FALSE(SetInNcclConfFiles("NCCL_RUNTIME_CONNECT", Fake({{"HOME", home}})));
  Write(home + "/.nccl.conf",
        "# NCCL_RUNTIME_CONNECT=1 (a comment)\nNCCL_DEBUG=WARN\n  NCCL_RUNTIME_CONNECT = 1\n");
  EXPECT_TRUE(SetInNcclConfFiles("NCCL_RUNTIME_CONNECT", Fake({{"HOME", home}})));
  EXPECT_TRUE(SetInNcclConfFiles("NCCL_DEBUG", Fake({{"HOME", home}})));
  EXPECT_FALSE(SetInNcclConfFiles("NCCL_RUNTIME", Fake({{"HOME", home}})));
  // NCCL_CONF_FILE replaces the user's and the system's files.
  const std::string other = TmpDir() + "/other.conf";
  Write(other, "NCCL_DEBUG=INFO\n# NCCL_RUNTIME_CONNECT=1\n");
  EXPECT_FALSE(SetInNcclConfFiles("NCCL_RUNTIME_CONNECT",
                                  Fake({{"HOME", home}, {"NCCL_CONF_FILE", other}})));
  EXPECT_TRUE(SetInNcclConfFiles("NCCL_DEBUG", Fake({{"NCCL_CONF_FILE", other}})));
}

}  // namespace
}  // namespace nccl
}  // namespace dist
