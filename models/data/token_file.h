// uint16 token files in the nanoGPT / llm.c ".bin" layouts, and a TokenSource
// over one:
//   raw (nanoGPT):  a flat array of little-endian uint16 tokens;
//   llm.c:          a header of 256 little-endian int32 (header[0] = 20240520,
//                   header[1] = 1, header[2] = number of tokens), then the
//                   uint16 tokens.
// Auto-detection reads the first int32: the llm.c magic means llm.c. (For
// vocabularies up to 55432, GPT-2's included, a raw file cannot start with
// those bytes: its first token would be 0xD888 = 55432.) A raw file whose
// every second uint16 is 0 (over its first 2048) is refused as uint32 ids
// written by mistake. The file is
// memory-mapped, its size checked against the token count, and every token
// checked against the vocabulary when it is opened.
#ifndef MODELS_DATA_TOKEN_FILE_H_
#define MODELS_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/data/mapped_file.h"
#include "models/data/random_tokens.h"
#include "models/data/token_source.h"
#include "tensor/durable_file.h"

namespace data {

enum class TokenFileFormat { kAuto, kRaw, kLlmc };

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
// llm.c's uint32-token files (LLaMA 3): recognized only to be refused clearly.
inline constexpr int32_t kLlmcUint32Magic = 20240801;
inline constexpr int64_t kLlmcHeaderInts = 256;
inline constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// A validated, memory-mapped token file.
class TokenFile {
 public:
  // Errors (messages name the file): NotFound; InvalidArgument for an empty
  // file, an odd byte count, a header shorter than 1024 bytes, a wrong magic
  // (kLlmc) or version, a token count that disagrees with the file size
  // (truncated or trailing bytes), zero tokens, or a token >= vocab_size
  // (naming its position).
  static absl::StatusOr<std::shared_ptr<const TokenFile>> Open(
      const std::string& path, int64_t vocab_size = kGpt2VocabSize,
      TokenFileFormat format = TokenFileFormat::kAuto);

  const std::string& path() const { return file_->path(); }
  TokenFileFormat format() const { return format_; }  // kRaw or kLlmc
  int64_t num_tokens() const { return num_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  // Token i (0 <= i < num_tokens()).
  int64_t token(int64_t i) const;
  // Tokens [start, start + out.size()) into out.
  void Read(int64_t start, absl::Span<int64_t> out) const;
  // ContentDigest of the tokens (token_source.h).
  const std::string& content() const { return content_; }

 private:
  TokenFile(std::shared_ptr<const MappedFile> file, TokenFileFormat format, const uint8_t* tokens,
            int64_t num_tokens, int64_t vocab_size)
      : file_(std::move(file)),
        format_(format),
        tokens_(tokens),
        num_tokens_(num_tokens),
        vocab_size_(vocab_size),
        content_(ContentDigest(absl::string_view(reinterpret_cast<const char*>(tokens),
                                                 static_cast<size_t>(2 * num_tokens)))) {}

  std::shared_ptr<const MappedFile> file_;
  TokenFileFormat format_;
  const uint8_t* tokens_;  // little-endian uint16 values inside the mapping
  int64_t num_tokens_;
  int64_t vocab_size_;
  std::string content_;
};

// Writes `tokens` (each in [0, 65536)) as a token file of `format` (kRaw or
// kLlmc); for tests and dataset tools.
absl::Status WriteTokenFile(const std::string& path, absl::Span<const int64_t> tokens,
                            TokenFileFormat format);

// Writes a token file in parts, for data larger than memory: Append the
// tokens as they come, then Finish. The bytes go to a temporary file of this
// process, `path`.tmp.<pid> (tensor::DurableFileWriter), which Finish fsyncs
// and renames onto `path` (llm.c's header gets its count then); a writer
// destroyed unfinished, or after a failed write, removes it. So `path` never
// holds a part, and two writers of one path (two tokenize runs) each publish
// a whole file: the last Finish's.
class TokenFileWriter {
 public:
  // InvalidArgument for kAuto; FailedPrecondition naming the temporary file
  // when it cannot be created.
  static absl::StatusOr<std::unique_ptr<TokenFileWriter>> Create(const std::string& path,
                                                                 TokenFileFormat format);
  ~TokenFileWriter() = default;  // unfinished: the temporary file is removed
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // InvalidArgument naming a token outside [0, 65536) and its position in the
  // file, or a count past llm.c's int32; nothing of that call is written.
  // DataLoss naming the file when the system refuses a write (the temporary
  // file is removed then, and the writer takes no more).
  absl::Status Append(absl::Span<const int64_t> tokens);
  // DataLoss as Append's when the header, fsync or rename fails.
  absl::Status Finish();
  int64_t num_tokens() const { return num_tokens_; }

 private:
  TokenFileWriter(std::string path, TokenFileFormat format,
                  std::unique_ptr<tensor::DurableFileWriter> file)
      : path_(std::move(path)), format_(format), file_(std::move(file)) {}
  absl::Status WriteHeader();  // llm.c's, with num_tokens_, at the file's start
  // `s` itself when ok; else the file dropped (and removed) and DataLoss.
  absl::Status Failed(absl::Status s);

  std::string path_;
  TokenFileFormat format_;
  std::unique_ptr<tensor::DurableFileWriter> file_;  // nullptr once finished or failed
  int64_t num_tokens_ = 0;
};

// Random windows of a token file.
class TokenFileSource : public TokenSource {
 public:
  TokenFileSource(std::shared_ptr<const TokenFile> file, uint64_t seed)
      : file_(std::move(file)), seed_(seed), end_(file_->num_tokens()) {}
  // Open(path, vocab_size, format) then a source over it.
  static absl::StatusOr<std::unique_ptr<TokenFileSource>> Open(
      const std::string& path, uint64_t seed, int64_t vocab_size = kGpt2VocabSize,
      TokenFileFormat format = TokenFileFormat::kAuto);

  int64_t vocab_size() const override { return file_->vocab_size(); }
  int64_t max_sequence_length() const override { return end_ - begin_; }
  void SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const override;
  std::string Describe() const override;
  std::string Fingerprint() const override;
  // Tokens [begin, end) of the file (sharing it).
  absl::StatusOr<std::unique_ptr<TokenSource>> Slice(int64_t begin, int64_t end,
                                                     uint64_t seed) const override;

  const TokenFile& file() const { return *file_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  uint64_t seed_;
  int64_t begin_ = 0;  // the tokens sampled: [begin_, end_) of the file
  int64_t end_;

  bool sliced() const;  // not the whole file
};

// What made a token file, recorded beside it by //tools:tokenize in PATH.json
// (nanoGPT's meta.pkl), so that a model trained on it and sampled from it
// knows its tokenizer without being told:
//   {"tokenizer": "gpt2", "vocab_size": 50257, "num_tokens": 147297}
struct TokenFileMeta {
  std::string tokenizer;   // gpt2 (the shipped one), or a tokenizer folder's absolute path
  int64_t vocab_size = 0;  // the tokenizer's: every id is below it
  int64_t num_tokens = 0;  // the token file's, to tell a stale record from a current one
};

// token_file + ".json".
std::string TokenFileMetaPath(const std::string& token_file);
// Writes PATH.json durably (temporary file, fsync, rename).
absl::Status WriteTokenFileMeta(const std::string& token_file, const TokenFileMeta& meta);

// PATH.json, or nullopt when there is none. InvalidArgument naming the file
// when it cannot be read (a folder, no permission) or is not such a record
// (not JSON, a key missing or of the wrong kind).
absl::StatusOr<std::optional<TokenFileMeta>> ReadTokenFileMeta(const std::string& token_file);

}  // namespace data

#endif  // MODELS_DATA_TOKEN_FILE_H_
