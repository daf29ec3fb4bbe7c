// Byte-level text: every byte of a file is a token (vocabulary 256), and a
// sample is a random window of the file. The repository ships a default text
// (kDefaultTextPath, Isaac Newton's "Opticks", public domain; see README.md)
// so training runs need no download.
#ifndef MODELS_DATA_BYTE_TEXT_H_
#define MODELS_DATA_BYTE_TEXT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/data/mapped_file.h"
#include "models/data/token_source.h"

namespace data {

inline constexpr int64_t kByteVocabSize = 256;

// The shipped text, relative to the workspace root (found with ResolveRunfile).
inline constexpr char kDefaultTextPath[] = "models/data/text/newton_opticks.txt";

class ByteTextSource : public TokenSource {
 public:
  // The bytes of the file at `path` (memory-mapped). NotFound for a missing
  // file; InvalidArgument for an empty one.
  static absl::StatusOr<std::unique_ptr<ByteTextSource>> Open(const std::string& path,
                                                              uint64_t seed);
  // The shipped default text, found through the runfiles (runfiles.h).
  static absl::StatusOr<std::unique_ptr<ByteTextSource>> OpenDefault(uint64_t seed);
  // A source over `text` held in memory; `name` is used in messages.
  static absl::StatusOr<std::unique_ptr<ByteTextSource>> FromString(
      std::string text, uint64_t seed, absl::string_view name = "<string>");

  int64_t vocab_size() const override { return kByteVocabSize; }
  int64_t max_sequence_length() const override { return static_cast<int64_t>(text_.size()); }
  void SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const override;
  std::string Describe() const override;
  std::string Fingerprint() const override;
  // Bytes [begin, end) of the text (sharing the mapped file).
  absl::StatusOr<std::unique_ptr<TokenSource>> Slice(int64_t begin, int64_t end,
                                                     uint64_t seed) const override;

  // The text (the slice's part of it, for a slice).
  absl::string_view text() const { return text_; }

 private:
  // `content`: the whole text's ContentDigest, computed here when empty.
  ByteTextSource(std::shared_ptr<const MappedFile> file, std::string owned, std::string name,
                 uint64_t seed, std::string content = "");

  std::shared_ptr<const MappedFile> file_;  // set when the text is a file
  std::string owned_;                       // the text when FromString
  absl::string_view text_;
  std::string name_;
  uint64_t seed_;
  std::string content_;  // ContentDigest of the whole text (a slice's too)
  std::string range_;  // "[begin, end)" of the whole text for a slice; empty otherwise
};

// Token ids back to text: ids in [0, 256) are bytes; any other id (a sentinel,
// an ignore index) is written as "<id>" so samples can always be printed.
std::string DecodeBytes(absl::Span<const int64_t> ids);

}  // namespace data

#endif  // MODELS_DATA_BYTE_TEXT_H_
