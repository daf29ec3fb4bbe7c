// Byte-level text source: memory-mapped file, random windows, decoding.
#include "models/data/byte_text.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "models/data/runfiles.h"

namespace data {

ByteTextSource::ByteTextSource(std::shared_ptr<const MappedFile> file, std::string owned,
                               std::string name, uint64_t seed, std::string content)
    : file_(std::move(file)),
      owned_(std::move(owned)),
      name_(std::move(name)),
      seed_(seed),
      content_(std::move(content)) {
  text_ = file_ != nullptr ? file_->bytes() : absl::string_view(owned_);
  if (content_.empty()) content_ = ContentDigest(text_);
}

absl::StatusOr<std::unique_ptr<ByteTextSource>> ByteTextSource::Open(const std::string& path,
                                                                     uint64_t seed) {
  absl::StatusOr<std::shared_ptr<const MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("[byte text] ", file.status().message()));
  }
  if ((*file)->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("[byte text] text file ", path, " is empty"));
  }
  return std::unique_ptr<ByteTextSource>(
      new ByteTextSource(*std::move(file), std::string(), path, seed));
}

absl::StatusOr<std::unique_ptr<ByteTextSource>> ByteTextSource::OpenDefault(uint64_t seed) {
  absl::StatusOr<std::string> path = ResolveRunfile(kDefaultTextPath);
  if (!path.ok()) {
    return absl::Status(path.status().code(),
                        absl::StrCat("[byte text] the default text: ", path.status().message(),
                                     " (depend on //models/data:byte_text and run through "
                                     "bazel, or run from the repository root)"));
  }
  return Open(*path, seed);
}

absl::StatusOr<std::unique_ptr<ByteTextSource>> ByteTextSource::FromString(std::string text,
                                                                           uint64_t seed,
                                                                           absl::string_view name) {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("[byte text] text ", name, " is empty"));
  }
  return std::unique_ptr<ByteTextSource>(
      new ByteTextSource(nullptr, std::move(text), std::string(name), seed));
}

void ByteTextSource::SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const {
  const int64_t length = static_cast<int64_t>(out.size());
  const int64_t start =
      SampleWindowStart(seed_, step, row, static_cast<int64_t>(text_.size()), length);
  const auto* bytes = reinterpret_cast<const uint8_t*>(text_.data()) + start;
  for (int64_t i = 0; i < length; ++i) out[i] = bytes[i];
}

std::string ByteTextSource::Describe() const {
  if (!range_.empty()) {
    return absl::StrCat("bytes ", range_, " of ", name_, " (", text_.size(), " bytes)");
  }
  return absl::StrCat("bytes of ", name_, " (", text_.size(), " bytes)");
}

std::string ByteTextSource::Fingerprint() const {
  const std::string range = range_.empty() ? "" : absl::StrCat(",range=", range_);
  return absl::StrCat("byte_text(bytes=", text_.size(), range, ",content=", content_,
                      ",seed=", seed_, ")");
}

absl::StatusOr<std::unique_ptr<TokenSource>> ByteTextSource::Slice(int64_t begin, int64_t end,
                                                                   uint64_t seed) const {
  absl::Status valid = CheckSliceRange(begin, end, static_cast<int64_t>(text_.size()));
  if (!valid.ok()) return valid;
  std::unique_ptr<ByteTextSource> part(new ByteTextSource(file_, owned_, name_, seed, content_));
  // Offsets of the whole text: a slice of a slice counts from its parent's start.
  const int64_t base =
      file_ != nullptr ? text_.data() - file_->bytes().data() : text_.data() - owned_.data();
  part->text_ = part->text_.substr(base + begin, end - begin);
  part->range_ = absl::StrCat("[", base + begin, ", ", base + end, ")");
  return std::unique_ptr<TokenSource>(std::move(part));
}

std::string DecodeBytes(absl::Span<const int64_t> ids) {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < kByteVocabSize) {
      out.push_back(static_cast<char>(static_cast<uint8_t>(id)));
    } else {
      absl::StrAppend(&out, "<", id, ">");
    }
  }
  return out;
}

}  // namespace data
