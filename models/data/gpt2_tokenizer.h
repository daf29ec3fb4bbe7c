// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py, tiktoken's "gpt2"
// encoding, Hugging Face's GPT2Tokenizer), for preparing token files and for
// sampling text from GPT-2-vocabulary models.
//
// Encoding, as GPT-2 does it:
//   1. the text is split by GPT-2's pre-tokenizer pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (SplitGpt2Pretokens; \p{L} / \p{N} are Unicode 14 letters / numbers,
//      \s is Unicode's White_Space, as in tiktoken);
//   2. each piece's UTF-8 bytes become the vocabulary's 256 byte tokens;
//   3. the merges are applied lowest rank first, every occurrence of the
//      chosen pair left to right, until no adjacent pair has a merge.
// Text is encoded as ordinary text: "<|endoftext|>" in the text is not the
// special token (tiktoken's encode_ordinary). Bytes that are not valid UTF-8
// are kept, each one a character of the punctuation class.
#ifndef MODELS_DATA_GPT2_TOKENIZER_H_
#define MODELS_DATA_GPT2_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace data {

// Where the repository's copy of GPT-2's tokenizer lives (runfiles path of
// //models/data:gpt2_tokenizer_files): OpenAI's encoder.json and vocab.bpe
// under Hugging Face's names.
inline constexpr char kShippedGpt2TokenizerDir[] = "models/data/gpt2_tokenizer";

// GPT-2's pre-tokenization of `text`: consecutive pieces covering it.
std::vector<absl::string_view> SplitGpt2Pretokens(absl::string_view text);

// Where to cut `text` for encoding in parts: the cut nearest below
// `max_bytes` (or, when there is none in its upper half, the first after it)
// of the form "x\n|y" or "x\r|\ny" (CRLF line ends), with x and y characters
// other than white space, any script's (or bytes that are not UTF-8). The
// pre-tokenizer always ends a piece there, and the part before it ends the
// same way encoded alone, so encoding the parts gives the ids of the whole.
// text.size() when text is no longer than max_bytes or has no such cut.
size_t Gpt2ChunkEnd(absl::string_view text, size_t max_bytes);

class Gpt2Tokenizer {
 public:
  // Reads `dir`: vocab.json + merges.txt (Hugging Face's names) or
  // encoder.json + vocab.bpe (OpenAI's). Errors name the file and, for bad
  // content, the token or the line: NotFound when neither pair is there;
  // InvalidArgument for bad JSON, an id out of range or given twice, a
  // vocabulary missing one of the 256 byte tokens, a token with a character
  // that is not a byte token's, a merge line that is not two tokens, or a
  // merge whose parts or result are not in the vocabulary.
  static absl::StatusOr<Gpt2Tokenizer> Read(const std::string& dir);
  // The same from the files' contents; `source` names them in errors.
  static absl::StatusOr<Gpt2Tokenizer> Parse(const std::string& vocab_json,
                                             const std::string& merges_txt,
                                             const std::string& source);
  // The repository's copy of GPT-2's tokenizer (kShippedGpt2TokenizerDir,
  // found in the runfiles: NotFound outside those of a binary that depends on
  // //models/data:gpt2_tokenizer_files).
  static absl::StatusOr<Gpt2Tokenizer> Shipped();
  // Whether `dir` holds either pair of files.
  static bool IsTokenizerDir(const std::string& dir);
  // What a tool's --tokenizer flag names: "gpt2" is the shipped copy
  // (Shipped), anything else a folder (Read). source() is the folder read.
  // InvalidArgument for "sentencepiece:<model>", tools/spm_tokenize.py's
  // record of the SentencePiece model a .bin was encoded with.
  static absl::StatusOr<Gpt2Tokenizer> Open(const std::string& name);
  // Open(name) for a model whose vocabulary has `model_vocab` ids:
  // InvalidArgument "its vocabulary has N ids and the model's M: the model was
  // not trained on its tokens" when the tokenizer's ids do not all fit.
  static absl::StatusOr<Gpt2Tokenizer> OpenForModel(const std::string& name, int64_t model_vocab);
  // How a checkpoint or a token file's record names the tokenizer `name`
  // (Open's): "gpt2" as it is, a folder by its absolute path.
  static std::string RecordName(const std::string& name);
  // The paths of `dir`'s vocabulary and merges files (either pair; Read's
  // NotFound when neither is there).
  static absl::StatusOr<std::pair<std::string, std::string>> FindFiles(const std::string& dir);

  // Token ids of `text` (see the top of this file).
  std::vector<int64_t> Encode(absl::string_view text) const;
  // The same, but "<|endoftext|>" in the text is the special token, and the
  // text between such markers is encoded on its own (tiktoken's
  // encode(text, allowed_special="all"), nanoGPT's prompts). Encode(text) when
  // the vocabulary has no "<|endoftext|>".
  std::vector<int64_t> EncodeWithSpecialTokens(absl::string_view text) const;
  // The bytes of `ids`. InvalidArgument naming the first id that is no
  // token. A sequence cut inside a character gives its bytes as they are.
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const;

  // The largest id + 1 (50257 for GPT-2).
  int64_t vocab_size() const { return static_cast<int64_t>(token_bytes_.size()); }
  // The id of "<|endoftext|>", when the vocabulary has it (50256 for GPT-2).
  std::optional<int64_t> end_of_text() const { return end_of_text_; }
  int64_t num_merges() const { return num_merges_; }
  const std::string& source() const { return source_; }  // the folder read

 private:
  struct Merge {
    int32_t rank;    // line order in merges.txt: lower merges first
    int32_t result;  // the merged token's id
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  // One pre-token's ids, appended to `out`.
  void EncodePiece(absl::string_view piece, std::vector<int32_t>& out) const;
  // Encode's work, appending to `ids`; `done` keeps each distinct piece's ids
  // (text repeats its words), valid while the text it points into is.
  using PieceCache = absl::flat_hash_map<absl::string_view, std::vector<int32_t>>;
  void EncodeInto(absl::string_view text, PieceCache& done, std::vector<int64_t>& ids) const;

  std::string source_;
  std::vector<std::optional<std::string>> token_bytes_;  // by id; nullopt: unused id
  int32_t byte_token_[256] = {};                         // byte -> its token's id
  absl::flat_hash_map<uint64_t, Merge> merges_;          // PairKey(left, right)
  int64_t num_merges_ = 0;
  std::optional<int64_t> end_of_text_;
};

}  // namespace data

#endif  // MODELS_DATA_GPT2_TOKENIZER_H_
