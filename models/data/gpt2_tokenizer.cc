// GPT-2's byte-level BPE tokenizer (gpt2_tokenizer.h).
#include "models/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/data/mapped_file.h"
#include "models/data/runfiles.h"
#include "models/data/utf8.h"
#include "tensor/json.h"

namespace data {
namespace {

struct CodePointRange {
  uint32_t first;
  uint32_t last;
};
#include "models/data/unicode_ranges.inc"

bool InRanges(absl::Span<const CodePointRange> ranges, uint32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](uint32_t c, const CodePointRange& r) { return c < r.first; });
  return it != ranges.begin() && cp <= (it - 1)->last;
}

// The classes of the pre-tokenizer pattern: \p{L}, \p{N}, \s, and the rest.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// Unicode's White_Space property (PropList.txt), which is \s in tiktoken's
// (Rust) regular expressions.
bool IsWhiteSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

CharClass Classify(uint32_t cp) {
  if (IsWhiteSpace(cp)) return CharClass::kSpace;
  if (InRanges(kLetterRanges, cp)) return CharClass::kLetter;
  if (InRanges(kNumberRanges, cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

// GPT-2's bytes_to_unicode(): byte b's character in the vocabulary's strings.
// Printable Latin-1 bytes stand for themselves; the other 68 bytes are
// U+0100.. in byte order.
std::vector<uint32_t> ByteCharacters() {
  std::vector<uint32_t> chars(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    chars[b] = printable ? b : next++;
  }
  return chars;
}

// The two spellings of a tokenizer's files: Hugging Face's, then OpenAI's.
constexpr std::pair<const char*, const char*> kFilePairs[] = {{"vocab.json", "merges.txt"},
                                                              {"encoder.json", "vocab.bpe"}};

bool IsContractionLetter(char c) { return c == 's' || c == 't' || c == 'm' || c == 'd'; }

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  absl::StatusOr<std::shared_ptr<const MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return std::string((*file)->bytes());
}

}  // namespace

std::vector<absl::string_view> SplitGpt2Pretokens(absl::string_view text) {
  // Each character's byte offset and class; offsets[n] = text.size().
  std::vector<size_t> offsets;
  std::vector<CharClass> classes;
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    const int len = DecodeUtf8(text, pos, cp);
    offsets.push_back(pos);
    classes.push_back(Classify(cp));
    pos += len;
  }
  const size_t n = classes.size();
  offsets.push_back(text.size());
  // The first byte of character i when it is ASCII, else 0.
  const auto ascii = [&](size_t i) {
    return i < n && offsets[i + 1] - offsets[i] == 1 ? text[offsets[i]] : '\0';
  };

  std::vector<absl::string_view> pieces;
  size_t i = 0;
  while (i < n) {
    size_t end;  // the piece is characters [i, end)
    if (ascii(i) == '\'' && IsContractionLetter(ascii(i + 1))) {
      end = i + 2;  // 's 't 'm 'd
    } else if (ascii(i) == '\'' && ((ascii(i + 1) == 'r' && ascii(i + 2) == 'e') ||
                                    (ascii(i + 1) == 'v' && ascii(i + 2) == 'e') ||
                                    (ascii(i + 1) == 'l' && ascii(i + 2) == 'l'))) {
      end = i + 3;  // 're 've 'll
    } else if (classes[i] != CharClass::kSpace ||
               (ascii(i) == ' ' && i + 1 < n && classes[i + 1] != CharClass::kSpace)) {
      // ` ?\p{L}+`, ` ?\p{N}+` or ` ?[^\s\p{L}\p{N}]+`: an optional space, then
      // a run of one class.
      const size_t first = classes[i] == CharClass::kSpace ? i + 1 : i;
      end = first + 1;
      while (end < n && classes[end] == classes[first]) ++end;
    } else {
      // `\s+(?!\S)`: the white space run, less its last character when a
      // non-space follows (that one starts the next piece); `\s+` when the run
      // is one character followed by a non-space.
      end = i + 1;
      while (end < n && classes[end] == CharClass::kSpace) ++end;
      if (end < n && end - i >= 2) --end;
    }
    pieces.push_back(text.substr(offsets[i], offsets[end] - offsets[i]));
    i = end;
  }
  return pieces;
}

size_t Gpt2ChunkEnd(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text.size();
  // Whether the character ending at byte `end` (exclusive), or starting at
  // byte `at`, is not white space. ASCII bytes are always characters of their
  // own (DecodeUtf8 takes no ASCII byte into a sequence), so a character
  // ends before a '\n' and one starts after it; the one before is the valid
  // sequence that ends there, else an invalid byte (U+FFFD).
  const auto ends_solid = [&](size_t end) {
    const auto last = static_cast<uint8_t>(text[end - 1]);
    if (last < 0x80) return Classify(last) != CharClass::kSpace;
    for (size_t len = 2; len <= 4 && len <= end; ++len) {
      uint32_t cp;
      if (DecodeUtf8(text, end - len, cp) == static_cast<int>(len)) {
        return Classify(cp) != CharClass::kSpace;
      }
    }
    return true;
  };
  const auto starts_solid = [&](size_t at) {
    uint32_t cp;
    DecodeUtf8(text, at, cp);
    return Classify(cp) != CharClass::kSpace;
  };
  // A cut at p (1 < p < size): "x\n|y", or "x\r|\ny" (CRLF text), x and y
  // characters other than white space. Not "x\r\n|y": the whole text's
  // "\r\n" before y is two pieces, a part's last one piece.
  const auto cut = [&](size_t p) {
    if (text[p - 1] == '\n') return ends_solid(p - 1) && starts_solid(p);
    return text[p - 1] == '\r' && text[p] == '\n' && p + 1 < text.size() && ends_solid(p - 1) &&
           starts_solid(p + 1);
  };
  for (size_t p = max_bytes; p >= std::max<size_t>(max_bytes / 2, 2); --p) {
    if (cut(p)) return p;
  }
  for (size_t p = std::max<size_t>(max_bytes + 1, 2); p < text.size(); ++p) {
    if (cut(p)) return p;
  }
  return text.size();
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Parse(const std::string& vocab_json,
                                                   const std::string& merges_txt,
                                                   const std::string& source) {
  Gpt2Tokenizer tok;
  tok.source_ = source;
  const std::vector<uint32_t> byte_chars = ByteCharacters();
  absl::flat_hash_map<uint32_t, uint8_t> char_byte;
  for (int b = 0; b < 256; ++b) char_byte[byte_chars[b]] = static_cast<uint8_t>(b);

  // The vocabulary: {"token": id, ...}.
  absl::StatusOr<tensor::Json> vocab = tensor::ParseJson(vocab_json);
  if (!vocab.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the vocabulary: ", vocab.status().message()));
  }
  if (vocab->kind != tensor::Json::Kind::kObject) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the vocabulary is not a JSON object of token: id"));
  }
  absl::flat_hash_map<std::string, int32_t> ids;
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max() - 1;
  for (const auto& [token, value] : vocab->fields) {
    int64_t id;
    if (value.kind != tensor::Json::Kind::kNumber || !absl::SimpleAtoi(value.text, &id) || id < 0 ||
        id > kMaxId) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the vocabulary's token ", tensor::JsonQuote(token), " has id ",
                       value.text, ", not an integer in [0, ", kMaxId, "]"));
    }
    if (!ids.emplace(token, static_cast<int32_t>(id)).second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": the vocabulary lists token ",
                                                     tensor::JsonQuote(token), " twice"));
    }
    std::string bytes;
    for (size_t pos = 0; pos < token.size();) {
      uint32_t cp;
      pos += DecodeUtf8(token, pos, cp);
      auto it = char_byte.find(cp);
      if (it == char_byte.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": the vocabulary's token ", tensor::JsonQuote(token), " (id ", id,
                         ") has a character that is none of GPT-2's 256 byte characters"));
      }
      bytes += static_cast<char>(it->second);
    }
    if (id >= static_cast<int64_t>(tok.token_bytes_.size())) tok.token_bytes_.resize(id + 1);
    if (tok.token_bytes_[id].has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the vocabulary gives id ", id, " to two tokens"));
    }
    tok.token_bytes_[id] = std::move(bytes);
    if (token == "<|endoftext|>") tok.end_of_text_ = id;
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    tensor::AppendUtf8(byte_chars[b], ch);
    auto it = ids.find(ch);
    if (it == ids.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the vocabulary has no token for byte ", b, " (",
                       tensor::JsonQuote(ch), "): it is not a byte-level BPE vocabulary"));
    }
    tok.byte_token_[b] = it->second;
  }

  // The merges, one "left right" per line in rank order, after an optional
  // "#version" line.
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(merges_txt, '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && absl::StartsWith(line, "#version"))) continue;
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": merges line ", line_number, " '",
                                                     line, "' is not two tokens and a space"));
    }
    const std::string merged = absl::StrCat(parts[0], parts[1]);
    int32_t part_ids[3];
    const std::string names[3] = {std::string(parts[0]), std::string(parts[1]), merged};
    for (int k = 0; k < 3; ++k) {
      auto it = ids.find(names[k]);
      if (it == ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": merges line ", line_number, " '",
                                                       line, "': ", tensor::JsonQuote(names[k]),
                                                       " is not in the vocabulary"));
      }
      part_ids[k] = it->second;
    }
    const int32_t rank = static_cast<int32_t>(tok.num_merges_++);
    // A pair listed twice takes its last rank, as encoder.py's dict of the
    // lines does (GPT-2's own file lists none twice).
    tok.merges_.insert_or_assign(PairKey(part_ids[0], part_ids[1]), Merge{rank, part_ids[2]});
  }
  return tok;
}

absl::StatusOr<std::pair<std::string, std::string>> Gpt2Tokenizer::FindFiles(
    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code missing;
  if (!fs::is_directory(dir, missing)) {
    return absl::NotFoundError(absl::StrCat(
        "the tokenizer folder ", dir, " does not exist (moved or deleted since it was recorded?)"));
  }
  for (const auto& [vocab_name, merges_name] : kFilePairs) {
    std::string vocab_path = (fs::path(dir) / vocab_name).string();
    std::string merges_path = (fs::path(dir) / merges_name).string();
    std::error_code ec;
    if (fs::exists(vocab_path, ec) || fs::exists(merges_path, ec)) {
      return std::pair{std::move(vocab_path), std::move(merges_path)};
    }
  }
  return absl::NotFoundError(
      absl::StrCat(dir,
                   " holds no GPT-2 tokenizer: neither vocab.json + merges.txt (Hugging Face) nor "
                   "encoder.json + vocab.bpe (OpenAI)"));
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Read(const std::string& dir) {
  absl::StatusOr<std::pair<std::string, std::string>> files = FindFiles(dir);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::string> vocab = ReadWhole(files->first);
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<std::string> merges = ReadWhole(files->second);
  if (!merges.ok()) return merges.status();
  return Parse(*vocab, *merges, dir);
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Open(const std::string& name) {
  if (absl::StartsWith(name, "sentencepiece:")) {  // tools/spm_tokenize.py's record
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is a SentencePiece model (tools/spm_tokenize.py writes it for T5), not a GPT-2 "
        "BPE tokenizer, which is the only kind read here: encode the text with //tools:tokenize"));
  }
  if (name != "gpt2") return Read(name);
  absl::StatusOr<std::string> vocab =
      ResolveRunfile(absl::StrCat(kShippedGpt2TokenizerDir, "/vocab.json"));
  if (!vocab.ok()) return vocab.status();
  return Read(std::filesystem::path(*vocab).parent_path().string());
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::OpenForModel(const std::string& name,
                                                          int64_t model_vocab) {
  absl::StatusOr<Gpt2Tokenizer> tokenizer = Open(name);
  if (tokenizer.ok() && tokenizer->vocab_size() > model_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("its vocabulary has ", tokenizer->vocab_size(),
                                                   " ids and the model's ", model_vocab,
                                                   ": the model was not trained on its tokens"));
  }
  return tokenizer;
}

std::string Gpt2Tokenizer::RecordName(const std::string& name) {
  return name == "gpt2" ? name : std::filesystem::absolute(name).lexically_normal().string();
}

absl::StatusOr<Gpt2Tokenizer> Gpt2Tokenizer::Shipped() { return Open("gpt2"); }

bool Gpt2Tokenizer::IsTokenizerDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& [vocab_name, merges_name] : kFilePairs) {
    if (fs::exists(fs::path(dir) / vocab_name, ec) && fs::exists(fs::path(dir) / merges_name, ec)) {
      return true;
    }
  }
  return false;
}

void Gpt2Tokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> word;  // (symbols,) starting with one per byte
  word.reserve(piece.size());
  for (unsigned char b : piece) word.push_back(byte_token_[b]);
  while (word.size() > 1) {
    // The adjacent pair of the lowest rank.
    const Merge* best = nullptr;
    uint64_t best_key = 0;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      auto it = merges_.find(PairKey(word[k], word[k + 1]));
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_key = it->first;
      }
    }
    if (best == nullptr) break;
    // Merge every occurrence of it, left to right.
    size_t kept = 0;
    for (size_t k = 0; k < word.size(); ++k) {
      if (k + 1 < word.size() && PairKey(word[k], word[k + 1]) == best_key) {
        word[kept++] = best->result;
        ++k;
      } else {
        word[kept++] = word[k];
      }
    }
    word.resize(kept);
  }
  out.insert(out.end(), word.begin(), word.end());
}

void Gpt2Tokenizer::EncodeInto(absl::string_view text, PieceCache& done,
                               std::vector<int64_t>& ids) const {
  for (absl::string_view piece : SplitGpt2Pretokens(text)) {
    auto [it, inserted] = done.try_emplace(piece);
    if (inserted) EncodePiece(piece, it->second);
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int64_t> Gpt2Tokenizer::Encode(absl::string_view text) const {
  PieceCache done;
  std::vector<int64_t> ids;
  EncodeInto(text, done, ids);
  return ids;
}

std::vector<int64_t> Gpt2Tokenizer::EncodeWithSpecialTokens(absl::string_view text) const {
  if (!end_of_text_.has_value()) return Encode(text);
  constexpr absl::string_view kEndOfText = "<|endoftext|>";
  PieceCache done;
  std::vector<int64_t> ids;
  for (size_t at = text.find(kEndOfText); at != absl::string_view::npos;
       at = text.find(kEndOfText)) {
    EncodeInto(text.substr(0, at), done, ids);
    ids.push_back(*end_of_text_);
    text.remove_prefix(at + kEndOfText.size());
  }
  EncodeInto(text, done, ids);
  return ids;
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(absl::Span<const int64_t> ids) const {
  std::string text;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t id = ids[k];
    if (id < 0 || id >= vocab_size() || !token_bytes_[id].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("token ", k, " (id ", id,
                                                     ") is not in the tokenizer's vocabulary (",
                                                     source_, ", ids [0, ", vocab_size(), "))"));
    }
    text += *token_bytes_[id];
  }
  return text;
}

}  // namespace data
