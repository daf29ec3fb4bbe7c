// Reading and writing tensors in the safetensors format (Hugging Face):
//   8 bytes little-endian header length N | N bytes of JSON header | data.
// The header maps each name to {"dtype", "shape", "data_offsets"} and may hold
// "__metadata__" (string -> string). Files written here are readable by the
// `safetensors` Python package; they also carry a CRC-32C of the data section in
// the metadata ("fsdp.crc32c"), checked on read, and one of what the header
// says ("fsdp.header_crc32c": names, dtypes, shapes, offsets and the other
// metadata), checked whenever the header is read. Writes are atomic: a temporary
// file is written, fsync'ed and renamed over the target.
#ifndef TENSOR_SAFETENSORS_H_
#define TENSOR_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/durable_file.h"
#include "tensor/tensor.h"

namespace tensor {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsEntry {
  std::string name;
  Dtype dtype;
  Shape shape;
  int64_t begin = 0;  // byte offsets within the data section
  int64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in file order
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // byte offset of the data section in the file
  // The entry with this name, or nullptr.
  const SafetensorsEntry* Find(const std::string& name) const;
};

// Writes `tensors` (any device; copied to the host one at a time) and
// `metadata` to `path` atomically.
absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The same, one tensor at a time, for files larger than memory (a
// consolidated checkpoint): the entries (name, dtype, shape, in file order)
// and the metadata are declared up front, as the header comes first; each
// tensor is then appended in that order and written at once, so only one host
// copy is held; Finish() writes the checksum into the header and renames the
// file into place. A writer destroyed unfinished, or after an error, leaves
// `path` as it was.
//
//   auto w = SafetensorsWriter::Create(path, {{"a", Dtype::kF32, Shape({2, 3})}, ...});
//   (*w)->Append(a);  ...  (*w)->Finish();
class SafetensorsWriter {
 public:
  struct Decl {
    std::string name;
    Dtype dtype;
    Shape shape;
  };
  // InvalidArgument for a reserved or repeated name; Unavailable when the
  // file cannot be created.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<Decl> entries,
      const std::map<std::string, std::string>& metadata = {});
  // The next declared entry (any device, any layout). InvalidArgument naming
  // the entry when `t` is undefined or its dtype or shape is not the declared
  // one, or when every entry was already appended.
  absl::Status Append(const Tensor& t);
  // FailedPrecondition naming the first entry not appended.
  absl::Status Finish();
  // The entry Append expects next ("" when all were appended).
  std::string next_name() const;

 private:
  SafetensorsWriter(std::vector<Decl> entries, std::unique_ptr<DurableFileWriter> file,
                    int64_t checksum_offset)
      : entries_(std::move(entries)), file_(std::move(file)), checksum_offset_(checksum_offset) {}

  std::vector<Decl> entries_;
  std::unique_ptr<DurableFileWriter> file_;
  int64_t checksum_offset_;  // where the checksum's 8 hex digits go in the file
  size_t next_ = 0;
  uint32_t crc_ = 0;
};

// Parses and validates the header (offsets inside the file, no overlaps, sizes
// matching dtype x shape, no name twice, at most 64 dims, at most 4M JSON
// values) and against its checksum when it records one, without reading the
// data. DataLoss naming the file and what is wrong.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

struct SafetensorsFile {
  SafetensorsHeader header;
  NamedTensors tensors;  // CPU tensors, in file order
};

// Reads the whole file and verifies the checksum when present.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// Checks the file's data against the checksum its metadata records (OK when
// it records none), reading it in pieces: no more than 16 MiB is held at once.
// DataLoss naming the file when they differ.
absl::Status VerifySafetensors(const std::string& path, const SafetensorsHeader& header);

// ReadSafetensorsHeader, then VerifySafetensors: the header of a file whose
// data was checked against its checksum (read in pieces, not held).
absl::StatusOr<SafetensorsHeader> ReadVerifiedSafetensorsHeader(const std::string& path);

// Entry `entry` of the file whole, in its own dtype (a CPU tensor).
absl::StatusOr<Tensor> ReadSafetensorsEntry(const std::string& path,
                                            const SafetensorsHeader& header,
                                            const SafetensorsEntry& entry);

// Reads elements [begin, begin + out.numel()) of entry `name` (flattened) into
// `out` (contiguous CPU tensor; the entry's dtype is converted to out's).
// Used to load a shard of a tensor without reading the rest.
absl::Status ReadSafetensorsSlice(const std::string& path, const SafetensorsHeader& header,
                                  const std::string& name, int64_t begin, Tensor& out);

// CRC-32C (Castagnoli) of a byte range, continuing from `crc`.
uint32_t Crc32c(const void* data, int64_t size, uint32_t crc = 0);

}  // namespace tensor

#endif  // TENSOR_SAFETENSORS_H_
