// The generation binaries' decoding flags (decoding_flags.h).
#include "models/common/decoding_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"

ABSL_FLAG(double, repetition_penalty, 1.0,
          "divides the logit of each token already in the sequence where positive, multiplies "
          "it where negative (Hugging Face's repetition_penalty); > 1 discourages repeats; 1: off");
ABSL_FLAG(int64_t, no_repeat_ngram_size, 0,
          "never a token that repeats an n-gram of this size already in the sequence (Hugging "
          "Face's no_repeat_ngram_size); 0: off");
ABSL_FLAG(int64_t, min_new_tokens, 0,
          "the eos id is never drawn before a row has this many new tokens (Hugging Face's "
          "min_new_tokens); 0: off");
ABSL_FLAG(int64_t, num_beams, 1,
          "beam search with this many beams per example (sampled with --temperature > 0); 1: none");
ABSL_FLAG(double, length_penalty, 1.0,
          "beam search: a finished hypothesis scores its log-probability / length^this (its new "
          "tokens); > 1 favours longer ones");
ABSL_FLAG(bool, early_stopping, false,
          "beam search: an example is done once --num_beams hypotheses finished");

namespace train {

void DecodingFromCommandLine(Decoding* decoding) {
  decoding->repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  decoding->no_repeat_ngram_size = absl::GetFlag(FLAGS_no_repeat_ngram_size);
  decoding->min_new_tokens = absl::GetFlag(FLAGS_min_new_tokens);
  decoding->num_beams = absl::GetFlag(FLAGS_num_beams);
  decoding->length_penalty = absl::GetFlag(FLAGS_length_penalty);
  decoding->early_stopping = absl::GetFlag(FLAGS_early_stopping);
}

}  // namespace train
