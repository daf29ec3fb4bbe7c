// CheckpointDirLock: flock on "<dir>/.lock", the holder written inside.
#include "models/common/checkpoint_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "dist/host_name.h"
#include "models/common/train_support.h"

namespace train {
namespace {

std::string ThisHost() {
  std::string host = dist::HostName();
  return host.empty() ? "an unnamed host" : host;
}

// What the holder wrote: "pid 4242 on host a1"; "" when unreadable or empty.
std::string ReadHolder(int fd) {
  char buffer[512] = {0};
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  if (n <= 0) return "";
  return std::string(absl::StripTrailingAsciiWhitespace(absl::string_view(buffer, n)));
}

}  // namespace

absl::StatusOr<CheckpointDirLock> CheckpointDirLock::Acquire(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/.lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("--checkpoint_dir: cannot create the lock file ",
                                               path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = ReadHolder(fd);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("--checkpoint_dir: cannot lock ", path, ": ", std::strerror(err)));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--checkpoint_dir: ", dir, " is in use by another run (",
        holder.empty() ? "its holder not yet written" : holder, ", which holds ", path,
        "): two runs saving into one folder would mix their step folders and `latest`; give "
        "each run its own --checkpoint_dir, or stop the other"));
  }
  // "... for launch L" lets a restart of the job know the folder is its own
  // (PlanResume).
  const std::string launch = JobAttemptFromEnvironment().launch;
  const std::string me =
      absl::StrCat("pid ", ::getpid(), " on host ", ThisHost(),
                   launch.empty() ? "" : absl::StrCat(" for launch ", launch), "\n");
  // Best effort: the lock works without the note.
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, me.data(), me.size(), 0) < 0) errno = 0;
  return CheckpointDirLock(fd);
}

CheckpointDirLock::CheckpointDirLock(CheckpointDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

CheckpointDirLock& CheckpointDirLock::operator=(CheckpointDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

absl::StatusOr<std::optional<CheckpointDirLock>> PrepareAndLockCheckpointDir(
    const std::string& dir) {
  if (dir.empty()) return std::optional<CheckpointDirLock>();
  absl::Status ready = PrepareCheckpointDir(dir);
  if (!ready.ok()) return ready;
  absl::StatusOr<CheckpointDirLock> lock = CheckpointDirLock::Acquire(dir);
  if (!lock.ok()) return lock.status();
  return std::optional<CheckpointDirLock>(*std::move(lock));
}

}  // namespace train
