// T5's tokenizer files for an exported folder (spiece_files.h).
#include "models/t5/spiece_files.h"

#include <sys/stat.h>

#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "models/data/span_corruption.h"
#include "tensor/json.h"
#include "tensor/read_file.h"

namespace t5 {
namespace {

// Reads a base-128 varint at bytes[*at], advancing *at; false past the end
// or beyond 10 bytes.
bool ReadVarint(absl::string_view bytes, size_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*at >= bytes.size()) return false;
    const uint8_t b = static_cast<uint8_t>(bytes[(*at)++]);
    *value |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80u) == 0) return true;
  }
  return false;
}

// Calls fn(field, wire type, payload, value) for each field of the message
// `bytes` (payload: a length-delimited field's bytes, else empty; value: a
// varint's, else 0); an error for a malformed message, or fn's first.
absl::Status WalkMessage(
    absl::string_view bytes,
    const std::function<absl::Status(uint64_t, uint64_t, absl::string_view, uint64_t)>& fn) {
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t key = 0;
    if (!ReadVarint(bytes, &at, &key)) {
      return absl::InvalidArgumentError("a field key runs past the end");
    }
    const uint64_t field = key >> 3, wire = key & 7;
    if (field == 0) return absl::InvalidArgumentError("a field numbered 0");
    uint64_t size = 0, value = 0;
    switch (wire) {
      case 0:  // varint
        if (!ReadVarint(bytes, &at, &value)) {
          return absl::InvalidArgumentError("a varint runs past the end");
        }
        break;
      case 1:
        size = 8;
        break;
      case 2:
        if (!ReadVarint(bytes, &at, &size)) {
          return absl::InvalidArgumentError("a length runs past the end");
        }
        break;
      case 5:
        size = 4;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("field ", field, " has wire type ", wire, ", which a model has not"));
    }
    if (size > bytes.size() - at) return absl::InvalidArgumentError("a field runs past the end");
    const absl::string_view payload = wire == 2 ? bytes.substr(at, size) : absl::string_view();
    at += size;
    absl::Status s = fn(field, wire, payload, value);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

constexpr uint64_t kUnknownType = 2;  // SentencePiece::Type UNKNOWN
constexpr int64_t kMaxModelBytes = int64_t{64} << 20;

}  // namespace

absl::StatusOr<SentencePieces> ParseSentencePieces(absl::string_view bytes) {
  SentencePieces model;
  absl::Status s = WalkMessage(
      bytes, [&](uint64_t field, uint64_t wire, absl::string_view piece, uint64_t) {
        if (field != 1) return absl::OkStatus();
        if (wire != 2) return absl::InvalidArgumentError("field 1 (a piece) is not a message");
        // A SentencePiece: its text (field 1, bytes) and type (field 3, a varint).
        const int64_t id = static_cast<int64_t>(model.texts.size());
        bool has_text = false;
        std::string text;
        absl::Status inner = WalkMessage(
            piece, [&](uint64_t f, uint64_t w, absl::string_view payload, uint64_t value) {
              if (f == 1 && w == 2) {
                has_text = true;
                text = std::string(payload);
              }
              if (f == 3 && w == 0 && value == kUnknownType && model.unk_id < 0) {
                model.unk_id = id;
              }
              return absl::OkStatus();
            });
        if (!inner.ok() || !has_text) {
          return absl::InvalidArgumentError(absl::StrCat(
              "piece ", id, " is not a SentencePiece",
              inner.ok() ? " (it has no text)" : absl::StrCat(": ", inner.message())));
        }
        model.texts.push_back(std::move(text));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  if (model.texts.empty()) return absl::InvalidArgumentError("it holds no piece");
  return model;
}

absl::StatusOr<SentencePieceModel> ReadSentencePieceModel(const std::string& spec) {
  std::string path(absl::StripPrefix(spec, "sentencepiece:"));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) path += "/spiece.model";
  SentencePieceModel model;
  model.path = path;
  if (::stat(path.c_str(), &st) == 0 && st.st_size > kMaxModelBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a SentencePiece model: it is ", st.st_size, " bytes (a model is < 64 MiB)"));
  }
  absl::StatusOr<std::string> bytes = tensor::ReadFile(path, kMaxModelBytes);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes.status().message(), " (a SentencePiece model, spiece.model)"));
  }
  model.bytes = *std::move(bytes);
  absl::StatusOr<SentencePieces> pieces = ParseSentencePieces(model.bytes);
  if (!pieces.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a SentencePiece model: ", pieces.status().message()));
  }
  model.pieces = *std::move(pieces);
  // The sentinels a tokenizer_config.json beside it gives, if one does.
  const size_t slash = path.rfind('/');
  const std::string config =
      (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) +
      "/tokenizer_config.json";
  absl::StatusOr<std::string> text = tensor::ReadFile(config);
  if (!text.ok() && !absl::IsNotFound(text.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat(text.status().message(), " (the tokenizer configuration beside ", path, ")"));
  }
  if (text.ok()) {
    absl::StatusOr<tensor::Json> json = tensor::ParseJson(*text);
    const tensor::Json* extra = json.ok() ? json->Get("extra_ids") : nullptr;
    if (!json.ok() || json->kind != tensor::Json::Kind::kObject ||
        (extra != nullptr && (extra->kind != tensor::Json::Kind::kNumber ||
                              !absl::SimpleAtoi(extra->text, &model.extra_ids) ||
                              model.extra_ids < 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          config, " (beside ", path, ") is not a tokenizer configuration: ",
          !json.ok()                                  ? json.status().message()
          : json->kind != tensor::Json::Kind::kObject ? "not a JSON object"
                                                      : "its extra_ids is not an integer >= 0"));
    }
  }
  return model;
}

absl::StatusOr<int64_t> SentinelsOfTokenizer(const SentencePieceModel& model,
                                             const std::string& loader_state,
                                             const std::string& weights, int64_t vocab_size) {
  const int64_t pieces = static_cast<int64_t>(model.pieces.texts.size());
  int64_t sentinels = model.extra_ids >= 0 ? model.extra_ids : 100;
  if (absl::StatusOr<data::SpanCorruptionVocab> vocab = data::SpanCorruptionVocabOf(loader_state);
      vocab.ok()) {
    if (vocab->source_vocab != pieces) {
      return absl::InvalidArgumentError(absl::StrCat(
          model.path, " has ", pieces, " pieces, but the data of ", weights, " had ",
          vocab->source_vocab, " ids: not the tokenizer it was encoded with"));
    }
    sentinels = vocab->sentinels;
  }
  if (pieces + sentinels > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("its ", pieces, " pieces and ", sentinels,
                     " sentinels do not fit the model's vocabulary of ", vocab_size));
  }
  return sentinels;
}

absl::StatusOr<TokenizerOfWeights> ReadTokenizerOfWeights(const std::string& spec,
                                                          const std::string& what,
                                                          const std::string& loader_state,
                                                          const std::string& weights,
                                                          int64_t vocab_size) {
  auto failed = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  };
  absl::StatusOr<SentencePieceModel> model = ReadSentencePieceModel(spec);
  if (!model.ok()) return failed(model.status());
  absl::StatusOr<int64_t> sentinels =
      SentinelsOfTokenizer(*model, loader_state, weights, vocab_size);
  if (!sentinels.ok()) return failed(sentinels.status());
  return TokenizerOfWeights{*std::move(model), *sentinels};
}

std::string T5TokenizerConfigJson(const SentencePieces& model, int64_t sentinels,
                                  int64_t pad_id, int64_t eos_id) {
  const auto text = [&](int64_t id) {
    return id >= 0 && id < static_cast<int64_t>(model.texts.size()) ? model.texts[id]
                                                                     : std::string();
  };
  std::string json = absl::StrCat("{\n  \"tokenizer_class\": \"T5Tokenizer\",\n",
                                  "  \"extra_ids\": ", sentinels);
  for (const auto& [key, value] : {std::pair<const char*, std::string>{"eos_token", text(eos_id)},
                                   {"unk_token", text(model.unk_id)},
                                   {"pad_token", text(pad_id)}}) {
    if (!value.empty()) absl::StrAppend(&json, ",\n  \"", key, "\": ", tensor::JsonQuote(value));
  }
  return json + "\n}\n";
}

}  // namespace t5
