// The decoding loops of minGPT's and T5's generation, as Hugging Face's
// generate runs them: rows drawn token by token (greedy or sampled,
// train::Sampling), or beam search (num_beams > 1; sampled beams with
// temperature > 0), each row stopping at eos_id. The model's side is a
// NextTokens: the next-token logits of every row, and the rows' reordering
// as beams move.
//
// A row is a prefix (minGPT: the prompt; T5: decoder_start_id) and the new
// tokens after it; every row of a call has as many new tokens.
// repetition_penalty and no_repeat_ngram_size look at the whole row, prefix
// included.
#ifndef MODELS_COMMON_DECODING_H_
#define MODELS_COMMON_DECODING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/common/sampling.h"

namespace train {

using TokenRows = std::vector<std::vector<int64_t>>;

struct Decoding : Sampling {
  int64_t max_new_tokens = 32;
  int64_t eos_id = -1;  // a row stops after drawing it; -1: every row runs max_new_tokens
  // eos_id is never drawn before a row has this many new tokens (Hugging
  // Face's min_new_tokens: its score is -inf until then); 0: off.
  int64_t min_new_tokens = 0;
  // Beam search: num_beams hypotheses per example, as Hugging Face's
  // BeamSearchScorer: each step keeps the best 2 num_beams continuations of
  // all beams by summed log-probability; an eos among the first num_beams
  // finishes a hypothesis, the rest are the next beams. With temperature > 0
  // (Hugging Face's beam sampling, do_sample with num_beams) each beam's
  // log-probabilities go through temperature, top_k and top_p (WarpScores)
  // before they add to its sum, and the 2 num_beams are drawn without
  // replacement from the softmax of every continuation's sum (example b's
  // j-th draw at step n with DrawUniform(seed, b, 2 num_beams n + j)), then
  // ranked by sum. A finished hypothesis scores sum / length^length_penalty
  // (length: its new tokens, eos included; > 1 favours longer ones). An
  // example is done once num_beams hypotheses finished and (unless
  // early_stopping) the best running beam, scored at its length now, cannot
  // beat the worst of them; at max_new_tokens the running beams compete too.
  // 1: no beams.
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  bool early_stopping = false;
  // Beam search returns this many of each example's best hypotheses, best
  // first (Hugging Face's num_return_sequences; at most num_beams).
  int64_t num_return_sequences = 1;

  bool beams() const { return num_beams > 1; }
  // "greedy", "sampled", "3 beams, sampled", ..., then what is on of
  // ", 2 returned", ", min_new_tokens 5", ", repetition_penalty 1.2",
  // ", no_repeat_ngram_size 3", in that order.
  std::string Describe() const;
  // InvalidArgument naming the field unless max_new_tokens >= 0, eos_id is
  // an id below vocab_size or -1, 0 <= min_new_tokens <= max_new_tokens,
  // num_beams >= 1, 1 <= num_return_sequences <= num_beams, length_penalty
  // is finite and the sampling is valid (Sampling::Validate).
  absl::Status Validate(int64_t vocab_size) const;
};

// A model's side of decoding, for R rows.
class NextTokens {
 public:
  virtual ~NextTokens() = default;
  // rows: the R rows so far (prefix and new tokens, as many new tokens in
  // each; the earlier calls were given each row without its last token) ->
  // (R, V) row-major f32, each row's next-token logits.
  virtual std::vector<float> Logits(const TokenRows& rows) = 0;
  // Beam search's reordering: row i continues what row rows[i] held (state
  // kept between calls, as a key/value cache).
  virtual void SelectRows(const std::vector<int64_t>& rows) = 0;
};

// Greedy or sampled rows (options' Sampling; row r's n-th new token drawn
// with DrawUniform(seed, r, n)): each row's new tokens, ending with eos_id
// when it was drawn. `prefixes` are the model's R rows. on_token(n, tokens),
// when given, gets the n-th new token of every row as soon as it is drawn
// (-1 for a row that ended before); no call once every row ended.
absl::StatusOr<TokenRows> SampleRows(
    NextTokens& model, const TokenRows& prefixes, int64_t vocab_size, const Decoding& options,
    const std::function<void(int64_t n, absl::Span<const int64_t> tokens)>& on_token = nullptr);

// Beam search over B examples (`prefixes`: one each): the model's rows are
// the B num_beams beams, row b num_beams + k example b's beam k (a model made
// for each prefix repeated num_beams times). Returns each example's
// num_return_sequences best hypotheses (row b n + j: example b's j-th best),
// their new tokens, ending with eos_id where they finished there.
// InvalidArgument when the exclusions (top_k, top_p, no_repeat_ngram_size)
// leave an example fewer hypotheses than it returns, or a greedy beam search
// has a vocabulary of one id.
absl::StatusOr<TokenRows> BeamSearch(NextTokens& model, const TokenRows& prefixes,
                                     int64_t vocab_size, const Decoding& options);

}  // namespace train

#endif  // MODELS_COMMON_DECODING_H_
