// The repetition flags both generation binaries take (--repetition_penalty,
// --no_repeat_ngram_size; train::Sampling's fields of the same names),
// defined once here; link this library to get them.
#ifndef MODELS_COMMON_REPETITION_FLAGS_H_
#define MODELS_COMMON_REPETITION_FLAGS_H_

#include "models/common/sampling.h"

namespace train {

// Sets sampling->repetition_penalty and no_repeat_ngram_size from the flags
// (after absl::ParseCommandLine; Sampling::Validate checks them).
void RepetitionFromCommandLine(Sampling* sampling);

}  // namespace train

#endif  // MODELS_COMMON_REPETITION_FLAGS_H_
