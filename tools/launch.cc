// launch: starts the worker processes of a training job on this node, like
// torchrun.
//
//   launch --nproc_per_node=4 [--nnodes=2 --node_rank=0
//          --rdzv_endpoint=host:port --rdzv_id=job42] [--max_restarts=3]
//          [--grace_period_s=5] [--] ./train --flags...
//
// As torchrun's: one worker unless --nproc_per_node says more; the worker
// command starts at "--" or at the first argument
// that is not a flag of the launcher (a flag's value may follow it after a
// space), flags may be spelled with dashes (--nproc-per-node), and
// --standalone is accepted (one node, the default endpoint). Under `bazel
// run` the launcher changes to the directory bazel was run from
// (BUILD_WORKING_DIRECTORY), so that a relative worker path means that one.
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK (the node rank), MASTER_ADDR, MASTER_PORT, RESTART_COUNT,
// RUN_ID and LAUNCH_ID (this launch's, the same for its restarts, whatever
// --rdzv_id says) in its environment, and FSDP_NUM_THREADS (its tensor thread pool's
// size), OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = the cores this launcher
// may use (its affinity mask, or its cgroup's CPU quota when that allows
// fewer) / --nproc_per_node (at least 1), each unless the launcher's
// environment sets it. RUN_ID names this run, so that workers can keep
// their rendezvous keys apart from those an earlier run left in a store:
// --rdzv_id when given (give every node's launcher the same one), otherwise a
// fresh id per launch on one node ("<pid>-<microseconds since the epoch>") and
// "none" on several nodes (as torchrun). Every line a worker writes is
// printed prefixed with "[rank N] ", its stdout's on stdout and its
// stderr's on stderr (as torchrun keeps them). When a worker fails
// (non-zero exit or a signal), the launcher names it (when several fail
// within 200 ms, as peers of a dead worker do, the root cause first: one killed
// by a signal, else the first reaped; then the others), stops the others
// (SIGTERM to each worker's process group, SIGKILL after the grace period) and
// either restarts all of them (they resume from their own latest checkpoint)
// while --max_restarts allows, or exits 1. SIGINT, SIGTERM, SIGHUP or SIGQUIT
// to the launcher stop the workers the same way, and a launcher that dies
// anyway (SIGKILL) takes its workers with it (each gets SIGTERM from the
// kernel, PR_SET_PDEATHSIG). Once its workers have ended, whatever they left
// running in their process groups is killed, so that nothing holds their
// output (nor a GPU) after the launch ends. SIGHUP, SIGINT or SIGQUIT ignored
// when the launcher starts (nohup's SIGHUP; a script's `launch ... &`
// ignores SIGINT and SIGQUIT) stays ignored, in the workers too; SIGTERM is
// always the stop signal, and always the default in the workers (the
// launcher's death must reach them). A reader of the launcher's output that
// went away (`| head`, `| tee` after Ctrl-C) stops the workers the same way
// (exit 141, 128 + SIGPIPE, as its death by SIGPIPE would show) instead of
// killing the launcher before it could stop them. When its stdin is a
// terminal the workers read /dev/null (in process groups of their own, a
// read of the terminal would stop them unseen).
// --max_restarts takes one node only: with several, each node's launcher
// could restart only its own workers (no cross-node coordination), and the
// nodes' attempts would not meet.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tools/cpu_quota.h"

namespace {

std::mutex out_mu;
// The signal that stops the workers; SIGPIPE (which the launcher ignores)
// when a write of their output found its reader gone (EPIPE).
std::atomic<int> stop_signal{0};

void OnSignal(int sig) { stop_signal = sig; }

// Writes a worker's line to `out` (stdout, or the unbuffered stderr: each
// call checked, since a flush after a failed unbuffered write has nothing to
// say). A line that could not be written because the output's reader went
// away (EPIPE): the job's output is lost from here on, so the launch stops,
// as its death by SIGPIPE would have ended it (a stop signal already
// received is kept).
void WriteLine(std::FILE* out, const std::string& prefix, const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mu);
  const bool written = std::fwrite(prefix.data(), 1, prefix.size(), out) == prefix.size() &&
                       std::fwrite(line.data(), 1, line.size(), out) == line.size() &&
                       std::fputc('\n', out) != EOF && std::fflush(out) == 0;
  if (!written && errno == EPIPE) {  // errno: the failed call's
    int none = 0;
    stop_signal.compare_exchange_strong(none, SIGPIPE);
  }
}

// What stop_signal's value `sig` (nonzero) says stopped the launch.
std::string StopCause(int sig) {
  return sig == SIGPIPE ? "the reader of the launch's output went away (EPIPE)"
                        : std::string("received ") + strsignal(sig);
}

void Say(const std::string& s) {
  std::lock_guard<std::mutex> lock(out_mu);
  std::fprintf(stderr, "launch: %s\n", s.c_str());
  std::fflush(stderr);
}

constexpr char kUsage[] =
    "usage: launch [--nproc_per_node=1] [--nnodes=1] [--node_rank=0] "
    "[--rdzv_endpoint=host:port] [--rdzv_id=ID] [--max_restarts=0] [--grace_period_s=5] "
    "[--standalone] [--] command [args...]\n";

// --help: the usage line and what each flag does.
constexpr char kHelp[] =
    "Starts the worker processes of a training job on this node, like torchrun.\n"
    "\n"
    "  --nproc_per_node=N    workers on this node (default 1)\n"
    "  --nnodes=N            nodes in the job, each with its own launcher (default 1)\n"
    "  --node_rank=R         this node's index in [0, --nnodes) (default 0)\n"
    "  --rdzv_endpoint=H:P   rank 0's host and port, MASTER_ADDR / MASTER_PORT of every\n"
    "                        worker (required with --nnodes > 1; default 127.0.0.1:29500)\n"
    "  --rdzv_id=ID          the job's id, the same on every node: RUN_ID, which keeps its\n"
    "                        rendezvous keys apart (default: fresh per launch on one node)\n"
    "  --max_restarts=N      restart every worker up to N times after one fails (one node\n"
    "                        only; --resume=auto continues from the last checkpoint)\n"
    "  --grace_period_s=S    seconds between SIGTERM and SIGKILL when stopping workers (5)\n"
    "  --standalone          one node on this host (torchrun's flag; the default here)\n"
    "\n"
    "Flags may be spelled with dashes (--nproc-per-node). The worker command starts at --\n"
    "or at the first argument that does not start with '-'. Each worker gets RANK,\n"
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,\n"
    "RESTART_COUNT, RUN_ID, LAUNCH_ID and its share of the cores (FSDP_NUM_THREADS,\n"
    "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS); its lines are printed prefixed \"[rank N] \".\n"
    "A failed worker is named and the others stopped; the launch exits 1 (128 + N when\n"
    "the launcher gets signal N; 141 when the reader of its output went away). On\n"
    "several nodes the train binaries' gloo workers also need --rdzv=<a folder every\n"
    "node can write> or --rdzv=redis://host:port for their rendezvous store.\n";

[[noreturn]] void Usage(const std::string& problem) {
  std::fprintf(stderr, "launch: %s\n%s", problem.c_str(), kUsage);
  std::exit(2);
}

// A decimal int (no wrap-around: "4294967297" is refused, not 1).
bool ParseInt(const std::string& s, int* v) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || x < INT_MIN || x > INT_MAX) return false;
  *v = static_cast<int>(x);
  return true;
}

// At most this many workers a node: each holds two pipes' read ends and two
// threads here (and a training process, a GPU or cores there).
constexpr int kMaxWorkersPerNode = 1024;

// Copies lines from `fd` to `out` (stdout or stderr), each prefixed with
// `prefix`, until the pipe's last writer closes it; or, once `finish` is set
// (the worker and its process group are gone), until the pipe stays empty
// for half a second, or, past what the pipe held then, for two seconds at
// most: a process that left the worker's group (setsid) may hold it open,
// and write to it, for ever.
void Pump(int fd, std::string prefix, const std::atomic<bool>* finish, std::FILE* out) {
  std::string pending;
  char buf[4096];
  auto emit = [&](const std::string& line) { WriteLine(out, prefix, line); };
  // Once `finish` is seen: what the pipe held then (the worker's last
  // output) is always copied; the two seconds bound what comes after it.
  std::optional<std::chrono::steady_clock::time_point> finishing;
  int64_t owed = 0;  // bytes the pipe held when `finish` was seen, not yet read
  bool cut = false;  // stopped by the bound, not by the end of the pipe
  while (true) {
    if (finish->load()) {
      const auto now = std::chrono::steady_clock::now();
      if (!finishing) {
        finishing = now;
        int held = 0;
        if (ioctl(fd, FIONREAD, &held) == 0) owed = held;
      }
      if (owed <= 0 && now - *finishing > std::chrono::seconds(2)) {
        cut = true;
        break;
      }
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, 500);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (finish->load()) break;
      continue;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    owed -= n;
    pending.append(buf, static_cast<size_t>(n));
    size_t pos;
    while ((pos = pending.find('\n')) != std::string::npos) {
      emit(pending.substr(0, pos));
      pending.erase(0, pos + 1);
    }
  }
  // A last line without its newline: the worker's (at the pipe's end), or
  // one the bound cut, said as such.
  if (!pending.empty()) emit(cut ? pending + " [cut: the launch stopped reading]" : pending);
  close(fd);
}

struct Worker {
  int rank = 0;
  pid_t pid = -1;  // also its process group's id
  bool done = false;
  int status = 0;
  std::thread pump_out, pump_err;   // its stdout's and its stderr's lines
  std::atomic<bool> finish{false};  // the pumps stop at the next quiet half second
};

// Reaps every worker that has exited, without blocking; a failed one (non-zero
// exit or a signal) is appended to `failures`. Returns whether any was reaped.
bool ReapExited(std::vector<Worker>& workers, int& running, std::vector<int>& failures) {
  bool any = false;
  for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
    Worker& w = workers[i];
    int status = 0;
    if (w.done || waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.done = true;
    w.status = status;
    --running;
    any = true;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failures.push_back(i);
  }
  return any;
}

// The failure that most likely caused the others, as torchrun's "root cause":
// a worker killed by a signal (nothing of ours has signalled the workers yet,
// and it cannot have been reacting to a peer), else the first one reaped.
int RootCause(const std::vector<Worker>& workers, const std::vector<int>& failures) {
  for (int i : failures) {
    if (WIFSIGNALED(workers[i].status)) return i;
  }
  return failures.front();
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "status " + std::to_string(status);
}

// The CPUs this process may run on (its affinity mask, any size), or the
// hardware's count when that cannot be read. A cgroup's CPU quota may allow
// fewer (CgroupCpuLimit, in main).
int UsableCores() {
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  const int n = static_cast<int>(std::max(1024L, configured));
  cpu_set_t* set = CPU_ALLOC(n);
  int cores = 0;
  if (set != nullptr) {
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) cores = CPU_COUNT_S(bytes, set);
    CPU_FREE(set);
  }
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(cores, 1);
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 1, nnodes = 1, node_rank = 0, max_restarts = 0, grace_s = 5;  // torchrun's
  bool standalone = false;
  std::string endpoint, run_id;
  std::vector<std::string> cmd;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--" || a.empty() || a[0] != '-') {  // the worker command
      for (int j = a == "--" ? i + 1 : i; j < argc; ++j) cmd.push_back(argv[j]);
      break;
    }
    if (a == "--help" || a == "-h") {
      std::printf("%s\n%s", kUsage, kHelp);
      return 0;
    }
    auto eq = a.find('=');
    std::string name = a.substr(0, eq), value;
    // torchrun's spellings: --nproc-per-node is --nproc_per_node.
    for (size_t c = 2; c < name.size(); ++c) {
      if (name[c] == '-') name[c] = '_';
    }
    if (name == "--standalone" && eq == std::string::npos) {
      standalone = true;
      continue;
    }
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Usage("flag " + a + " needs a value");
    }
    int* target = name == "--nproc_per_node"   ? &nproc
                  : name == "--nnodes"         ? &nnodes
                  : name == "--node_rank"      ? &node_rank
                  : name == "--max_restarts"   ? &max_restarts
                  : name == "--grace_period_s" ? &grace_s
                                               : nullptr;
    if (name == "--rdzv_endpoint") {
      endpoint = value;
    } else if (name == "--rdzv_id") {
      if (value.empty()) Usage("--rdzv_id must not be empty");
      run_id = value;
    } else if (target == nullptr) {
      Usage("unknown flag " + name + " (the worker command goes after the launcher's flags, or "
            "after --)");
    } else if (!ParseInt(value, target)) {
      Usage("flag " + name + " needs an integer, got \"" + value + "\"");
    }
  }
  if (cmd.empty()) Usage("no worker command");
  if (standalone && (nnodes != 1 || !endpoint.empty())) {
    Usage("--standalone is one node on this host: not with --nnodes > 1 or --rdzv_endpoint");
  }
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && *dir != 0) {
    if (chdir(dir) != 0) {
      std::fprintf(stderr, "launch: warning: cannot change to BUILD_WORKING_DIRECTORY %s: %s\n",
                   dir, std::strerror(errno));
    }
  }
  if (nproc < 1 || nproc > kMaxWorkersPerNode) {
    Usage("--nproc_per_node must be in [1, " + std::to_string(kMaxWorkersPerNode) + "], got " +
          std::to_string(nproc));
  }
  if (nnodes < 1) Usage("--nnodes must be >= 1, got " + std::to_string(nnodes));
  if (nnodes > INT_MAX / nproc) Usage("--nnodes x --nproc_per_node must fit an int");
  if (node_rank < 0 || node_rank >= nnodes) {
    Usage("--node_rank must be in [0, --nnodes=" + std::to_string(nnodes) + "), got " +
          std::to_string(node_rank));
  }
  if (max_restarts < 0) Usage("--max_restarts must be >= 0, got " + std::to_string(max_restarts));
  if (grace_s < 0) Usage("--grace_period_s must be >= 0, got " + std::to_string(grace_s));
  if (max_restarts > 0 && nnodes > 1) {
    Usage("--max_restarts needs --nnodes=1: each node's launcher would restart only its own "
          "workers, and the nodes' attempts (their rendezvous prefixes) would drift apart; "
          "restart the whole job instead");
  }
  if (endpoint.empty()) {
    if (nnodes > 1) Usage("--rdzv_endpoint=host:port is required with --nnodes > 1");
    endpoint = "127.0.0.1:29500";
  }
  const auto colon = endpoint.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !ParseInt(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    Usage("--rdzv_endpoint must be host:port (a host, and a port in [1, 65535]), got \"" +
          endpoint + "\"");
  }
  const std::string master_addr = endpoint.substr(0, colon);
  const int world = nproc * nnodes;
  // This launch, whatever --rdzv_id says: "<pid>-<microseconds>", the same
  // for its restarts (LAUNCH_ID: a restart knows its own checkpoints by it).
  const std::string launch_id =
      std::to_string(getpid()) + "-" +
      std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  if (run_id.empty()) run_id = nnodes > 1 ? "none" : launch_id;

  // Each worker's tensor thread pool (tensor/thread_pool.h) and oneDNN's
  // OpenMP team (tensor/cpu/matmul.cc) would start a thread per core: the
  // node's workers share the cores instead (torchrun sets OMP_NUM_THREADS=1
  // for the same reason). A variable the launcher's environment sets is
  // passed as it is.
  const int affinity = UsableCores(), quota = tools::CgroupCpuLimit();
  const bool by_quota = quota > 0 && quota < affinity;
  const int cores = by_quota ? quota : affinity;
  const std::string share = std::to_string(std::max(1, cores / nproc));
  std::vector<const char*> thread_vars;
  for (const char* var : {"FSDP_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (std::getenv(var) == nullptr) thread_vars.push_back(var);
  }
  if (nproc > 1 && !thread_vars.empty()) {
    std::string given;
    for (const char* var : thread_vars) given += std::string(" ") + var + "=" + share;
    std::fprintf(stderr,
                 "launch: each worker gets%s (%d cores%s, %d workers); set them to choose\n",
                 given.c_str(), cores, by_quota ? " by the cgroup's CPU quota" : "", nproc);
  }

  // The stop signals, except SIGHUP, SIGINT or SIGQUIT ignored from the
  // start (nohup's SIGHUP: a hangup then stops neither the launcher nor its
  // workers; a script's background job ignores SIGINT and SIGQUIT). SIGTERM
  // is always handled here and the default in the workers, even when the
  // launcher was started ignoring it: it is how the launcher stops them, and
  // their PR_SET_PDEATHSIG. SIGPIPE is ignored here (a reader of the
  // output that went away stops the launch by EPIPE, see WriteLine);
  // the workers get the disposition the launcher was started with.
  std::vector<int> ignored_at_start;
  for (int sig : {SIGINT, SIGHUP, SIGQUIT, SIGPIPE}) {
    struct sigaction was {};
    if (sigaction(sig, nullptr, &was) == 0 && was.sa_handler == SIG_IGN) {
      ignored_at_start.push_back(sig);
    }
  }
  auto ignored = [&](int sig) {
    return std::find(ignored_at_start.begin(), ignored_at_start.end(), sig) !=
           ignored_at_start.end();
  };
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    if (!ignored(sig)) sigaction(sig, &sa, nullptr);
  }
  signal(SIGPIPE, SIG_IGN);
  // A worker reading a terminal it does not own (its own process group)
  // would be stopped by SIGTTIN, unseen: the launch hung. Workers read
  // /dev/null instead of the launcher's terminal (a file or pipe as stdin
  // is passed on as it is).
  const bool stdin_is_terminal = isatty(0) == 1;
  const pid_t launcher = getpid();

  for (int attempt = 0;; ++attempt) {
    std::vector<Worker> workers(nproc);
    // A worker that cannot be started (no file descriptors, no processes
    // left) stops those started before it, as a failed one would.
    std::string start_error;
    int started = 0;
    for (int local = 0; local < nproc; ++local) {
      Worker& w = workers[local];
      w.rank = node_rank * nproc + local;
      int out_fds[2], err_fds[2];
      if (pipe(out_fds) != 0) {
        start_error = std::string("pipe: ") + strerror(errno);
        break;
      }
      if (pipe(err_fds) != 0) {
        start_error = std::string("pipe: ") + strerror(errno);
        close(out_fds[0]);
        close(out_fds[1]);
        break;
      }
      pid_t pid = fork();
      if (pid == 0) {
        setpgid(0, 0);
        // The launcher's handlers go first: its death's SIGTERM must end the
        // worker even before the exec, not be stored by OnSignal.
        for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) {
          signal(sig, ignored(sig) ? SIG_IGN : SIG_DFL);
        }
        // The launcher's death (even by SIGKILL) ends the worker.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != launcher) _exit(1);  // it died before prctl
        dup2(out_fds[1], 1);
        dup2(err_fds[1], 2);
        for (int fd : {out_fds[0], out_fds[1], err_fds[0], err_fds[1]}) close(fd);
        if (stdin_is_terminal) {
          const int null_fd = open("/dev/null", O_RDONLY);
          if (null_fd >= 0) {
            dup2(null_fd, 0);
            if (null_fd != 0) close(null_fd);
          }
        }
        auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
        set("RANK", std::to_string(w.rank));
        set("LOCAL_RANK", std::to_string(local));
        set("WORLD_SIZE", std::to_string(world));
        set("LOCAL_WORLD_SIZE", std::to_string(nproc));
        set("GROUP_RANK", std::to_string(node_rank));
        set("MASTER_ADDR", master_addr);
        set("MASTER_PORT", std::to_string(port));
        set("RESTART_COUNT", std::to_string(attempt));
        set("RUN_ID", run_id);
        set("LAUNCH_ID", launch_id);
        for (const char* var : thread_vars) set(var, share);
        std::vector<char*> args;
        for (auto& c : cmd) args.push_back(const_cast<char*>(c.c_str()));
        args.push_back(nullptr);
        execvp(args[0], args.data());
        std::fprintf(stderr, "launch: cannot run %s: %s\n", args[0], strerror(errno));
        _exit(127);
      }
      close(out_fds[1]);
      close(err_fds[1]);
      if (pid < 0) {
        close(out_fds[0]);
        close(err_fds[0]);
        start_error = std::string("fork: ") + strerror(errno);
        break;
      }
      setpgid(pid, pid);
      w.pid = pid;
      const std::string prefix = "[rank " + std::to_string(w.rank) + "] ";
      w.pump_out = std::thread(Pump, out_fds[0], prefix, &w.finish, stdout);
      w.pump_err = std::thread(Pump, err_fds[0], prefix, &w.finish, stderr);
      ++started;
    }
    for (int i = started; i < nproc; ++i) workers[i].done = true;  // never started

    // Wait until all succeed, one fails, or we are told to stop.
    std::vector<int> failures;  // local ranks, in the order they were reaped
    int running = started;
    while (start_error.empty() && running > 0 && failures.empty() && stop_signal == 0) {
      if (!ReapExited(workers, running, failures)) usleep(20000);
    }
    const int stopped_by = stop_signal.load();
    int said = 0;  // the stop signal the message below names, if it names one
    int failed = -1;
    if (!start_error.empty()) {
      Say("cannot start local rank " + std::to_string(started) + " of " + std::to_string(nproc) +
          ": " + start_error + (running > 0 ? "; stopping the workers started" : ""));
    } else if (!failures.empty()) {
      // A worker's failure makes its peers fail too (a lost peer ends their
      // collectives), often within one poll: let those settle, then name the
      // root cause first and the others after it.
      const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (running > 0 && std::chrono::steady_clock::now() < settle) {
        if (!ReapExited(workers, running, failures)) usleep(10000);
      }
      failed = RootCause(workers, failures);
      Say("rank " + std::to_string(workers[failed].rank) + " (local rank " +
          std::to_string(failed) + ", pid " + std::to_string(workers[failed].pid) +
          ") failed with " + DescribeStatus(workers[failed].status) +
          (running > 0 ? "; stopping the other workers" : ""));
      for (int i : failures) {
        if (i == failed) continue;
        Say("rank " + std::to_string(workers[i].rank) + " (local rank " + std::to_string(i) +
            ", pid " + std::to_string(workers[i].pid) + ") also failed with " +
            DescribeStatus(workers[i].status));
      }
    } else if (stopped_by != 0) {
      Say(StopCause(stopped_by) + "; stopping the workers");
      said = stopped_by;
    }
    // Stop the rest: SIGTERM, then SIGKILL after the grace period.
    if (running > 0) {
      for (auto& w : workers) {
        if (!w.done) kill(-w.pid, SIGTERM);
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
      bool killed = false;
      while (running > 0) {
        if (!killed && std::chrono::steady_clock::now() >= deadline) {
          for (auto& w : workers) {
            if (!w.done) {
              Say("rank " + std::to_string(w.rank) + " did not stop within " +
                  std::to_string(grace_s) + " s of SIGTERM; sending SIGKILL");
              kill(-w.pid, SIGKILL);
            }
          }
          killed = true;
        }
        std::vector<int> stopped;  // how the workers we stop end is expected: not reported
        ReapExited(workers, running, stopped);
        if (running > 0) usleep(20000);
      }
    }
    // What the workers left in their process groups (a child sent to the
    // background) would hold their output pipes, and maybe a device: killed.
    for (auto& w : workers) {
      if (w.pid > 0) kill(-w.pid, SIGKILL);
      w.finish = true;
    }
    for (auto& w : workers) {
      if (w.pump_out.joinable()) w.pump_out.join();
      if (w.pump_err.joinable()) w.pump_err.join();
    }
    if (const int stop = stop_signal.load(); stop != 0) {
      // One the message above did not name (it came with a failure, while
      // the workers were stopped or their last output copied): said here,
      // since no restart follows.
      if (stop != said) {
        Say(StopCause(stop) + (failed >= 0 && attempt < max_restarts ? "; not restarting" : ""));
      }
      return 128 + stop;
    }
    if (!start_error.empty()) return 1;  // no restart: it would fail the same way
    if (failed < 0) return 0;
    if (attempt < max_restarts) {
      Say("restarting all " + std::to_string(nproc) + " workers (restart " +
          std::to_string(attempt + 1) + " of " + std::to_string(max_restarts) + ")");
      continue;
    }
    Say("giving up: rank " + std::to_string(workers[failed].rank) + " failed with " +
        DescribeStatus(workers[failed].status) +
        (max_restarts > 0 ? " after " + std::to_string(max_restarts) + " restarts" : ""));
    return 1;
  }
}
