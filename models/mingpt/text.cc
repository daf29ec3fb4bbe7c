// Text in and out of minGPT's token ids (text.h).
#include "models/mingpt/text.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mingpt {

absl::StatusOr<std::vector<int64_t>> EncodeText(
    const std::string& text, const std::string& what, int64_t vocab_size,
    const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  std::vector<int64_t> ids;
  if (tokenizer.has_value()) {
    ids = tokenizer->EncodeWithSpecialTokens(text);
  } else if (vocab_size != kByteVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is byte-level text, and this model's vocabulary is ", vocab_size,
                     " token ids, not ", kByteVocab,
                     " bytes: name its tokenizer (--tokenizer=gpt2 for GPT-2's)"));
  } else {
    for (unsigned char ch : text) ids.push_back(ch);
  }
  if (ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty: give one byte at least (default \"\\n\")"));
  }
  return ids;
}

bool CanDecodeText(int64_t vocab_size, const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  return vocab_size <= kByteVocab || tokenizer.has_value();
}

std::string DecodeText(absl::Span<const int64_t> ids,
                       const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  std::string bytes;
  for (int64_t id : ids) {
    absl::StatusOr<std::string> token =
        tokenizer.has_value() ? tokenizer->Decode({id}) : std::string(1, static_cast<char>(id));
    absl::StrAppend(&bytes, token.ok() ? *token : absl::StrCat("<|id ", id, "|>"));
  }
  return bytes;
}

}  // namespace mingpt
