// ReadFile (read_file.h): open, fstat, read until the end.
#include "tensor/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tensor {
namespace {

// Closes the descriptor however the read ends (a reserve or append may throw).
struct Descriptor {
  int fd;
  ~Descriptor() { ::close(fd); }
};

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a FIFO waits for its writer
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::UnavailableError(absl::StrCat(path, ": cannot open it: ", std::strerror(err)));
  }
  const Descriptor open_file{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot read it: ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": is a folder, not a file"));
  }
  if (max_bytes >= 0 && st.st_size > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": is ", st.st_size, " bytes, more than the ", max_bytes, " read at most"));
  }
  std::string bytes;
  if (S_ISREG(st.st_mode)) bytes.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat(path, ": cannot read it: ", std::strerror(errno)));
    }
    bytes.append(buffer, static_cast<size_t>(n));
    // A pipe or device (no size to check first), or a file growing meanwhile.
    if (max_bytes >= 0 && static_cast<int64_t>(bytes.size()) > max_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": holds more than the ", max_bytes, " bytes read at most"));
    }
  }
  return bytes;
}

}  // namespace tensor
