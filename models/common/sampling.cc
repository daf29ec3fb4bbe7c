// Logits -> filtered distribution -> one draw.
#include "models/common/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
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
  return absl::OkStatus();
}

double DrawUniform(uint64_t seed, uint64_t row, uint64_t n) {
  const std::array<uint32_t, 4> w = tensor::Philox4x32(seed, row, n);
  const uint64_t bits = (static_cast<uint64_t>(w[0] >> 5) << 26) | (w[1] >> 6);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

absl::StatusOr<int64_t> SampleFromLogits(absl::Span<const float> logits, const Sampling& sampling,
                                         double u) {
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
  if (sampling.greedy()) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i) {
      if (before(i, best)) best = i;
    }
    return best;
  }
  const int64_t keep = sampling.top_k > 0 ? std::min(sampling.top_k, V) : V;
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
