// Sampling from minGPT: logits of the last position -> filtered distribution
// -> one draw per row, repeated max_new_tokens times.
#include "models/mingpt/generate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mingpt {

absl::Status SamplingOptions::Validate() const {
  if (max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 0, got ", max_new_tokens));
  }
  return train::Sampling::Validate();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(
    GPT& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options,
    tensor::Device device,
    const std::function<void(int64_t n, absl::Span<const int64_t> tokens)>& on_token) {
  absl::Status valid = options.Validate();
  if (!valid.ok()) return valid;
  const GptConfig& config = model.config();
  const int64_t B = static_cast<int64_t>(prompts.size());
  if (B == 0) return absl::InvalidArgumentError("no prompt to continue");
  for (int64_t r = 0; r < B; ++r) {
    if (prompts[r].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt ", r, " is empty: give one token at least"));
    }
    for (int64_t id : prompts[r]) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("prompt ", r, " has token id ", id,
                                                       " outside the model's vocabulary [0, ",
                                                       config.vocab_size, ")"));
      }
    }
  }
  model.Train(false);
  std::vector<std::vector<int64_t>> rows = prompts;
  // Left padding: row r's token i sits at position pad[r] + i of the batch.
  int64_t longest = 0;
  for (const std::vector<int64_t>& p : prompts) {
    longest = std::max(longest, static_cast<int64_t>(p.size()));
  }
  std::vector<int64_t> pad(B);
  for (int64_t r = 0; r < B; ++r) pad[r] = longest - static_cast<int64_t>(prompts[r].size());
  const bool padded = std::any_of(pad.begin(), pad.end(), [](int64_t p) { return p > 0; });
  std::vector<nn::KvCache> caches;  // per block, while the sequence fits in block_size
  std::vector<int64_t> context;     // (B, T) row-major: the positions this forward runs
  std::vector<int64_t> window_pad(B);
  std::vector<int64_t> drawn(B);
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const int64_t length = longest + n;  // the batch's positions so far
    const bool cached = options.kv_cache && length <= config.block_size;
    // Cached: the positions the caches lack (the prompt, then the last token).
    // Otherwise: the last block_size positions.
    const int64_t start = cached ? (caches.empty() ? 0 : caches[0].length)
                                 : length - std::min(length, config.block_size);
    context.clear();
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t p = start; p < length; ++p) {
        context.push_back(p < pad[r] ? 0 : rows[r][p - pad[r]]);  // padding: any valid id
      }
      // The padding of the window the forward runs (cached: of the whole sequence).
      window_pad[r] = std::max<int64_t>(0, pad[r] - (cached ? 0 : start));
    }
    const tensor::Tensor idx =
        tensor::Tensor::FromData<int64_t>(context, {B, length - start}).To(device);  // (B, T)
    tensor::Tensor last;                                                             // (B, V)
    if (cached) {
      last = model.DecodeLogits(idx, caches, padded ? pad : std::vector<int64_t>());
    } else if (std::any_of(window_pad.begin(), window_pad.end(), [](int64_t p) { return p; })) {
      std::vector<nn::KvCache> window;  // the forward over the window, with its padding masked
      last = model.DecodeLogits(idx, window, window_pad);
    } else {
      last = model.LastLogits(idx);
    }
    if (!cached) caches.clear();  // the window moves on: free the keys and values
    std::vector<float> logits = last.ToVector<float>();  // (B, V)
    for (int64_t r = 0; r < B; ++r) {
      absl::Span<float> row_logits(logits.data() + r * config.vocab_size,
                                   static_cast<size_t>(config.vocab_size));
      // Repeats of the row's prompt and new tokens (repetition_penalty, no_repeat_ngram_size).
      if (options.controls_repetition())
        train::ApplyRepetitionControls(row_logits, rows[r], options);
      absl::StatusOr<int64_t> token =
          train::SampleFromLogits(row_logits, options, train::DrawUniform(options.seed, r, n));
      if (!token.ok()) {
        return absl::InternalError(
            absl::StrCat("row ", r, ", new token ", n, ": ", token.status().message()));
      }
      drawn[r] = *token;
      rows[r].push_back(*token);
    }
    if (on_token) on_token(n, drawn);
  }
  return rows;
}

}  // namespace mingpt
