// Generation from minGPT: the model's next-token logits for rows of prompts
// and new tokens (GptSteps), under the shared decoding loops
// (models/common/decoding.h): rows drawn one token at a time, or beams.
#include "models/mingpt/generate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mingpt {
namespace {

using Rows = std::vector<std::vector<int64_t>>;

// The next-token logits of rows that continue `prompts`. Prompts of unequal
// lengths are left-padded to the longest: row r's token i sits at position
// pad[r] + i of the batch. With the key/value cache, while the batch's
// sequence fits in block_size, each call runs the positions the caches lack
// (the prompts, then the last token); otherwise the last block_size
// positions, with the padding they hold masked out.
class GptSteps : public train::NextTokens {
 public:
  GptSteps(GPT& model, const Rows& prompts, bool kv_cache, tensor::Device device)
      : model_(model), kv_cache_(kv_cache), device_(device), pad_(prompts.size()) {
    int64_t longest = 0;
    for (const std::vector<int64_t>& p : prompts) {
      longest = std::max(longest, static_cast<int64_t>(p.size()));
    }
    for (size_t r = 0; r < prompts.size(); ++r) {
      pad_[r] = longest - static_cast<int64_t>(prompts[r].size());
      padded_ = padded_ || pad_[r] > 0;
    }
  }

  std::vector<float> Logits(const Rows& rows) override {
    const int64_t B = static_cast<int64_t>(rows.size());
    const int64_t block_size = model_.config().block_size;
    const int64_t length = pad_[0] + static_cast<int64_t>(rows[0].size());  // the batch's so far
    const bool cached = kv_cache_ && length <= block_size;
    const int64_t start =
        cached ? (caches_.empty() ? 0 : caches_[0].length) : length - std::min(length, block_size);
    std::vector<int64_t> context;  // (B, length - start) row-major: the positions this forward runs
    std::vector<int64_t> window_pad(B);
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t p = start; p < length; ++p) {
        context.push_back(p < pad_[r] ? 0 : rows[r][p - pad_[r]]);  // padding: any valid id
      }
      // The padding of the window the forward runs (cached: of the whole sequence).
      window_pad[r] = std::max<int64_t>(0, pad_[r] - (cached ? 0 : start));
    }
    const tensor::Tensor idx =
        tensor::Tensor::FromData<int64_t>(context, {B, length - start}).To(device_);  // (B, T)
    tensor::Tensor last;                                                              // (B, V)
    if (cached) {
      last = model_.DecodeLogits(idx, caches_, padded_ ? pad_ : std::vector<int64_t>());
    } else if (std::any_of(window_pad.begin(), window_pad.end(), [](int64_t p) { return p; })) {
      std::vector<nn::KvCache> window;  // the forward over the window, with its padding masked
      last = model_.DecodeLogits(idx, window, window_pad);
    } else {
      last = model_.LastLogits(idx);
    }
    if (!cached) caches_.clear();  // the window moves on: free the keys and values
    return last.ToVector<float>();
  }

  // Beam search's reordering, within the rows of one prompt (their padding is
  // the same).
  void SelectRows(const std::vector<int64_t>& rows) override {
    for (nn::KvCache& cache : caches_) nn::SelectKvCacheRows(cache, rows, "generate");
  }

 private:
  GPT& model_;
  const bool kv_cache_;
  const tensor::Device device_;
  std::vector<int64_t> pad_;
  bool padded_ = false;
  std::vector<nn::KvCache> caches_;  // per block, while the sequence fits in block_size
};

}  // namespace

absl::StatusOr<std::vector<std::vector<int64_t>>> Generate(
    GPT& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& options,
    tensor::Device device,
    const std::function<void(int64_t n, absl::Span<const int64_t> tokens)>& on_token) {
  const GptConfig& config = model.config();
  absl::Status valid = options.Validate(config.vocab_size);
  if (!valid.ok()) return valid;
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
  absl::StatusOr<Rows> continued;  // each row's new tokens; with beams, each prompt's best
  if (!options.beams()) {
    GptSteps steps(model, prompts, options.kv_cache, device);
    continued = train::SampleRows(steps, prompts, config.vocab_size, options, on_token);
  } else {
    Rows beams;  // row b K + k: prompt b's beam k
    for (const std::vector<int64_t>& p : prompts) beams.insert(beams.end(), options.num_beams, p);
    GptSteps steps(model, beams, options.kv_cache, device);
    continued = train::BeamSearch(steps, prompts, config.vocab_size, options);
  }
  if (!continued.ok()) return continued.status();
  // Row r continues prompt r / n (n: rows per prompt, beam search's
  // num_return_sequences).
  const int64_t n = static_cast<int64_t>(continued->size()) / B;
  Rows rows;
  for (int64_t r = 0; r < B * n; ++r) {
    rows.push_back(prompts[r / n]);
    rows.back().insert(rows.back().end(), (*continued)[r].begin(), (*continued)[r].end());
  }
  return rows;
}

}  // namespace mingpt
