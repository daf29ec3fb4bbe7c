// The decoding flags both generation binaries take, defined once here (link
// this library to get them): the repetition controls (--repetition_penalty,
// --no_repeat_ngram_size), --min_new_tokens and beam search (--num_beams,
// --length_penalty, --early_stopping), train::Decoding's fields of the same
// names. The flags whose defaults or meaning differ by binary
// (--max_new_tokens, --temperature, --eos_id, how many rows per input, ...)
// stay each binary's.
#ifndef MODELS_COMMON_DECODING_FLAGS_H_
#define MODELS_COMMON_DECODING_FLAGS_H_

#include "models/common/decoding.h"

namespace train {

// Sets those fields of `decoding` from the flags (after
// absl::ParseCommandLine; Decoding::Validate checks them).
void DecodingFromCommandLine(Decoding* decoding);

// Flags set off their defaults that the decoding `decoding` describes would
// not read, as InvalidArgument naming them: --top_k / --top_p (the binary's)
// narrowing the draw (top_k > 0, top_p < 1) when --temperature is 0, which
// draws nothing (greedy or beam search), and
// --length_penalty / --early_stopping without beams (--num_beams 1).
absl::Status CheckDecodingFlagsApply(const Decoding& decoding);

}  // namespace train

#endif  // MODELS_COMMON_DECODING_FLAGS_H_
