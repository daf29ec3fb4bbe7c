// Crash-safe file writes (durable_file.h).
#include "tensor/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tensor {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path, int error) {
  return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", std::strerror(error)));
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ParentFolder(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status WriteFileDurably(const std::string& path, absl::Span<const absl::string_view> parts) {
  absl::StatusOr<std::unique_ptr<DurableFileWriter>> w = DurableFileWriter::Create(path);
  if (!w.ok()) return w.status();
  for (absl::string_view part : parts) {
    absl::Status s = (*w)->Append(part);
    if (!s.ok()) return s;
  }
  return (*w)->Commit();
}

absl::StatusOr<std::unique_ptr<DurableFileWriter>> DurableFileWriter::Create(
    const std::string& path) {
  // "<path>.tmp.<pid>", or with ".<n>" after it when another writer of this
  // process (a thread) holds that name, or a dead process of the same pid
  // left it: each writer owns its file, so none cuts another's bytes.
  const std::string first = absl::StrCat(path, ".tmp.", ::getpid());
  constexpr int kNames = 1000;
  for (int n = 0; n < kNames; ++n) {
    std::string tmp = n == 0 ? first : absl::StrCat(first, ".", n);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      return std::unique_ptr<DurableFileWriter>(new DurableFileWriter(path, std::move(tmp), fd));
    }
    if (errno != EEXIST) return ErrnoError("cannot create", tmp, errno);
  }
  return ErrnoError(absl::StrCat("cannot create a temporary file beside ", path, " (",
                                 kNames, " names taken, the first)"),
                    first, EEXIST);
}

DurableFileWriter::~DurableFileWriter() {
  if (fd_ >= 0) Fail(absl::OkStatus()).IgnoreError();
}

absl::Status DurableFileWriter::Fail(absl::Status s) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  return s;
}

absl::Status DurableFileWriter::Append(absl::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", tmp_, "' is closed"));
  absl::Status s = WriteAll(fd_, bytes, tmp_);
  if (!s.ok()) return Fail(s);
  size_ += static_cast<int64_t>(bytes.size());
  return s;
}

absl::Status DurableFileWriter::WriteAt(int64_t offset, absl::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", tmp_, "' is closed"));
  if (offset < 0 || offset + static_cast<int64_t>(bytes.size()) > size_) {
    return absl::InvalidArgumentError(absl::StrCat("WriteAt [", offset, ", ", offset + bytes.size(),
                                                   ") is outside the ", size_,
                                                   " bytes written to '", tmp_, "'"));
  }
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::pwrite(fd_, p, left, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail(ErrnoError("cannot write", tmp_, errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status DurableFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", tmp_, "' is closed"));
  if (::fsync(fd_) != 0) return Fail(ErrnoError("cannot fsync", tmp_, errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp_.c_str());
    return ErrnoError("cannot close", tmp_, error);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp_.c_str());
    return ErrnoError("cannot rename onto", path_, error);
  }
  FsyncDir(ParentFolder(path_));
  return absl::OkStatus();
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

absl::Status ReplaceFolderDurably(const std::string& tmp, const std::string& dir,
                                  const std::string& tag) {
  const std::string parent = ParentFolder(dir);
  if (::rename(tmp.c_str(), dir.c_str()) == 0) {
    FsyncDir(parent);
    return absl::OkStatus();
  }
  if (errno != EEXIST && errno != ENOTEMPTY) {
    return ErrnoError("cannot rename a folder onto", dir, errno);
  }
  std::error_code ec;
  // `dir` holds an older folder: swap the two, then drop the old one.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    FsyncDir(parent);
    std::filesystem::remove_all(tmp, ec);
    return absl::OkStatus();
  }
  // No RENAME_EXCHANGE here: two renames.
  const std::string old = absl::StrCat(dir, ".old-", tag);
  if (::rename(dir.c_str(), old.c_str()) != 0) return ErrnoError("cannot move aside", dir, errno);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int error = errno;
    ::rename(old.c_str(), dir.c_str());
    return ErrnoError("cannot rename a folder onto", dir, error);
  }
  FsyncDir(parent);
  std::filesystem::remove_all(old, ec);
  return absl::OkStatus();
}

}  // namespace tensor
