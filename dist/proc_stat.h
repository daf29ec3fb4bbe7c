// A process's state and start time, from Linux's /proc/<pid>/stat: whether
// a peer on this host has exited (a zombie counts), and when this process
// started (to tell a rendezvous key an earlier run left).
#ifndef DIST_PROC_STAT_H_
#define DIST_PROC_STAT_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace dist {

struct ProcStat {
  char state = '?';         // 'R', 'S', ...; 'Z' a zombie, 'X' dead
  int64_t start_ticks = 0;  // the 22nd field: clock ticks after boot
};

// /proc/<pid>/stat of `pid` (0: this process); nullopt when there is no
// such process or the line cannot be read.
std::optional<ProcStat> ReadProcStat(int64_t pid);

// True when `pid` is gone, a zombie or dead (its stat cannot be read, or its
// state is 'Z' or 'X').
bool ProcessExited(int64_t pid);

// When `pid` (0: this process) started: its start ticks after the boot time
// (/proc/stat's btime); nullopt where either cannot be read.
std::optional<absl::Time> ProcessStartTime(int64_t pid);

}  // namespace dist

#endif  // DIST_PROC_STAT_H_
