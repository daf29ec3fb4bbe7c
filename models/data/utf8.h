// UTF-8 as the tokenizers read it (RFC 3629: no overlong forms, surrogates
// or code points above U+10FFFF): GPT-2's BPE decodes text character by
// character, T5's SentencePiece refuses text that is not UTF-8.
#ifndef MODELS_DATA_UTF8_H_
#define MODELS_DATA_UTF8_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace data {

// Length in bytes of the UTF-8 character at text[pos] (pos < text.size())
// and its code point; an invalid sequence is one byte of code point U+FFFD.
int DecodeUtf8(absl::string_view text, size_t pos, uint32_t& cp);

// The offset of the first byte of `text` that does not begin a well-formed
// UTF-8 character; npos when the text is UTF-8 throughout.
size_t FirstNonUtf8(absl::string_view text);

}  // namespace data

#endif  // MODELS_DATA_UTF8_H_
