// Writing a file so that a crash (of the process or of the machine) leaves
// either its old contents or the new ones, never a part: the bytes go to
// "<path>.tmp.<pid>", which is fsynced and renamed onto `path`, and then the
// folder is fsynced so that the rename itself is on disk. Checkpoint files,
// their indexes and `latest` pointers, and exported model folders use it.
#ifndef TENSOR_DURABLE_FILE_H_
#define TENSOR_DURABLE_FILE_H_

#include <string>

#include "absl/status/status.h"
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

// fsync of a folder, making the creation, removal or renaming of its entries
// durable; errors are ignored (some filesystems refuse it).
void FsyncDir(const std::string& dir);

}  // namespace tensor

#endif  // TENSOR_DURABLE_FILE_H_
