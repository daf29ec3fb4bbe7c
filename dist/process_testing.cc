// Forking ranks for tests across real processes (see process_testing.h).
#include "dist/process_testing.h"

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dist {
namespace testing {

std::string TmpDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return absl::StrCat(t ? t : "/tmp", "/", name, "_", getpid(), "_",
                      absl::ToUnixMicros(absl::Now()));
}

// Forks `size` ranks running body(rank, size); each writes its message to a
// file. Kills everything after `limit`.
Outcome RunProcesses(int size, const RankBody& body, absl::Duration limit) {
  const std::string dir = TmpDir("msgs");
  mkdir(dir.c_str(), 0755);
  std::vector<pid_t> pids;
  const absl::Time start = absl::Now();
  for (int r = 0; r < size; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string msg;
      try {
        msg = body(r, size);
      } catch (const std::exception& e) {
        msg = absl::StrCat("exception: ", e.what());
      }
      std::ofstream(absl::StrCat(dir, "/", r)) << msg;
      _exit(msg.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  Outcome out;
  out.exit_codes.assign(size, -1);
  int left = size;
  while (left > 0) {
    for (int r = 0; r < size; ++r) {
      if (out.exit_codes[r] != -1) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        out.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (absl::Now() - start > limit) {
      for (int r = 0; r < size; ++r) {
        if (out.exit_codes[r] == -1) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          out.exit_codes[r] = 999;
        }
      }
      break;
    }
    usleep(10000);
  }
  out.elapsed = absl::Now() - start;
  for (int r = 0; r < size; ++r) {
    std::ifstream in(absl::StrCat(dir, "/", r));
    std::stringstream ss;
    ss << in.rdbuf();
    out.messages.push_back(ss.str());
  }
  return out;
}

void ExpectAllOk(const Outcome& o) {
  for (size_t r = 0; r < o.exit_codes.size(); ++r) {
    EXPECT_EQ(o.exit_codes[r], 0) << "rank " << r << ": " << o.messages[r];
  }
}

bool LimitAddressSpace(int64_t headroom) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) != 0) continue;
    const int64_t mapped = std::atoll(line.c_str() + 7) * 1024;
    struct rlimit limit {};
    if (getrlimit(RLIMIT_AS, &limit) != 0) return false;
    limit.rlim_cur = static_cast<rlim_t>(mapped + headroom);
    // A thread's first allocation may reserve a malloc arena of its own (64
    // MiB of address space), past a small headroom: a bad_alloc in whichever
    // thread (gloo's, the pool's) first allocates after the limit, depending
    // on timing. New threads share the arenas made so far instead (unless
    // glibc fixed its arena limit already: past 8 arenas). It stays so.
    mallopt(M_ARENA_MAX, 1);
    return setrlimit(RLIMIT_AS, &limit) == 0;
  }
  return false;
}

bool LiftAddressSpaceLimit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0) return false;
  limit.rlim_cur = limit.rlim_max;
  return setrlimit(RLIMIT_AS, &limit) == 0;
}

}  // namespace testing
}  // namespace dist
