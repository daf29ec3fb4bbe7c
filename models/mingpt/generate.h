// Text generation with a trained minGPT: minGPT's GPT.generate and nanoGPT's
// sample.py. Each new token is drawn from the model's distribution for the
// next position (temperature, top-k and top-p / nucleus filtering), appended,
// and fed back. With the key/value cache (the default) the prompt runs once
// and every new token costs one position (GPT::DecodeLogits); once the
// sequence outgrows block_size, the context is cropped to its last block_size
// tokens, as minGPT does, and each token runs the forward over that window
// (the positions shift, so cached keys no longer apply).
// The draws are train::SampleFromLogits' (models/common/sampling.h),
// reproducible from the seed.
#ifndef MODELS_MINGPT_GENERATE_H_
#define MODELS_MINGPT_GENERATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/common/decoding.h"
#include "models/mingpt/model.h"

namespace mingpt {

// What to generate (train::Decoding): max_new_tokens per row, drawn as
// train::Sampling says (temperature, top_k, top_p, seed; sampling at
// temperature 1 by default; repetition_penalty and no_repeat_ngram_size over
// the row's prompt and new tokens), a row stopping at eos_id (GPT-2's
// <|endoftext|> is 50256), or beam search (num_beams > 1, as Hugging Face's
// generate for GPT-2; sampled beams with temperature > 0).
struct SamplingOptions : train::Decoding {
  SamplingOptions() { max_new_tokens = 256; }

  // Keys and values of earlier positions kept per block while the sequence
  // fits in block_size; false: the forward over the whole context each token.
  bool kv_cache = true;
};

// Continues each of the B prompts (lengths >= 1, ids in [0, vocab_size)) by
// options.max_new_tokens tokens (fewer where a row drew eos_id: it ends with
// it), running `model` in eval mode (no dropout; it is left in eval mode) on
// `device`, where its parameters are. Returns the B rows, prompt included;
// with beams, each prompt continued by its num_return_sequences best
// hypotheses (row b n + j: prompt b's j-th best). `on_token(n,
// tokens)`, when given, is called with the n-th new token of every row (B
// ids; -1 for a row that ended) as soon as it is drawn; beam search calls it
// never (its tokens are known at the end).
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
