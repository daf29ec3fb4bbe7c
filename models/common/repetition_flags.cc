#include "models/common/repetition_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"

ABSL_FLAG(double, repetition_penalty, 1.0,
          "divides the logit of each token already in the sequence where positive, multiplies "
          "it where negative (Hugging Face's repetition_penalty); > 1 discourages repeats; 1: off");
ABSL_FLAG(int64_t, no_repeat_ngram_size, 0,
          "never a token that repeats an n-gram of this size already in the sequence (Hugging "
          "Face's no_repeat_ngram_size); 0: off");

namespace train {

void RepetitionFromCommandLine(Sampling* sampling) {
  sampling->repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  sampling->no_repeat_ngram_size = absl::GetFlag(FLAGS_no_repeat_ngram_size);
}

}  // namespace train
