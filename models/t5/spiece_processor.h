// The SentencePiece library (libsentencepiece) behind t5::SpieceTokenizer,
// with std types only: its header declares `namespace absl { using
// std::string_view; }`, which clashes with Abseil's absl::string_view, so
// spiece_processor.cc is the one file that includes it, and this header
// must not include Abseil either. Use SpieceTokenizer (spiece_tokenizer.h).
#ifndef MODELS_T5_SPIECE_PROCESSOR_H_
#define MODELS_T5_SPIECE_PROCESSOR_H_

#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace t5 {

class SpieceProcessor {
 public:
  // A model from its serialized ModelProto (a spiece.model's bytes); null
  // with the library's message in `error` when it does not load.
  static std::unique_ptr<SpieceProcessor> Load(const std::string& model_bytes,
                                               std::string* error);
  ~SpieceProcessor();

  int PieceSize() const;
  int EosId() const;  // -1: the model has none
  bool IsControl(int id) const;
  std::string IdToPiece(int id) const;

  // The model's ids of `text` (normalized as the model says; an empty
  // vector for text of no pieces), and the text of ids below PieceSize()
  // (control pieces give none, the unknown piece " \u2047 ").
  std::vector<int> Encode(const std::string& text) const;
  std::string Decode(const std::vector<int>& ids) const;

 private:
  explicit SpieceProcessor(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace t5

#endif  // MODELS_T5_SPIECE_PROCESSOR_H_
