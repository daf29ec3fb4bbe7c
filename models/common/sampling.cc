// Logits -> filtered distribution -> one draw.
#include "models/common/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/random.h"

namespace train {

absl::Status Sampling::Validate() const {
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
  if (!(repetition_penalty > 0.0) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetition_penalty must be finite and > 0 (1: off), got ", repetition_penalty));
  }
  if (no_repeat_ngram_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no_repeat_ngram_size must be >= 0 (0: off), got ", no_repeat_ngram_size));
  }
  return absl::OkStatus();
}

template <typename T>
void ApplyRepetitionControls(absl::Span<T> scores, absl::Span<const int64_t> sequence,
                             const Sampling& sampling) {
  const int64_t V = static_cast<int64_t>(scores.size());
  const auto in_vocab = [V](int64_t id) { return id >= 0 && id < V; };
  if (sampling.repetition_penalty != 1.0) {
    std::vector<bool> seen(V, false);
    for (int64_t id : sequence) {
      if (!in_vocab(id) || seen[id]) continue;
      seen[id] = true;
      const double x = scores[id];
      scores[id] =
          static_cast<T>(x < 0 ? x * sampling.repetition_penalty : x / sampling.repetition_penalty);
    }
  }
  const int64_t n = sampling.no_repeat_ngram_size;
  const int64_t L = static_cast<int64_t>(sequence.size());
  if (n == 0 || L < n - 1) return;
  // The sequence's last n - 1 tokens, and every earlier n-gram that starts
  // with them: its last token would repeat it.
  const absl::Span<const int64_t> tail = sequence.subspan(L - (n - 1));
  for (int64_t i = 0; i + n <= L; ++i) {
    if (std::equal(tail.begin(), tail.end(), sequence.begin() + i) &&
        in_vocab(sequence[i + n - 1])) {
      scores[sequence[i + n - 1]] = -std::numeric_limits<T>::infinity();
    }
  }
}

template void ApplyRepetitionControls<float>(absl::Span<float>, absl::Span<const int64_t>,
                                             const Sampling&);
template void ApplyRepetitionControls<double>(absl::Span<double>, absl::Span<const int64_t>,
                                              const Sampling&);

double DrawUniform(uint64_t seed, uint64_t row, uint64_t n) {
  const std::array<uint32_t, 4> w = tensor::Philox4x32(seed, row, n);
  const uint64_t bits = (static_cast<uint64_t>(w[0] >> 5) << 26) | (w[1] >> 6);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

absl::StatusOr<int64_t> SampleFromLogits(absl::Span<const float> logits, const Sampling& sampling,
                                         double u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  int64_t allowed = 0;  // tokens that may be drawn: finite logits (-inf: excluded)
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(absl::StrCat("logit of token ", i, " is ", logits[i],
                                                     ": the model gives no distribution"));
    }
    allowed += std::isfinite(logits[i]) ? 1 : 0;
  }
  if (V == 0) return absl::InvalidArgumentError("no logits to sample from");
  if (allowed == 0) {
    return absl::InvalidArgumentError(
        "every token is excluded (no_repeat_ngram_size leaves none, or every logit is -inf)");
  }
  // Token ids by falling logit, ties by id: greedy takes the first.
  auto before = [&logits](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (sampling.greedy()) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i) {
      if (before(i, best)) best = i;
    }
    return best;
  }
  // The excluded tokens sort last and are never kept.
  const int64_t keep = std::min(sampling.top_k > 0 ? sampling.top_k : V, allowed);
  std::vector<int64_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
  ids.resize(keep);
  // Softmax of logits / temperature over the kept ids (in double).
  std::vector<double> p(keep);
  const double top = logits[ids[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[ids[i]] - top) / sampling.temperature);
    sum += p[i];
  }
  // Nucleus: the shortest prefix whose probability reaches top_p.
  int64_t n = keep;
  if (sampling.top_p < 1.0) {
    double cumulative = 0.0;
    for (n = 0; n < keep;) {
      cumulative += p[n++] / sum;
      if (cumulative >= sampling.top_p) break;
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

}  // namespace train
