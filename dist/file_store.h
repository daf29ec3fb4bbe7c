// dist::FileStore: a Store over a directory on a filesystem that every rank
// sees (local for one host, NFS or similar across hosts), like gloo's and
// torch's FileStore. One file per key, written atomically (temp file, fsync,
// rename), so readers see a whole value or none; Add takes an OFD lock on a
// per-key lock file (works between processes and between threads); Wait
// polls until the keys exist or the timeout passes.
//
// Key names may hold any bytes: they are escaped into file names. The
// directory is not removed when the store is destroyed (other ranks may still
// use it); pick a fresh one per job, or a fresh key prefix in a shared one,
// whose keys DeleteKeysUnder removes once the job is done.
#ifndef DIST_FILE_STORE_H_
#define DIST_FILE_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dist/store.h"

namespace dist {

class FileStore final : public Store {
 public:
  // Uses directory `path`, creating it (and its parents) when missing.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(
      const std::string& path, absl::Duration timeout = DefaultStoreTimeout());

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  // Deletes every key under "<prefix>/" (and its lock file): a run's keys
  // once no process uses them (no Add may be running on one: its lock file
  // goes too). How many keys went; an error naming the first file that could
  // not be listed or removed (the others are still tried). `prefix` must be
  // a key (not empty).
  absl::StatusOr<int> DeleteKeysUnder(absl::string_view prefix);

  const std::string& path() const { return path_; }
  // The file that holds `key` (for tests and debugging).
  std::string PathForKey(absl::string_view key) const;

 protected:
  absl::StatusOr<std::string> DoGet(absl::string_view key, absl::Duration timeout) override;
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override;

 private:
  FileStore(std::string path, absl::Duration timeout) : Store(timeout), path_(std::move(path)) {}
  absl::Status WriteAtomically(const std::string& file, absl::string_view value);
  // The value in `file`; NotFound when it does not exist.
  absl::StatusOr<std::string> ReadFile(const std::string& file) const;

  const std::string path_;
};

namespace internal {
// What a failed file lock with errno `err` says beyond strerror: for the
// errors of filesystems that take no locks, which to use instead ("" for
// others).
std::string FileLockHint(int err);
}  // namespace internal

}  // namespace dist

#endif  // DIST_FILE_STORE_H_
