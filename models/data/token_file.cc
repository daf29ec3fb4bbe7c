// Reading, validating and writing nanoGPT / llm.c uint16 token files.
#include "models/data/token_file.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "tensor/durable_file.h"
#include "tensor/json.h"
#include "tensor/read_file.h"

namespace data {
namespace {

int32_t ReadInt32Le(const uint8_t* p) {
  const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return static_cast<int32_t>(u);
}

void AppendInt32Le(int32_t v, std::string* out) {
  const uint32_t u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

inline int64_t ReadUint16Le(const uint8_t* p) {
  return static_cast<int64_t>(p[0]) | (static_cast<int64_t>(p[1]) << 8);
}

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("[token file] ", path, ": ", what));
}

// A raw file of little-endian uint32 (or int32) ids below 2^16, read as
// uint16: each id then a 0. The tokens looked at (2 x the first
// min(1024, n / 2) pairs, at least 64 pairs) when every pair ends in 0 and
// some starts with another id (a file of zeros is not taken for one); 0
// when it does not look so. Real uint16 text has no 0 every second token.
int64_t Uint32Evidence(const uint8_t* tokens, int64_t num_tokens) {
  const int64_t pairs = std::min<int64_t>(1024, num_tokens / 2);
  if (pairs < 64) return 0;
  bool some_id = false;
  for (int64_t i = 0; i < pairs; ++i) {
    if (ReadUint16Le(tokens + 4 * i + 2) != 0) return 0;
    some_id |= ReadUint16Le(tokens + 4 * i) != 0;
  }
  return some_id ? 2 * pairs : 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TokenFile>> TokenFile::Open(const std::string& path,
                                                                 int64_t vocab_size,
                                                                 TokenFileFormat format) {
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[token file] vocab_size must be in [1, 2^31], got ", vocab_size, " for ", path));
  }
  absl::StatusOr<std::shared_ptr<const MappedFile>> mapped = MappedFile::Open(path);
  if (!mapped.ok()) {
    return absl::Status(mapped.status().code(),
                        absl::StrCat("[token file] ", mapped.status().message()));
  }
  std::shared_ptr<const MappedFile> file = *std::move(mapped);
  const int64_t size = file->size();
  const uint8_t* bytes = file->data();
  if (size == 0) return Invalid(path, "the file is empty");

  const int32_t first = size >= 4 ? ReadInt32Le(bytes) : 0;
  if (format == TokenFileFormat::kAuto) {
    if (size >= 4 && first == kLlmcUint32Magic) {
      return Invalid(path, absl::StrCat("an llm.c file of uint32 tokens (magic ", kLlmcUint32Magic,
                                        "); only uint16 tokens are supported"));
    }
    format = (size >= 4 && first == kLlmcMagic) ? TokenFileFormat::kLlmc : TokenFileFormat::kRaw;
  }

  const uint8_t* tokens = bytes;
  int64_t num_tokens = 0;
  if (format == TokenFileFormat::kLlmc) {
    if (size < kLlmcHeaderBytes) {
      return Invalid(path, absl::StrCat("too small for the llm.c header: ", size,
                                        " bytes, the header alone is ", kLlmcHeaderBytes,
                                        " bytes (256 x int32)"));
    }
    if (first != kLlmcMagic) {
      return Invalid(path, absl::StrCat("bad magic ", first, " in the llm.c header (expected ",
                                        kLlmcMagic, ")"));
    }
    const int32_t version = ReadInt32Le(bytes + 4);
    if (version != kLlmcVersion) {
      return Invalid(path, absl::StrCat("unsupported llm.c header version ", version, " (expected ",
                                        kLlmcVersion, ": uint16 tokens)"));
    }
    const int64_t count = ReadInt32Le(bytes + 8);
    const int64_t payload = size - kLlmcHeaderBytes;
    if (count < 0) {
      return Invalid(path, absl::StrCat("the header's token count is negative (", count, ")"));
    }
    if (payload < 2 * count) {
      return Invalid(path, absl::StrCat("truncated: the header says ", count, " tokens (",
                                        2 * count, " bytes) but only ", payload,
                                        " bytes follow the ", kLlmcHeaderBytes, "-byte header"));
    }
    if (payload > 2 * count) {
      return Invalid(path,
                     absl::StrCat(payload - 2 * count, " trailing bytes after the ", count,
                                  " tokens the header announces (file size ", size, " bytes)"));
    }
    tokens = bytes + kLlmcHeaderBytes;
    num_tokens = count;
  } else {
    if (size % 2 != 0) {
      return Invalid(path, absl::StrCat("odd number of bytes (", size,
                                        "): not a file of uint16 tokens, or truncated"));
    }
    num_tokens = size / 2;
  }
  if (num_tokens == 0) return Invalid(path, "the file holds no tokens");
  if (format == TokenFileFormat::kRaw) {
    if (const int64_t looked = Uint32Evidence(tokens, num_tokens); looked > 0) {
      return Invalid(path, absl::StrCat(
                               "every second uint16 of its first ", looked,
                               " is 0: it looks like uint32 tokens (np.uint32 or np.int32), "
                               "which would read as twice the tokens, half of them id 0; write "
                               "them as uint16 (np.uint16, nanoGPT's) or use //tools:tokenize"));
    }
  }

  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t t = ReadUint16Le(tokens + 2 * i);
    if (t >= vocab_size) {
      return Invalid(path, absl::StrCat("token ", t, " at position ", i,
                                        " is out of range (>= ", "vocab_size ", vocab_size, ")"));
    }
  }
  return std::shared_ptr<const TokenFile>(
      new TokenFile(std::move(file), format, tokens, num_tokens, vocab_size));
}

int64_t TokenFile::token(int64_t i) const {
  CHECK(i >= 0 && i < num_tokens_) << "token index " << i << " out of [0, " << num_tokens_ << ")";
  return ReadUint16Le(tokens_ + 2 * i);
}

void TokenFile::Read(int64_t start, absl::Span<int64_t> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  CHECK(start >= 0 && start + n <= num_tokens_)
      << "tokens [" << start << ", " << start + n << ") out of [0, " << num_tokens_ << ")";
  const uint8_t* p = tokens_ + 2 * start;
  for (int64_t i = 0; i < n; ++i) out[i] = ReadUint16Le(p + 2 * i);
}

absl::StatusOr<std::unique_ptr<TokenFileWriter>> TokenFileWriter::Create(const std::string& path,
                                                                         TokenFileFormat format) {
  if (format == TokenFileFormat::kAuto) {
    return absl::InvalidArgumentError(
        absl::StrCat("[token file] writing ", path, ": choose kRaw or kLlmc"));
  }
  absl::StatusOr<std::unique_ptr<tensor::DurableFileWriter>> file =
      tensor::DurableFileWriter::Create(path);
  if (!file.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("[token file] ", file.status().message()));
  }
  std::unique_ptr<TokenFileWriter> writer(new TokenFileWriter(path, format, *std::move(file)));
  if (format == TokenFileFormat::kLlmc) {
    absl::Status header = writer->WriteHeader();  // the count is written again by Finish
    if (!header.ok()) return header;
  }
  return writer;
}

absl::Status TokenFileWriter::WriteHeader() {
  std::string bytes;
  AppendInt32Le(kLlmcMagic, &bytes);
  AppendInt32Le(kLlmcVersion, &bytes);
  AppendInt32Le(static_cast<int32_t>(num_tokens_), &bytes);
  for (int64_t i = 3; i < kLlmcHeaderInts; ++i) AppendInt32Le(0, &bytes);
  absl::Status written =
      file_->size() == 0 ? file_->Append(bytes) : file_->WriteAt(0, bytes);  // first, or again
  return Failed(written);
}

absl::Status TokenFileWriter::Failed(absl::Status s) {
  if (s.ok()) return s;
  file_.reset();  // removes the temporary file
  return absl::DataLossError(absl::StrCat("[token file] writing ", path_, ": ", s.message()));
}

absl::Status TokenFileWriter::Append(absl::Span<const int64_t> tokens) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("[token file] writing ", path_, ": Append after Finish or a failed write"));
  }
  if (format_ == TokenFileFormat::kLlmc &&
      num_tokens_ + static_cast<int64_t>(tokens.size()) > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("[token file] writing ", path_, ": ",
                                                   num_tokens_ + tokens.size(),
                                                   " tokens do not fit an llm.c header"));
  }
  std::string bytes;
  bytes.reserve(2 * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (t < 0 || t > 0xffff) {
      return absl::InvalidArgumentError(absl::StrCat("[token file] writing ", path_, ": token ", t,
                                                     " at position ", num_tokens_ + i,
                                                     " is not a uint16"));
    }
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  absl::Status written = Failed(file_->Append(bytes));
  if (!written.ok()) return written;
  num_tokens_ += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::Status TokenFileWriter::Finish() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("[token file] writing ", path_, ": Finish twice or after a failed write"));
  }
  if (format_ == TokenFileFormat::kLlmc) {
    absl::Status header = WriteHeader();  // with the count now
    if (!header.ok()) return header;
  }
  // fsync, rename onto path_, fsync of the folder; or the temporary file removed.
  absl::Status committed = Failed(file_->Commit());
  file_.reset();
  return committed;
}

absl::Status WriteTokenFile(const std::string& path, absl::Span<const int64_t> tokens,
                            TokenFileFormat format) {
  absl::StatusOr<std::unique_ptr<TokenFileWriter>> writer = TokenFileWriter::Create(path, format);
  if (!writer.ok()) return writer.status();
  absl::Status appended = (*writer)->Append(tokens);
  if (!appended.ok()) return appended;
  return (*writer)->Finish();
}

absl::StatusOr<std::unique_ptr<TokenFileSource>> TokenFileSource::Open(const std::string& path,
                                                                       uint64_t seed,
                                                                       int64_t vocab_size,
                                                                       TokenFileFormat format) {
  absl::StatusOr<std::shared_ptr<const TokenFile>> file = TokenFile::Open(path, vocab_size, format);
  if (!file.ok()) return file.status();
  return std::make_unique<TokenFileSource>(*std::move(file), seed);
}

void TokenFileSource::SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const {
  const int64_t length = static_cast<int64_t>(out.size());
  file_->Read(begin_ + SampleWindowStart(seed_, step, row, end_ - begin_, length), out);
}

bool TokenFileSource::sliced() const { return begin_ != 0 || end_ != file_->num_tokens(); }

std::string TokenFileSource::Describe() const {
  const std::string range = sliced() ? absl::StrCat("[", begin_, ", ", end_, ") ") : "";
  return absl::StrCat("tokens ", range, "of ", file_->path(), " (",
                      file_->format() == TokenFileFormat::kLlmc ? "llm.c" : "raw uint16", ", ",
                      end_ - begin_, " tokens, vocab ", file_->vocab_size(), ")");
}

std::string TokenFileSource::Fingerprint() const {
  const std::string range = sliced() ? absl::StrCat(",range=[", begin_, ", ", end_, ")") : "";
  return absl::StrCat("token_file(tokens=", end_ - begin_, range, ",vocab=", file_->vocab_size(),
                      ",content=", file_->content(), ",seed=", seed_, ")");
}

absl::StatusOr<std::unique_ptr<TokenSource>> TokenFileSource::Slice(int64_t begin, int64_t end,
                                                                    uint64_t seed) const {
  absl::Status valid = CheckSliceRange(begin, end, end_ - begin_);
  if (!valid.ok()) return valid;
  auto part = std::make_unique<TokenFileSource>(file_, seed);
  part->begin_ = begin_ + begin;
  part->end_ = begin_ + end;
  return std::unique_ptr<TokenSource>(std::move(part));
}

std::string TokenFileMetaPath(const std::string& token_file) { return token_file + ".json"; }

absl::Status WriteTokenFileMeta(const std::string& token_file, const TokenFileMeta& meta) {
  return tensor::WriteFileDurably(
      TokenFileMetaPath(token_file),
      absl::StrCat("{\"tokenizer\": ", tensor::JsonQuote(meta.tokenizer), ", \"vocab_size\": ",
                   meta.vocab_size, ", \"num_tokens\": ", meta.num_tokens, "}\n"));
}

absl::StatusOr<std::optional<TokenFileMeta>> ReadTokenFileMeta(const std::string& token_file) {
  const std::string path = TokenFileMetaPath(token_file);
  absl::StatusOr<std::string> text = tensor::ReadFile(path);
  if (absl::IsNotFound(text.status())) return std::nullopt;  // no record
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, " (what made ", token_file, "): ", what));
  };
  if (!text.ok()) return bad(std::string(text.status().message()));
  absl::StatusOr<tensor::Json> json = tensor::ParseJson(*text);
  if (!json.ok()) return bad(std::string(json.status().message()));
  if (json->kind != tensor::Json::Kind::kObject) return bad("not a JSON object");
  TokenFileMeta meta;
  const tensor::Json* tokenizer = json->Get("tokenizer");
  if (tokenizer == nullptr || tokenizer->kind != tensor::Json::Kind::kString ||
      tokenizer->text.empty()) {
    return bad("no 'tokenizer' string");
  }
  meta.tokenizer = tokenizer->text;
  for (auto [key, out] : {std::pair<const char*, int64_t*>{"vocab_size", &meta.vocab_size},
                          {"num_tokens", &meta.num_tokens}}) {
    const tensor::Json* v = json->Get(key);
    if (v == nullptr || v->kind != tensor::Json::Kind::kNumber || !absl::SimpleAtoi(v->text, out) ||
        *out < 1) {
      return bad(absl::StrCat("no '", key, "' integer >= 1"));
    }
  }
  return meta;
}

}  // namespace data
