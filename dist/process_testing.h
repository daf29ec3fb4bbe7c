// Tests across real processes: forks ranks that each run a body and report
// "" (success) or what went wrong, with a wall-clock limit; a scratch path
// under TEST_TMPDIR; a cap on a process's address space, so that a large
// allocation fails as it would on a full host. Test-only.
#ifndef DIST_PROCESS_TESTING_H_
#define DIST_PROCESS_TESTING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace dist {
namespace testing {

// A fresh path "<TEST_TMPDIR or /tmp>/<name>_<pid>_<micros>" (not created).
std::string TmpDir(const std::string& name);

// A rank's body: returns "" on success, else the failure.
using RankBody = std::function<std::string(int rank, int size)>;

struct Outcome {
  std::vector<int> exit_codes;  // 0 ok, 1 failed, 128 + signal, 999 killed at the limit
  std::vector<std::string> messages;
  absl::Duration elapsed;
};

// Forks `size` ranks running body(rank, size) (an exception is a failure);
// each writes its message to a file. Kills everything after `limit`.
Outcome RunProcesses(int size, const RankBody& body, absl::Duration limit = absl::Seconds(60));

// EXPECTs every rank of `o` to have succeeded, printing the others' messages.
void ExpectAllOk(const Outcome& o);

// Limits this process's address space to what it maps now plus `headroom`
// bytes (the soft limit), and keeps new threads to malloc's arenas made so
// far (a new one reserves 64 MiB), for good; false when it cannot.
bool LimitAddressSpace(int64_t headroom);
// Lifts that limit (the soft limit back to the hard one); false when it cannot.
bool LiftAddressSpaceLimit();

}  // namespace testing
}  // namespace dist

// In a RankBody: returns the status's text when `expr` is not ok; returns
// "rank <rank>: <what>" when `cond` is false.
#define RETURN_IF_ERROR_MSG(expr)                    \
  do {                                               \
    absl::Status _s = (expr);                        \
    if (!_s.ok()) return std::string(_s.ToString()); \
  } while (0)
#define EXPECT_OR_MSG(cond, what)                                \
  do {                                                           \
    if (!(cond)) return absl::StrCat("rank ", rank, ": ", what); \
  } while (0)

#endif  // DIST_PROCESS_TESTING_H_
