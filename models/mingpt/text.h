// Text in and out of minGPT's token ids: a GPT-2 BPE tokenizer's
// (data::Gpt2Tokenizer), or the bytes themselves for a byte-level model
// (vocabulary 256, the shipped text). What //models/mingpt:sample and the
// train binary's --sample_every share.
#ifndef MODELS_MINGPT_TEXT_H_
#define MODELS_MINGPT_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/data/gpt2_tokenizer.h"

namespace mingpt {

inline constexpr int64_t kByteVocab = 256;

// The ids of `text` (`what` names it in errors: "--prompt", ...): the
// tokenizer's ("<|endoftext|>" in it is the special token, as nanoGPT's
// sample.py), or its bytes for a byte-level model. InvalidArgument when the
// model's vocabulary is not bytes and there is no tokenizer, or the text
// gives no id.
absl::StatusOr<std::vector<int64_t>> EncodeText(
    const std::string& text, const std::string& what, int64_t vocab_size,
    const std::optional<data::Gpt2Tokenizer>& tokenizer);

// Whether ids of a model with this vocabulary can be shown as text.
bool CanDecodeText(int64_t vocab_size, const std::optional<data::Gpt2Tokenizer>& tokenizer);

// The bytes of each id: the tokenizer's, or the id itself (a byte-level
// model); an id the tokenizer lacks (a padded vocabulary's) as <|id N|>.
std::string DecodeText(absl::Span<const int64_t> ids,
                       const std::optional<data::Gpt2Tokenizer>& tokenizer);

}  // namespace mingpt

#endif  // MODELS_MINGPT_TEXT_H_
