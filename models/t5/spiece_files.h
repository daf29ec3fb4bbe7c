// T5's tokenizer files beside an exported Hugging Face T5 folder. T5's
// tokenizer is SentencePiece (tools/spm_tokenize.py encodes with it; the C++
// side does not tokenize): a checkpoint records the spiece.model its data was
// encoded with, and `checkpoint export-hf` copies it next to the weights with
// a tokenizer_config.json giving the sentinels (extra_ids), so that
// transformers' T5Tokenizer.from_pretrained(OUT) reads the folder whole.
#ifndef MODELS_T5_SPIECE_FILES_H_
#define MODELS_T5_SPIECE_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace t5 {

// The pieces of a serialized SentencePiece ModelProto (its repeated field 1),
// walking the protobuf wire format: each one's text, and the id of the
// unknown piece (type UNKNOWN; -1 when none is). InvalidArgument when
// `bytes` is not a well-formed message or holds no piece.
struct SentencePieces {
  std::vector<std::string> texts;  // by id
  int64_t unk_id = -1;
};
absl::StatusOr<SentencePieces> ParseSentencePieces(absl::string_view bytes);

// A SentencePiece model named by `spec`: "sentencepiece:<file>" (the record
// tools/spm_tokenize.py writes beside a .bin), a spiece.model file, or a
// folder holding one. Its bytes and pieces; InvalidArgument naming the file
// when it cannot be read, is over 64 MiB or is not a SentencePiece model.
struct SentencePieceModel {
  std::string path;
  std::string bytes;
  SentencePieces pieces;
};
absl::StatusOr<SentencePieceModel> ReadSentencePieceModel(const std::string& spec);

// tokenizer_config.json for Hugging Face's T5Tokenizer over `model` with
// `sentinels` extra ids (<extra_id_0> the highest id, as the span corruption
// numbers them), its special tokens the model's own pieces: pad `pad_id`'s,
// eos `eos_id`'s (none when -1), unk the unknown piece.
std::string T5TokenizerConfigJson(const SentencePieces& model, int64_t sentinels,
                                  int64_t pad_id, int64_t eos_id);

}  // namespace t5

#endif  // MODELS_T5_SPIECE_FILES_H_
