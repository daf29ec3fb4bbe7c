// T5's tokenizer in C++: a SentencePiece model (libsentencepiece, through
// spiece_processor.h) and the sentinels right above its pieces, as
// data::SpanCorruptor numbers them and Hugging Face's T5Tokenizer names them
// (<extra_id_0> the highest id). //models/t5:generate takes and prints text
// with it; tools/spm_tokenize.py --output_lines / --decode_lines give the
// same ids and text (//models/t5:spiece_tokenizer_test holds the two alike).
#ifndef MODELS_T5_SPIECE_TOKENIZER_H_
#define MODELS_T5_SPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/t5/spiece_files.h"

namespace t5 {

class SpieceProcessor;

// Characters of a part of a long text before it runs on to a line end
// (tools/spm_tokenize.py's PART_CHARS).
inline constexpr size_t kSentencePiecePartChars = size_t{1} << 20;

// Where the first part of UTF-8 `text` ends: after the first '\n' at or past
// its character kSentencePiecePartChars, or at its end. SentencePiece's ids
// depend on where a text is cut (its Viterbi breaks near-ties by scores
// summed from the input's start), so //tools:tokenize and
// tools/spm_tokenize.py (which counts characters of the file read as it is,
// "\r" included) cut alike and write the same ids.
size_t SentencePiecePartEnd(absl::string_view text);


class SpieceTokenizer {
 public:
  // `model` (ReadSentencePieceModel's) with `sentinels` ids above its
  // pieces. InvalidArgument naming model.path when the library does not
  // load it or counts other pieces than model.pieces, or for sentinels < 0.
  static absl::StatusOr<SpieceTokenizer> Load(const SentencePieceModel& model,
                                              int64_t sentinels);
  SpieceTokenizer(SpieceTokenizer&&) noexcept;
  SpieceTokenizer& operator=(SpieceTokenizer&&) noexcept;
  ~SpieceTokenizer();

  int64_t pieces() const { return pieces_; }
  int64_t sentinels() const { return sentinels_; }
  int64_t eos_id() const { return eos_id_; }  // the model's </s>; -1: none
  const std::string& path() const { return path_; }

  // The ids of `text`: each "<extra_id_k>" in it is sentinel k (id
  // pieces() + sentinels() - 1 - k), the text between goes through the model
  // (normalized as it says: T5's collapses whitespace), as T5Tokenizer splits
  // text at its special tokens. No </s> is added. InvalidArgument naming the
  // sentinel when k is not below sentinels(), or the byte where text that is
  // not UTF-8 goes wrong (SentencePiece would take it silently).
  // `read_sentinels` false: "<extra_id_k>" is text like any other (training
  // data, as tools/spm_tokenize.py encodes a token file). Safe to call from
  // several threads at once.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text,
                                              bool read_sentinels = true) const;

  // The text of `ids`: runs of the model's ids through it (control pieces,
  // as </s> and <pad>, give none), sentinels as "<extra_id_k>", followed by
  // a space when the next piece starts with one (Hugging Face: "<extra_id_0>
  // park"); ids above the pieces and sentinels (rows a vocabulary is padded
  // with) as "<|id N|>", as minGPT shows ids its tokenizer lacks (negative
  // ones too).
  std::string Decode(absl::Span<const int64_t> ids) const;

 private:
  SpieceTokenizer(std::unique_ptr<SpieceProcessor> sp, int64_t sentinels, std::string path);

  std::unique_ptr<SpieceProcessor> sp_;
  int64_t pieces_ = 0;
  int64_t sentinels_ = 0;
  int64_t eos_id_ = -1;
  std::string path_;
};

}  // namespace t5

#endif  // MODELS_T5_SPIECE_TOKENIZER_H_
