// dist::FileStore: one file per key in a shared directory.
#include "dist/file_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "dist/host_name.h"

namespace dist {
namespace {

constexpr char kStore[] = "file_store";

absl::Status ErrnoError(absl::string_view what, const std::string& file, int err) {
  return absl::UnavailableError(
      absl::StrCat("[", kStore, "] ", what, " ", file, ": ", std::strerror(err)));
}

// mkdir -p.
absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("[file_store] empty directory path");
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      return ErrnoError("cannot create directory", prefix, errno);
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("cannot stat", path, errno);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("[", kStore, "] ", path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

// Key -> file name: [A-Za-z0-9_-] and '.' (not first) kept, every other byte
// as %XX. Names never start with '.', which the store's own files do.
std::string EscapeKey(absl::string_view key) {
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      static const char kHex[] = "0123456789ABCDEF";
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

bool Exists(const std::string& file) {
  struct stat st;
  return ::stat(file.c_str(), &st) == 0;
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& file) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", file, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// A unique temp-file name in `dir` (unique across hosts, processes, threads).
std::string TempName(const std::string& dir) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(dir, "/.tmp.", EscapeKey(HostName()), ".", ::getpid(), ".",
                      std::hash<std::thread::id>()(std::this_thread::get_id()), ".",
                      counter.fetch_add(1));
}

// Holds an exclusive OFD lock on a file (released on destruction). OFD locks
// belong to the open file description, so they exclude threads of one process
// as well as other processes; they are released when the fd is closed, also
// by a process that dies.
class FileLock {
 public:
  static absl::StatusOr<std::unique_ptr<FileLock>> Acquire(const std::string& file) {
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return ErrnoError("cannot open lock file", file, errno);
    struct flock lock;
    std::memset(&lock, 0, sizeof(lock));
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    while (::fcntl(fd, F_OFD_SETLKW, &lock) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      const absl::Status s = ErrnoError("cannot lock", file, err);
      return absl::Status(s.code(), absl::StrCat(s.message(), internal::FileLockHint(err)));
    }
    return std::unique_ptr<FileLock>(new FileLock(fd));
  }
  ~FileLock() { ::close(fd_); }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace

namespace internal {

std::string FileLockHint(int err) {
  switch (err) {
    case ENOSYS:
    case ENOLCK:
    case EOPNOTSUPP:
    case EINVAL:
      return " (the filesystem takes no file locks, which the store's counters need: Lustre "
             "mounted without -o flock, NFS mounted with nolock; give the store a directory "
             "on a filesystem that takes them, a local one for one node)";
    default:
      return "";
  }
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& path,
                                                           absl::Duration timeout) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  if (absl::Status s = MakeDirs(dir + "/.locks"); !s.ok()) return s;
  return std::unique_ptr<FileStore>(new FileStore(dir, timeout));
}

std::string FileStore::PathForKey(absl::string_view key) const {
  return absl::StrCat(path_, "/", EscapeKey(key));
}

absl::Status FileStore::WriteAtomically(const std::string& file, absl::string_view value) {
  const std::string temp = TempName(path_);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoError("cannot create", temp, errno);
  absl::Status status = WriteAll(fd, value, temp);
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError("cannot fsync", temp, errno);
  if (::close(fd) != 0 && status.ok()) status = ErrnoError("cannot close", temp, errno);
  if (status.ok() && ::rename(temp.c_str(), file.c_str()) != 0) {
    status = ErrnoError("cannot rename to", file, errno);
  }
  if (!status.ok()) ::unlink(temp.c_str());
  return status;
}

absl::StatusOr<std::string> FileStore::ReadFile(const std::string& file) const {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("[", kStore, "] no ", file));
    return ErrnoError("cannot open", file, errno);
  }
  std::string out;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoError("cannot read", file, err);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = internal::CheckKey(kStore, key); !s.ok()) return s;
  return WriteAtomically(PathForKey(key), value);
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = internal::CheckKey(kStore, key); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<FileLock>> lock =
      FileLock::Acquire(absl::StrCat(path_, "/.locks/", EscapeKey(key)));
  if (!lock.ok()) return lock.status();
  const std::string file = PathForKey(key);
  int64_t value = 0;
  absl::StatusOr<std::string> text = ReadFile(file);
  if (text.ok()) {
    if (!absl::SimpleAtoi(*text, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("[", kStore, "] add: key ", key, " holds \"",
                                                     *text, "\", which is not an integer"));
    }
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  value += delta;
  if (absl::Status s = WriteAtomically(file, absl::StrCat(value)); !s.ok()) return s;
  return value;
}

absl::StatusOr<bool> FileStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) {
    if (absl::Status s = internal::CheckKey(kStore, key); !s.ok()) return s;
    if (!Exists(PathForKey(key))) return false;
  }
  return true;
}

absl::StatusOr<bool> FileStore::DeleteKey(absl::string_view key) {
  if (absl::Status s = internal::CheckKey(kStore, key); !s.ok()) return s;
  const std::string file = PathForKey(key);
  if (::unlink(file.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoError("cannot delete", file, errno);
}

absl::StatusOr<int> FileStore::DeleteKeysUnder(absl::string_view prefix) {
  if (absl::Status s = internal::CheckKey(kStore, prefix); !s.ok()) return s;
  // EscapeKey keeps a key's prefix: a key under "<prefix>/" is a file whose
  // name starts with the escaped "<prefix>/".
  const std::string start = EscapeKey(absl::StrCat(prefix, "/"));
  int deleted = 0;
  absl::Status first_error;
  for (const std::string& dir : {path_, path_ + "/.locks"}) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno != ENOENT && first_error.ok()) first_error = ErrnoError("cannot list", dir, errno);
      continue;
    }
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, start)) names.emplace_back(e->d_name);
    }
    if (errno != 0 && first_error.ok()) first_error = ErrnoError("cannot list", dir, errno);
    ::closedir(d);
    for (const std::string& name : names) {
      const std::string file = absl::StrCat(dir, "/", name);
      if (::unlink(file.c_str()) == 0) {
        if (dir == path_) ++deleted;
      } else if (errno != ENOENT && first_error.ok()) {
        first_error = ErrnoError("cannot delete", file, errno);
      }
    }
  }
  if (!first_error.ok()) return first_error;
  return deleted;
}

absl::Status FileStore::DoWait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& key : keys) {
    if (absl::Status s = internal::CheckKey(kStore, key); !s.ok()) return s;
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  std::vector<std::string> missing(keys.begin(), keys.end());
  while (true) {
    missing.erase(std::remove_if(missing.begin(), missing.end(),
                                 [&](const std::string& key) { return Exists(PathForKey(key)); }),
                  missing.end());
    if (missing.empty()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) return internal::MissingKeysError(kStore, "wait", timeout, missing);
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<std::string> FileStore::DoGet(absl::string_view key, absl::Duration timeout) {
  if (absl::Status s = internal::CheckKey(kStore, key); !s.ok()) return s;
  const std::string keys[] = {std::string(key)};
  if (absl::Status s = DoWait(keys, timeout); !s.ok()) {
    if (absl::IsDeadlineExceeded(s))
      return internal::MissingKeysError(kStore, "get", timeout, keys);
    return s;
  }
  absl::StatusOr<std::string> value = ReadFile(PathForKey(key));
  if (absl::IsNotFound(value.status())) {
    return absl::NotFoundError(absl::StrCat("[", kStore, "] get: key ", key, " was deleted"));
  }
  return value;
}

}  // namespace dist
