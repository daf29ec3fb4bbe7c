// Sampling from minGPT: logits of the last position -> filtered distribution
// -> one draw per row, repeated max_new_tokens times.
#include "models/mingpt/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "tensor/random.h"

namespace mingpt {
namespace {

// Uniform [0, 1) with 53 random bits from Philox(seed) at counter (row, n).
double DrawUniform(uint64_t seed, uint64_t row, uint64_t n) {
  const std::array<uint32_t, 4> w = tensor::Philox4x32(seed, row, n);
  const uint64_t bits = (static_cast<uint64_t>(w[0] >> 5) << 26) | (w[1] >> 6);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

}  // namespace

absl::Status SamplingOptions::Validate() const {
  if (max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 0, got ", max_new_tokens));
  }
  if (!(temperature >= 0.0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be finite and >= 0 (0: greedy), got ", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0: all), got ", top_k));
  }
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SampleFromLogits(absl::Span<const float> logits,
                                         const SamplingOptions& options, double u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  for (int64_t i = 0; i < V; ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::InvalidArgumentError(absl::StrCat("logit of token ", i, " is ", logits[i],
                                                     ": the model gives no distribution"));
    }
  }
  if (V == 0) return absl::InvalidArgumentError("no logits to sample from");
  // Token ids by falling logit, ties by id: greedy takes the first.
  auto before = [&logits](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (options.temperature == 0.0) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i) {
      if (before(i, best)) best = i;
    }
    return best;
  }
  const int64_t keep = options.top_k > 0 ? std::min(options.top_k, V) : V;
  std::vector<int64_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
  ids.resize(keep);
  // Softmax of logits / temperature over the kept ids (in double).
  std::vector<double> p(keep);
  const double top = logits[ids[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[ids[i]] - top) / options.temperature);
    sum += p[i];
  }
  // Nucleus: the shortest prefix whose probability reaches top_p.
  int64_t n = keep;
  if (options.top_p < 1.0) {
    double cumulative = 0.0;
    for (n = 0; n < keep;) {
      cumulative += p[n++] / sum;
      if (cumulative >= options.top_p) break;
    }
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += p[i];
  const double target = u * total;
  double cumulative = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    cumulative += p[i];
    if (target < cumulative) return ids[i];
  }
  return ids[n - 1];  // u * total rounded up to the sum
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
    const std::vector<float> logits = last.ToVector<float>();
    for (int64_t r = 0; r < B; ++r) {
      absl::Span<const float> row_logits(logits.data() + r * config.vocab_size,
                                         static_cast<size_t>(config.vocab_size));
      absl::StatusOr<int64_t> token =
          SampleFromLogits(row_logits, options, DrawUniform(options.seed, r, n));
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
