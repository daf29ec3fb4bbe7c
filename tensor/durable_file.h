// Writing a file so that a crash (of the process or of the machine) leaves
// either its old contents or the new ones, never a part: the bytes go to
// "<path>.tmp.<pid>" (".<n>" after it when that name is taken: each writer's
// file is its own), which is fsynced and renamed onto `path`, and then the
// folder is fsynced so that the rename itself is on disk. Checkpoint files,
// their indexes and `latest` pointers, and exported model folders use it.
#ifndef TENSOR_DURABLE_FILE_H_
#define TENSOR_DURABLE_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tensor {

// The concatenation of `parts` as the file `path`. Unavailable naming the file
// and the system's reason when it cannot be created, written, synced or
// renamed; the temporary file is removed then and `path` is left as it was.
absl::Status WriteFileDurably(const std::string& path, absl::Span<const absl::string_view> parts);
inline absl::Status WriteFileDurably(const std::string& path, absl::string_view bytes) {
  return WriteFileDurably(path, absl::MakeConstSpan(&bytes, 1));
}

// The same, piece by piece, for files too large to hold at once (a
// safetensors file written tensor by tensor): Append the bytes in order,
// optionally WriteAt to overwrite bytes already appended (a checksum in a
// header), then Commit (fsync, rename onto `path`, fsync of the folder).
// Destroyed without a successful Commit, or after an error, it removes the
// temporary file and leaves `path` as it was. Errors as WriteFileDurably's.
class DurableFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<DurableFileWriter>> Create(const std::string& path);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;

  absl::Status Append(absl::string_view bytes);
  // Overwrites [offset, offset + bytes.size()), which must lie within what
  // was appended (InvalidArgument otherwise).
  absl::Status WriteAt(int64_t offset, absl::string_view bytes);
  absl::Status Commit();
  int64_t size() const { return size_; }  // bytes appended

 private:
  DurableFileWriter(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  absl::Status Fail(absl::Status s);  // closes and removes the temporary file

  std::string path_, tmp_;
  int fd_;  // -1 once committed or failed
  int64_t size_ = 0;
};

// The folder holding `path` ("." for a bare name, "/" for a top-level one),
// whose fsync makes a rename there durable.
std::string ParentFolder(const std::string& path);

// fsync of a folder, making the creation, removal or renaming of its entries
// durable; errors are ignored (some filesystems refuse it).
void FsyncDir(const std::string& dir);

// Moves the finished folder `tmp` (its files written durably) onto `dir`, a
// sibling, so that a crash leaves either the old folder or the new one at
// `dir`: a rename when `dir` does not exist (or is empty), else an atomic swap
// (RENAME_EXCHANGE) and the old folder removed; where the filesystem has no
// swap, `dir` is first moved aside to "<dir>.old-<tag>" (a crash between the
// two renames leaves it there, and a failed second rename moves it back).
// The parent folder is fsynced. Unavailable naming the folder and the
// system's reason; `tmp` is left for the caller to remove then.
absl::Status ReplaceFolderDurably(const std::string& tmp, const std::string& dir,
                                  const std::string& tag);

}  // namespace tensor

#endif  // TENSOR_DURABLE_FILE_H_
