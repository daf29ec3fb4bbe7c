// One run at a time per --checkpoint_dir: CheckpointDirLock holds an
// exclusive lock (flock) on "<dir>/.lock" for as long as it lives, with the
// holder ("pid 4242 on host a1", then " for launch <id>" under a launcher)
// written in the file. A second run that
// names the same folder fails at once naming the holder, instead of both
// writing step folders and `latest` into it. The lock goes with its process:
// a run that crashed holds nothing, and its lock file is simply reused.
// (flock is per host unless the file system shares it: NFS v4 and Lustre do.)
#ifndef MODELS_COMMON_CHECKPOINT_DIR_LOCK_H_
#define MODELS_COMMON_CHECKPOINT_DIR_LOCK_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace train {

class CheckpointDirLock {
 public:
  // Locks `dir` (which must exist). FailedPrecondition naming the holder when
  // another run (or another lock of this process) holds it; Unavailable when
  // the lock file cannot be created.
  static absl::StatusOr<CheckpointDirLock> Acquire(const std::string& dir);

  CheckpointDirLock(CheckpointDirLock&& other) noexcept;
  CheckpointDirLock& operator=(CheckpointDirLock&& other) noexcept;
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;
  ~CheckpointDirLock();  // unlocks

 private:
  explicit CheckpointDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// One process's run: "" (no --checkpoint_dir) gives nullopt; otherwise
// PrepareCheckpointDir(dir) (train_support.h), then the lock, which the run
// keeps until it ends.
absl::StatusOr<std::optional<CheckpointDirLock>> PrepareAndLockCheckpointDir(
    const std::string& dir);

}  // namespace train

#endif  // MODELS_COMMON_CHECKPOINT_DIR_LOCK_H_
