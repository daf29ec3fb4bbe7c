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

namespace {

// Checks one row of scores: InvalidArgument when one is nan or +inf (or the
// row is empty); else how many are finite (-inf: excluded).
template <typename T>
absl::StatusOr<int64_t> CountAllowed(absl::Span<const T> scores) {
  if (scores.empty()) return absl::InvalidArgumentError("no logits to sample from");
  int64_t allowed = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i]) || scores[i] == std::numeric_limits<T>::infinity()) {
      return absl::InvalidArgumentError(absl::StrCat("logit of token ", i, " is ", scores[i],
                                                     ": the model gives no distribution"));
    }
    allowed += std::isfinite(scores[i]) ? 1 : 0;
  }
  return allowed;
}

// The tokens a draw may return (`allowed` > 0 of the scores finite, not
// greedy): their ids by falling score, ties by id, and their weights
// exp((score - top) / temperature), after top_k (the k best and every one
// tied with the k-th: nanoGPT and Hugging Face drop only scores below it)
// and then top_p.
template <typename T>
void KeepTokens(absl::Span<const T> scores, const Sampling& sampling, int64_t allowed,
                std::vector<int64_t>& ids, std::vector<double>& p) {
  const int64_t V = static_cast<int64_t>(scores.size());
  auto before = [&scores](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  // The excluded tokens sort last and are never kept.
  int64_t keep = std::min(sampling.top_k > 0 ? sampling.top_k : V, allowed);
  ids.resize(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
  if (keep < allowed) {
    // The ones tied with the k-th follow it, by id (their ids are above the
    // tied ones partial_sort put first).
    const T kth = scores[ids[keep - 1]];
    const auto tied_end = std::partition(ids.begin() + keep, ids.end(),
                                         [&](int64_t id) { return scores[id] == kth; });
    std::sort(ids.begin() + keep, tied_end);
    keep = tied_end - ids.begin();
  }
  ids.resize(keep);
  // Softmax of scores / temperature over the kept ids (in double).
  p.resize(keep);
  const double top = scores[ids[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    p[i] = std::exp((scores[ids[i]] - top) / sampling.temperature);
    sum += p[i];
  }
  // Nucleus: the shortest prefix whose probability reaches top_p.
  if (sampling.top_p < 1.0) {
    double cumulative = 0.0;
    int64_t n = 0;
    while (n < keep) {
      cumulative += p[n++] / sum;
      if (cumulative >= sampling.top_p) break;
    }
    ids.resize(n);
    p.resize(n);
  }
}

}  // namespace

absl::StatusOr<int64_t> SampleFromLogits(absl::Span<const float> logits, const Sampling& sampling,
                                         double u) {
  absl::StatusOr<int64_t> allowed = CountAllowed(logits);
  if (!allowed.ok()) return allowed.status();
  if (*allowed == 0) {
    return absl::InvalidArgumentError(
        "every token is excluded (no_repeat_ngram_size leaves none, or every logit is -inf)");
  }
  if (sampling.greedy()) {  // the first by falling logit, ties by id
    int64_t best = 0;
    for (int64_t i = 1; i < static_cast<int64_t>(logits.size()); ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  std::vector<int64_t> ids;
  std::vector<double> p;
  KeepTokens(logits, sampling, *allowed, ids, p);
  const int64_t n = static_cast<int64_t>(ids.size());
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

absl::Status WarpScores(absl::Span<double> scores, const Sampling& sampling) {
  absl::StatusOr<int64_t> allowed = CountAllowed(absl::Span<const double>(scores));
  if (!allowed.ok()) return allowed.status();
  if (sampling.greedy() || *allowed == 0) return absl::OkStatus();
  std::vector<int64_t> ids;
  std::vector<double> p;
  KeepTokens(absl::Span<const double>(scores), sampling, *allowed, ids, p);
  std::vector<double> kept(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) kept[i] = scores[ids[i]] / sampling.temperature;
  std::fill(scores.begin(), scores.end(), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < ids.size(); ++i) scores[ids[i]] = kept[i];
  return absl::OkStatus();
}

}  // namespace train
