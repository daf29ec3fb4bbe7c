// ReadProcStat, ProcessExited and ProcessStartTime (proc_stat.h).
#include "dist/proc_stat.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace dist {

std::optional<ProcStat> ReadProcStat(int64_t pid) {
  std::ifstream file(pid == 0 ? std::string("/proc/self/stat") : absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(file, line)) return std::nullopt;
  // "pid (comm) S ...": the command name may hold spaces and parentheses.
  const size_t comm_end = line.rfind(')');
  if (comm_end == std::string::npos) return std::nullopt;
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(line).substr(comm_end + 1), ' ', absl::SkipEmpty());
  ProcStat stat;  // fields[0] is the 3rd field (state): the 22nd is fields[19]
  if (fields.size() < 20 || fields[0].size() != 1 ||
      !absl::SimpleAtoi(fields[19], &stat.start_ticks)) {
    return std::nullopt;
  }
  stat.state = fields[0][0];
  return stat;
}

bool ProcessExited(int64_t pid) {
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  return !stat.has_value() || stat->state == 'Z' || stat->state == 'X';
}

std::optional<absl::Time> ProcessStartTime(int64_t pid) {
  const std::optional<ProcStat> stat = ReadProcStat(pid);
  if (!stat.has_value()) return std::nullopt;
  std::ifstream proc_stat("/proc/stat");
  std::string line;
  int64_t boot = -1;
  while (std::getline(proc_stat, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "btime ") && absl::SimpleAtoi(rest, &boot)) break;
  }
  const long per_second = ::sysconf(_SC_CLK_TCK);
  if (boot < 0 || per_second <= 0) return std::nullopt;
  return absl::FromUnixSeconds(boot) +
         absl::Seconds(static_cast<double>(stat->start_ticks) / per_second);
}

}  // namespace dist
