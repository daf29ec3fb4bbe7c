// Tests of CgroupCpuLimit over directories laid out like / : cgroup v2 and
// v1 quotas, nested cgroups (the least wins), a container's mount of its own
// cgroup, both hierarchies at once, and no quota or no cgroup files.
#include "tools/cpu_quota.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tools {
namespace {

class CpuQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  // Writes `text` at root_ + path, making its directories.
  void Write(const std::string& path, const std::string& text) {
    const std::string full = root_ + path;
    for (size_t i = root_.size(); i < full.size(); ++i) {
      if (full[i] == '/') ::mkdir(full.substr(0, i).c_str(), 0755);
    }
    std::ofstream(full) << text;
  }
  std::string root_;
};

constexpr char kV2Mount[] = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

TEST_F(CpuQuotaTest, AV2QuotaRoundsUp) {
  Write("/proc/self/mountinfo", kV2Mount);
  Write("/proc/self/cgroup", "0::/\n");
  Write("/sys/fs/cgroup/cpu.max", "350000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 4);
}

TEST_F(CpuQuotaTest, TheLeastOfTheCgroupAndItsAncestorsWins) {
  Write("/proc/self/mountinfo", kV2Mount);
  Write("/proc/self/cgroup", "0::/kubepods/pod1/c1\n");
  Write("/sys/fs/cgroup/kubepods/cpu.max", "1600000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "200000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 2);
}

TEST_F(CpuQuotaTest, NoQuotaIsZero) {
  Write("/proc/self/mountinfo", kV2Mount);
  Write("/proc/self/cgroup", "0::/user.slice\n");
  Write("/sys/fs/cgroup/user.slice/cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 0);
  Write("/sys/fs/cgroup/user.slice/cpu.max", "garbage\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 0);
}

TEST_F(CpuQuotaTest, NoCgroupFilesIsZero) { EXPECT_EQ(CgroupCpuLimit(root_), 0); }

// Docker without a cgroup namespace: /proc/self/cgroup names the host's
// path, of which the container's mount shows the part under its own cgroup
// (here the process is in a child of it, "inner").
TEST_F(CpuQuotaTest, AV1MountOfTheContainersOwnCgroup) {
  Write("/proc/self/mountinfo",
        "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:30 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  Write("/proc/self/cgroup", "5:memory:/docker/abc/inner\n4:cpu,cpuacct:/docker/abc/inner\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/inner/cpu.cfs_quota_us", "300000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/inner/cpu.cfs_period_us", "100000\n");
  Write("/sys/fs/cgroup/memory/cpu.cfs_quota_us", "100000\n");  // not the cpu controller's
  Write("/sys/fs/cgroup/memory/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 3);
  Write("/sys/fs/cgroup/cpu,cpuacct/inner/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 0);
}

// Both hierarchies mounted (systemd's hybrid layout): the lesser quota.
TEST_F(CpuQuotaTest, BothHierarchiesGiveTheLesser) {
  Write("/proc/self/mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  Write("/proc/self/cgroup", "1:cpu:/job\n0::/job\n");
  Write("/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us", "800000\n");
  Write("/sys/fs/cgroup/cpu/job/cpu.cfs_period_us", "100000\n");
  Write("/sys/fs/cgroup/unified/job/cpu.max", "500000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 5);
}

// mountinfo's optional fields ("shared:7") before its "-", and a mount point
// with a space (written "\040").
TEST_F(CpuQuotaTest, OptionalFieldsAndEscapedPaths) {
  Write("/proc/self/mountinfo",
        "30 23 0:26 / /sys/fs/my\\040cgroup rw shared:7 master:2 - cgroup2 cgroup2 rw\n");
  Write("/proc/self/cgroup", "0::/job\n");
  Write("/sys/fs/my cgroup/job/cpu.max", "600000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 6);
}

// A path the mount does not show (outside its root): the mount's top.
TEST_F(CpuQuotaTest, APathOutsideTheMountsRootReadsItsTop) {
  Write("/proc/self/mountinfo",
        "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n");
  Write("/proc/self/cgroup", "4:cpu:/elsewhere\n");
  Write("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "200000\n");
  Write("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(root_), 2);
}

TEST(CpuQuotaOnThisMachineTest, ReadsWithoutFailing) { EXPECT_GE(CgroupCpuLimit(), 0); }

}  // namespace
}  // namespace tools
