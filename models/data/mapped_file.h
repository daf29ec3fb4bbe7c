// A read-only memory map of a whole file (the bytes of text and token files),
// with errors that name the file. An empty file maps to an empty view.
#ifndef MODELS_DATA_MAPPED_FILE_H_
#define MODELS_DATA_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace data {

class MappedFile {
 public:
  // NotFound when the file does not exist; FailedPrecondition when it is not a
  // regular file or cannot be read or mapped.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  int64_t size() const { return size_; }
  absl::string_view bytes() const {
    return absl::string_view(static_cast<const char*>(data_), static_cast<size_t>(size_));
  }

 private:
  MappedFile(std::string path, void* data, int64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  void* data_;    // nullptr for an empty file
  int64_t size_;  // in bytes
};

}  // namespace data

#endif  // MODELS_DATA_MAPPED_FILE_H_
