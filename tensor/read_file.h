// Reading a whole (small) file into memory: JSON records and configurations,
// checkpoint indexes, tokenizer files. One place for what the stream idiom
// (`ss << in.rdbuf()`) got wrong: an empty file read as a failure, and a
// read error or a folder taken for an empty file.
#ifndef TENSOR_READ_FILE_H_
#define TENSOR_READ_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tensor {

// The bytes of the file `path` (an empty file gives ""; a pipe or device is
// read to its end, a FIFO once a writer opens it). NotFound "<path>: no such
// file" when nothing is there; FailedPrecondition "<path>: is a folder, not a
// file" for a folder, or past `max_bytes` (>= 0; -1: no bound) "<path>: is N
// bytes, more than the M read at most" (a pipe's or device's: "holds more
// than the M bytes read at most"); Unavailable naming the file and the
// system's reason when it cannot be opened or read.
absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = -1);

}  // namespace tensor

#endif  // TENSOR_READ_FILE_H_
