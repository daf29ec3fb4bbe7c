// CgroupCpuLimit: how many CPUs this process's cgroup CPU quota allows, for
// the launcher's share of cores per worker (a container started with
// `docker run --cpus=4` or a Kubernetes CPU limit sees every core of the
// host in its affinity mask, but may use 4 of them).
#ifndef TOOLS_CPU_QUOTA_H_
#define TOOLS_CPU_QUOTA_H_

#include <string>

namespace tools {

// The least CPU quota over this process's cgroup and its ancestors up to
// their mount (cgroup v2's cpu.max, v1's cpu.cfs_quota_us over
// cpu.cfs_period_us; both where both are mounted), in CPUs rounded up; 0
// when none limits it or none can be read. The cgroups are found as the
// JVM and Go's automaxprocs find them: their mounts in /proc/self/mountinfo,
// this process's paths in /proc/self/cgroup. `root` prefixes every path
// read (tests give a directory laid out like /).
int CgroupCpuLimit(const std::string& root = "");

}  // namespace tools

#endif  // TOOLS_CPU_QUOTA_H_
