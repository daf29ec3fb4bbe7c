// T5's tokenizer files beside an exported Hugging Face T5 folder. T5's
// tokenizer is SentencePiece (tools/spm_tokenize.py encodes with it, and
// t5::SpieceTokenizer for //models/t5:generate's text): a checkpoint records
// the spiece.model its data was encoded with, and `checkpoint export-hf`
// copies it next to the weights with a tokenizer_config.json giving the
// sentinels (extra_ids), so that transformers' T5Tokenizer.from_pretrained(OUT)
// reads the folder whole.
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
// folder holding one. Its bytes and pieces, and the sentinels a
// tokenizer_config.json beside it gives (its "extra_ids", as Hugging Face
// folders and `checkpoint export-hf` write it). InvalidArgument naming the
// file when it cannot be read, is over 64 MiB or is not a SentencePiece
// model, or naming the tokenizer_config.json when that cannot be read or is
// not a JSON object whose extra_ids (if any) is an integer >= 0.
struct SentencePieceModel {
  std::string path;
  std::string bytes;
  SentencePieces pieces;
  int64_t extra_ids = -1;  // -1: no tokenizer_config.json says
};
absl::StatusOr<SentencePieceModel> ReadSentencePieceModel(const std::string& spec);

// The sentinels right above `model`'s pieces for weights of `vocab_size`
// rows trained on the data of `loader_state` (a checkpoint's data loader
// state; "" for a Hugging Face folder's weights): the state's count, once its
// data's ids are checked to be the model's pieces; else model.extra_ids; else
// T5's 100. InvalidArgument when the data had another number of ids (not the
// tokenizer it was encoded with; `weights` names them), or when the pieces
// and the sentinels do not fit the rows.
absl::StatusOr<int64_t> SentinelsOfTokenizer(const SentencePieceModel& model,
                                             const std::string& loader_state,
                                             const std::string& weights, int64_t vocab_size);

// The two above for the tokenizer `spec` of weights (generate, export-hf):
// the model and its sentinels. InvalidArgument "<what>: <why>" (`what`
// names where `spec` came from: a flag, or the record it read).
struct TokenizerOfWeights {
  SentencePieceModel model;
  int64_t sentinels = 0;
};
absl::StatusOr<TokenizerOfWeights> ReadTokenizerOfWeights(const std::string& spec,
                                                          const std::string& what,
                                                          const std::string& loader_state,
                                                          const std::string& weights,
                                                          int64_t vocab_size);

// tokenizer_config.json for Hugging Face's T5Tokenizer over `model` with
// `sentinels` extra ids (<extra_id_0> the highest id, as the span corruption
// numbers them), its special tokens the model's own pieces: pad `pad_id`'s,
// eos `eos_id`'s (none when -1), unk the unknown piece.
std::string T5TokenizerConfigJson(const SentencePieces& model, int64_t sentinels,
                                  int64_t pad_id, int64_t eos_id);

}  // namespace t5

#endif  // MODELS_T5_SPIECE_FILES_H_
