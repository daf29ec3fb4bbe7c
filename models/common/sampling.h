// Drawing the next token from a model's logits, as minGPT's GPT.generate,
// nanoGPT's sample.py and Hugging Face's generate(do_sample=True) do:
// temperature, then top-k, then top-p (nucleus) filtering, then one draw; or
// greedy (temperature 0). Shared by minGPT's and T5's generation.
//
// Draws are reproducible: the uniform number behind row r's n-th new token is
// Philox(seed) at counter (r, n) (53 bits), so a row's sample depends on the
// seed, its row index and the model's logits only.
#ifndef MODELS_COMMON_SAMPLING_H_
#define MODELS_COMMON_SAMPLING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace train {

struct Sampling {
  // Divides the logits before the softmax; 0: greedy (the most likely token,
  // the lowest id among equals), and top_k / top_p do not matter.
  double temperature = 1.0;
  // Keep only the k most likely tokens, and every one tied with the k-th
  // (nanoGPT and Hugging Face drop only the logits below the k-th); 0: all.
  int64_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability (after
  // temperature and top_k) reaches top_p; 1: all.
  double top_p = 1.0;
  uint64_t seed = 1;
  // Repeats, applied to a row's logits before all of the above by
  // ApplyRepetitionControls (Hugging Face's logits processors of the same
  // names). repetition_penalty (CTRL's): the logit of each token already in
  // the row's sequence is divided by it where positive and multiplied by it
  // where negative; > 1 discourages repeats, 1: off. no_repeat_ngram_size n:
  // a token that would complete an n-gram the sequence already holds is never
  // chosen; 0: off.
  double repetition_penalty = 1.0;
  int64_t no_repeat_ngram_size = 0;

  bool greedy() const { return temperature == 0.0; }
  bool controls_repetition() const { return repetition_penalty != 1.0 || no_repeat_ngram_size > 0; }
  // InvalidArgument naming the field: temperature < 0 or not finite, top_k <
  // 0, top_p not in (0, 1], repetition_penalty not finite and > 0,
  // no_repeat_ngram_size < 0.
  absl::Status Validate() const;
};

// Applies sampling.repetition_penalty and no_repeat_ngram_size to one row's
// scores (V; logits, or log-probabilities in a beam search, as Hugging Face
// does) given the row's `sequence` so far (minGPT: prompt and new tokens;
// T5: the decoder's inputs, decoder_start_id first): tokens the n-gram rule
// excludes get -inf. Ids of `sequence` outside [0, V) are ignored.
template <typename T>
void ApplyRepetitionControls(absl::Span<T> scores, absl::Span<const int64_t> sequence,
                             const Sampling& sampling);

// Uniform in [0, 1) with 53 random bits from Philox(seed) at counter (row, n):
// what row `row`'s n-th new token is drawn with.
double DrawUniform(uint64_t seed, uint64_t row, uint64_t n);

// The token drawn from one row of logits (V) with `u` uniform in [0, 1): the
// smallest id whose cumulative probability (ids ordered by falling logit,
// ties by id) exceeds u. A logit of -inf is a token never drawn
// (ApplyRepetitionControls' exclusions). InvalidArgument when a logit is nan
// or +inf, or every one is -inf.
absl::StatusOr<int64_t> SampleFromLogits(absl::Span<const float> logits, const Sampling& sampling,
                                         double u);

// Hugging Face's warpers on one row of scores (V), in place, as its beam
// sampling applies them to each beam's log-probabilities: the tokens
// SampleFromLogits could draw (temperature, then top_k, then top_p, over the
// finite scores) get score / temperature, every other one -inf. Greedy
// sampling leaves the scores as they are. InvalidArgument when a score is
// nan or +inf, or the row is empty.
absl::Status WarpScores(absl::Span<double> scores, const Sampling& sampling);

}  // namespace train

#endif  // MODELS_COMMON_SAMPLING_H_
