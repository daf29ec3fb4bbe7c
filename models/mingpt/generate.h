// Text generation with a trained minGPT: minGPT's GPT.generate and nanoGPT's
// sample.py. Each new token is drawn from the model's distribution for the
// next position (temperature, top-k and top-p / nucleus filtering), appended,
// and fed back. With the key/value cache (the default) the prompt runs once
// and every new token costs one position (GPT::DecodeLogits); once the
// sequence outgrows block_size, the context is cropped to its last block_size
// tokens, as minGPT does, and each token runs the forward over that window
// (the positions shift, so cached keys no longer apply).
//
// Draws are reproducible: the uniform number behind row r's n-th new token is
// Philox(seed) at counter (r, n) (53 bits), so a row's sample depends on the seed, its
// row index and the model's logits only.
#ifndef MODELS_MINGPT_GENERATE_H_
#define MODELS_MINGPT_GENERATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/mingpt/model.h"

namespace mingpt {

struct SamplingOptions {
  int64_t max_new_tokens = 256;
  // Divides the logits before the softmax; 0: greedy (the most likely token,
  // the lowest id among equals), and top_k / top_p do not matter.
  double temperature = 1.0;
  // Keep only the k most likely tokens; 0: all.
  int64_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability (after
  // temperature and top_k) reaches top_p; 1: all.
  double top_p = 1.0;
  uint64_t seed = 1;
  // Keys and values of earlier positions kept per block while the sequence
  // fits in block_size; false: the forward over the whole context each token.
  bool kv_cache = true;

  // InvalidArgument naming the field: max_new_tokens < 0, temperature < 0 or
  // not finite, top_k < 0, top_p not in (0, 1].
  absl::Status Validate() const;
};

// The token drawn from one row of logits (V) with `u` uniform in [0, 1): the
// smallest id whose cumulative probability (ids ordered by falling logit,
// ties by id) exceeds u. InvalidArgument when a logit is nan or +-inf.
absl::StatusOr<int64_t> SampleFromLogits(absl::Span<const float> logits,
                                         const SamplingOptions& options, double u);

// Continues each of the B prompts (lengths >= 1, ids in [0, vocab_size)) by
// options.max_new_tokens tokens, running `model` in eval mode (no dropout; it
// is left in eval mode) on `device`, where its parameters are. Returns the B
// rows, prompt included. `on_token(n, tokens)`, when given, is called with
// the n-th new token of every row (B ids) as soon as it is drawn.
// Prompts of unequal lengths are left-padded to the longest (as Hugging
// Face's generate does for GPT-2): the padding is masked out of every
// attention and each row's positions start at its first token, so a row
// continues as it would alone, up to rounding (the same draws; greedy or
// sampled tokens can differ only where two logits are that close). The batch
// runs at the longest prompt's length: a shorter row's context is cropped
// with the batch's (its last block_size tokens) and leaves the key/value
// cache when the batch's does.
absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(
    GPT& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options,
    tensor::Device device,
    const std::function<void(int64_t n, absl::Span<const int64_t> tokens)>& on_token = nullptr);

}  // namespace mingpt

#endif  // MODELS_MINGPT_GENERATE_H_
