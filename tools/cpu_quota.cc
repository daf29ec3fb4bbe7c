// CgroupCpuLimit (cpu_quota.h): reads the cgroup mounts, this process's
// cgroups and their CPU quotas.
#include "tools/cpu_quota.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tools {
namespace {


// A mountinfo field as a path: the kernel writes a space, tab, newline and
// backslash in one as an octal escape ("\040").
std::string Unescape(const std::string& field) {
  std::string path;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](size_t j, char max) { return field[j] >= '0' && field[j] <= max; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1, '3') && octal(i + 2, '7') &&
        octal(i + 3, '7')) {
      path += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                (field[i + 3] - '0'));
      i += 3;
    } else {
      path += field[i];
    }
  }
  return path;
}


// Whether a comma-separated list of controllers ("rw,cpu,cpuacct") names
// the cpu controller.
bool NamesCpu(absl::string_view list) {
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    if (item == "cpu") return true;
  }
  return false;
}

// The first line of `path`, or "" when it cannot be read.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// CPUs of a quota over a period, rounded up; 0 when unlimited or unreadable.
int Cpus(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((quota + period - 1) / period, 1 << 20));
}

// One cgroup directory's limit: v2's "cpu.max" ("max 100000", "400000
// 100000"), v1's cpu.cfs_quota_us ("-1": none) and cpu.cfs_period_us.
int DirLimit(const std::string& dir, bool v2) {
  int64_t quota = 0, period = 0;
  if (v2) {
    const std::vector<std::string> max = absl::StrSplit(FirstLine(dir + "/cpu.max"), ' ');
    if (max.size() < 2 || !absl::SimpleAtoi(max[0], &quota) ||
        !absl::SimpleAtoi(max[1], &period)) {
      return 0;
    }
  } else if (!absl::SimpleAtoi(FirstLine(dir + "/cpu.cfs_quota_us"), &quota) ||
             !absl::SimpleAtoi(FirstLine(dir + "/cpu.cfs_period_us"), &period)) {
    return 0;
  }
  return Cpus(quota, period);
}

// The least limit from `dir` up to `top` (both absolute, `dir` under `top`).
int LeastUpTo(std::string dir, const std::string& top, bool v2) {
  int least = 0;
  for (;;) {
    const int limit = DirLimit(dir, v2);
    if (limit > 0 && (least == 0 || limit < least)) least = limit;
    if (dir.size() <= top.size()) return least;
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash < top.size()) {
      dir = top;
    } else {
      dir.resize(slash);
    }
  }
}

// This process's cgroup path in the hierarchy of v2 (`v2`) or of v1's cpu
// controller, from /proc/self/cgroup ("0::/path", "3:cpu,cpuacct:/path").
bool CgroupPath(const std::string& root, bool v2, std::string* path) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool match = v2 ? line.substr(0, a) == "0" && controllers.empty()
                          : NamesCpu(controllers);
    if (match) {
      *path = line.substr(b + 1);
      return true;
    }
  }
  return false;
}

}  // namespace

int CgroupCpuLimit(const std::string& root) {
  std::ifstream mounts(root + "/proc/self/mountinfo");
  std::string line;
  int least = 0;
  while (std::getline(mounts, line)) {
    // "36 25 0:31 <root> <mount point> <options> [optional...] - <type> <source> <super options>"
    const std::vector<std::string> f = absl::StrSplit(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string& type = dash[1];
    const bool v2 = type == "cgroup2";
    if (!v2 && (type != "cgroup" || !NamesCpu(dash[3]))) continue;
    std::string path;
    if (!CgroupPath(root, v2, &path)) continue;
    // The path is from the hierarchy's root; the mount shows it from
    // `mount_root` (a container's own cgroup, without a cgroup namespace).
    // Another path (a cgroup namespace's view that does not start there):
    // the mount's own top, this process's cgroup or an ancestor of it.
    const std::string mount_root = Unescape(f[3]);
    if (mount_root != "/") {
      const bool under = path.compare(0, mount_root.size(), mount_root) == 0 &&
                         (path.size() == mount_root.size() || path[mount_root.size()] == '/');
      path = under ? path.substr(mount_root.size()) : "";
    }
    if (path == "/") path.clear();
    const std::string top = root + Unescape(f[4]);
    const int limit = LeastUpTo(top + path, top, v2);
    if (limit > 0 && (least == 0 || limit < least)) least = limit;
  }
  return least;
}

}  // namespace tools
