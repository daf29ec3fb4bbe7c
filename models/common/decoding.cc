// Decoding loops: rows drawn one token at a time, and beam search.
#include "models/common/decoding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace train {
namespace {

// log softmax of one row of logits, in double.
std::vector<double> LogSoftmax(absl::Span<const float> logits) {
  double top = -std::numeric_limits<double>::infinity();
  for (float x : logits) top = std::max<double>(top, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - top);
  const double log_z = top + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_z;
  return out;
}

// One example's finished hypotheses: the num_beams best by score.
class Hypotheses {
 public:
  Hypotheses(int64_t num_beams, double length_penalty, bool early_stopping)
      : num_beams_(num_beams), length_penalty_(length_penalty), early_stopping_(early_stopping) {}

  // new_tokens (eos included when it ended there) with summed log-probability `sum`.
  void Add(std::vector<int64_t> new_tokens, double sum) {
    if (sum == -std::numeric_limits<double>::infinity()) return;  // a dead beam
    const double score = sum / std::pow(static_cast<double>(new_tokens.size()), length_penalty_);
    if (static_cast<int64_t>(kept_.size()) == num_beams_ && score <= kept_.back().first) return;
    kept_.emplace_back(score, std::move(new_tokens));
    std::stable_sort(kept_.begin(), kept_.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    if (static_cast<int64_t>(kept_.size()) > num_beams_) kept_.pop_back();
  }

  bool empty() const { return kept_.empty(); }

  // Whether no beam can do better: num_beams finished and, unless
  // early_stopping, the worst of them at least the best running sum
  // `best_sum` scored at `length` new tokens.
  bool Done(double best_sum, int64_t length) const {
    if (static_cast<int64_t>(kept_.size()) < num_beams_) return false;
    if (early_stopping_) return true;
    return kept_.back().first >= best_sum / std::pow(static_cast<double>(length), length_penalty_);
  }

  int64_t size() const { return static_cast<int64_t>(kept_.size()); }
  // The j-th best (j < size()).
  const std::vector<int64_t>& at(int64_t j) const { return kept_[j].second; }

 private:
  const int64_t num_beams_;
  const double length_penalty_;
  const bool early_stopping_;
  std::vector<std::pair<double, std::vector<int64_t>>> kept_;  // best first
};

// The order continuations (summed score, index) are ranked in: the higher
// score first, then the lower index.
bool Better(const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& c) {
  return a.first > c.first || (a.first == c.first && a.second < c.second);
}

// Draws up to `count` of `candidates` (summed score, index; in index order)
// without replacement, each with probability softmax(score) among those not
// drawn yet (torch.multinomial's draws; the j-th takes the candidate where
// the running sum of the weights, in index order, passes u times their
// total, u = train::DrawUniform(seed, example, first + j)); when fewer than
// `count` have a weight (exp of score - top, in double) above 0, the best
// left by score. -inf scores are never drawn. Returns them best score first
// (ties by index), as Hugging Face's beam sampling sorts its draws. No sort
// of all candidates: O(count x candidates), for K V of them.
std::vector<std::pair<double, int64_t>> DrawCandidates(
    std::vector<std::pair<double, int64_t>> candidates, int64_t count, uint64_t seed,
    int64_t example, uint64_t first) {
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [](const auto& c) { return !std::isfinite(c.first); }),
                   candidates.end());
  const int64_t n = static_cast<int64_t>(candidates.size());
  std::vector<std::pair<double, int64_t>> drawn;
  if (n == 0) return drawn;
  const double top = std::max_element(candidates.begin(), candidates.end(), [](auto& a, auto& c) {
                       return a.first < c.first;
                     })->first;
  std::vector<double> weight(n);
  for (int64_t i = 0; i < n; ++i) weight[i] = std::exp(candidates[i].first - top);
  std::vector<bool> taken(n, false);
  while (static_cast<int64_t>(drawn.size()) < std::min(count, n)) {
    double total = 0.0;
    for (int64_t i = 0; i < n; ++i) total += taken[i] ? 0.0 : weight[i];
    int64_t pick = -1;
    if (total > 0.0) {
      const double target =
          train::DrawUniform(seed, static_cast<uint64_t>(example), first + drawn.size()) * total;
      double cumulative = 0.0;
      for (int64_t i = 0; i < n && pick < 0; ++i) {
        if (taken[i] || weight[i] == 0.0) continue;
        cumulative += weight[i];
        if (target < cumulative) pick = i;
      }
      for (int64_t i = n - 1; pick < 0; --i) {  // u * total rounded up to the sum
        if (!taken[i] && weight[i] > 0.0) pick = i;
      }
    } else {  // none left with a weight: the best left
      for (int64_t i = 0; i < n; ++i) {
        if (!taken[i] && (pick < 0 || Better(candidates[i], candidates[pick]))) pick = i;
      }
    }
    taken[pick] = true;
    drawn.push_back(candidates[pick]);
  }
  std::sort(drawn.begin(), drawn.end(), Better);
  return drawn;
}

// eos_id's score -inf while a row has fewer than min_new_tokens new tokens
// (n of them now).
template <typename T>
void SuppressEarlyEos(absl::Span<T> scores, int64_t n, const Decoding& options) {
  if (options.eos_id >= 0 && n < options.min_new_tokens) {
    scores[options.eos_id] = -std::numeric_limits<T>::infinity();
  }
}

}  // namespace

absl::Status Decoding::Validate(int64_t vocab_size) const {
  if (max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens=", max_new_tokens, " must be >= 0"));
  }
  if (eos_id < -1 || eos_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eos_id=", eos_id, " is not an id of the vocabulary of ", vocab_size, " (nor -1)"));
  }
  if (min_new_tokens < 0 || min_new_tokens > max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_new_tokens=", min_new_tokens, " must be in [0, max_new_tokens=", max_new_tokens, "]"));
  }
  if (num_beams < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_beams=", num_beams, " must be >= 1"));
  }
  if (num_return_sequences < 1 || num_return_sequences > num_beams) {
    return absl::InvalidArgumentError(absl::StrCat("num_return_sequences=", num_return_sequences,
                                                   " must be in [1, num_beams=", num_beams,
                                                   "] (the hypotheses beam search keeps)"));
  }
  if (!std::isfinite(length_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("length_penalty=", length_penalty, " must be finite"));
  }
  return Sampling::Validate();
}

std::string Decoding::Describe() const {
  std::string out = greedy() ? "greedy" : "sampled";
  if (beams()) out = absl::StrCat(num_beams, " beams, ", out);
  if (num_return_sequences > 1) absl::StrAppend(&out, ", ", num_return_sequences, " returned");
  if (min_new_tokens > 0) absl::StrAppend(&out, ", min_new_tokens ", min_new_tokens);
  if (repetition_penalty != 1.0) absl::StrAppend(&out, ", repetition_penalty ", repetition_penalty);
  if (no_repeat_ngram_size > 0)
    absl::StrAppend(&out, ", no_repeat_ngram_size ", no_repeat_ngram_size);
  return out;
}

absl::StatusOr<TokenRows> SampleRows(
    NextTokens& model, const TokenRows& prefixes, int64_t V, const Decoding& options,
    const std::function<void(int64_t n, absl::Span<const int64_t> tokens)>& on_token) {
  const int64_t R = static_cast<int64_t>(prefixes.size());
  // Every row so far (a row that ended repeats its eos_id, which no later
  // output reads).
  TokenRows rows = prefixes;
  TokenRows out(R);
  std::vector<bool> done(R, false);
  std::vector<int64_t> drawn(R);
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    std::vector<float> last = model.Logits(rows);  // (R, V)
    bool all_done = true;
    for (int64_t r = 0; r < R; ++r) {
      if (done[r]) {
        rows[r].push_back(options.eos_id);
        drawn[r] = -1;
        continue;
      }
      const absl::Span<float> logits(last.data() + r * V, V);
      // Repeats of the row's tokens (repetition_penalty, no_repeat_ngram_size).
      if (options.controls_repetition()) ApplyRepetitionControls(logits, rows[r], options);
      SuppressEarlyEos(logits, n, options);
      absl::StatusOr<int64_t> token =
          SampleFromLogits(logits, options, DrawUniform(options.seed, r, n));
      if (!token.ok()) {
        return absl::InternalError(
            absl::StrCat("row ", r, ", new token ", n, ": ", token.status().message()));
      }
      rows[r].push_back(*token);
      out[r].push_back(*token);
      drawn[r] = *token;
      done[r] = *token == options.eos_id;
      all_done = all_done && done[r];
    }
    if (on_token) on_token(n, drawn);
    if (all_done) break;
  }
  return out;
}

// As Hugging Face's beam search (BeamSearchScorer): K = num_beams beams per
// example; each step ranks every beam's continuations by summed
// log-probability and takes the best 2K, where an eos among the first K
// finishes a hypothesis and the others become the next K beams. Sampled
// (temperature > 0, Hugging Face's do_sample with num_beams), each beam's
// log-probabilities are warped (WarpScores) before they add to its sum, and
// the 2K are drawn (DrawCandidates) from the softmax of every continuation's
// sum; a beam left without a continuation (top_k, top_p and the exclusions
// can leave fewer than K) is dead: sum -inf, never continued.
absl::StatusOr<TokenRows> BeamSearch(NextTokens& model, const TokenRows& prefixes, int64_t V,
                                     const Decoding& options) {
  const int64_t B = static_cast<int64_t>(prefixes.size());
  const int64_t K = options.num_beams;
  const int64_t R = B * K;  // row b K + k: example b's beam k
  std::vector<Hypotheses> finished(B,
                                   Hypotheses(K, options.length_penalty, options.early_stopping));
  std::vector<bool> done(B, false);
  // Beam 0 alone at first (the others start at -1e9: their copies of it lose).
  std::vector<double> sums(R, -1e9);
  TokenRows rows(R);
  for (int64_t b = 0; b < B; ++b) {
    sums[b * K] = 0.0;
    for (int64_t k = 0; k < K; ++k) rows[b * K + k] = prefixes[b];
  }
  const int64_t filler = std::max<int64_t>(options.eos_id, 0);  // fed to rows no output reads
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    const std::vector<float> last = model.Logits(rows);  // (R, V)
    std::vector<int64_t> source(R);                      // the row each next beam continues
    std::vector<int64_t> token(R);
    std::vector<double> next_sums(R);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) {  // its rows run on with a filler token, unread
        for (int64_t k = 0; k < K; ++k) {
          source[b * K + k] = b * K + k;
          token[b * K + k] = filler;
          next_sums[b * K + k] = 0.0;
        }
        continue;
      }
      // Every continuation (beam k, token v) of this example: (sum, k V + v).
      std::vector<std::pair<double, int64_t>> candidates(K * V);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = b * K + k;
        std::vector<double> log_p = LogSoftmax(absl::MakeConstSpan(last.data() + row * V, V));
        // On the log-probabilities, as Hugging Face's beam search applies them.
        if (options.controls_repetition()) {
          ApplyRepetitionControls(absl::MakeSpan(log_p), rows[row], options);
        }
        SuppressEarlyEos(absl::MakeSpan(log_p), n, options);
        absl::Status warped = WarpScores(absl::MakeSpan(log_p), options);
        if (!warped.ok()) {
          return absl::InternalError(
              absl::StrCat("example ", b, ", beam ", k, ", new token ", n, ": ", warped.message()));
        }
        for (int64_t v = 0; v < V; ++v) candidates[k * V + v] = {sums[row] + log_p[v], k * V + v};
      }
      int64_t top = std::min<int64_t>(2 * K, K * V);
      if (options.greedy()) {
        std::partial_sort(candidates.begin(), candidates.begin() + top, candidates.end(), Better);
      } else {
        candidates = DrawCandidates(std::move(candidates), 2 * K, options.seed, b,
                                    static_cast<uint64_t>(n * 2 * K));
        top = static_cast<int64_t>(candidates.size());  // 0: every beam dead or excluded
      }
      int64_t kept = 0;
      for (int64_t rank = 0; rank < top && kept < K; ++rank) {
        const auto [sum, index] = candidates[rank];
        const int64_t row = b * K + index / V, v = index % V;
        if (v == options.eos_id) {
          if (rank >= K) continue;  // not among the K best: dropped
          std::vector<int64_t> hypothesis(rows[row].begin() + prefixes[b].size(), rows[row].end());
          hypothesis.push_back(v);
          finished[b].Add(std::move(hypothesis), sum);
          continue;
        }
        source[b * K + kept] = row;
        token[b * K + kept] = v;
        next_sums[b * K + kept] = sum;
        ++kept;
      }
      if (kept < K && options.greedy()) {  // only with a vocabulary of one id
        return absl::InvalidArgumentError(absl::StrCat(
            "num_beams=", K, " needs a vocabulary of 2 ids at least; this one has ", V));
      }
      for (; kept < K; ++kept) {  // dead beams
        source[b * K + kept] = b * K;
        token[b * K + kept] = filler;
        next_sums[b * K + kept] = -std::numeric_limits<double>::infinity();
      }
      if (top > 0) {
        done[b] = finished[b].Done(candidates[0].first, n + 1);
      } else if (finished[b].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("example ", b, ", new token ", n,
                         ": every continuation is excluded (no_repeat_ngram_size leaves none)"));
      } else {
        done[b] = true;  // no beam can go on
      }
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    TokenRows next(R);
    for (int64_t r = 0; r < R; ++r) {
      next[r] = rows[source[r]];
      next[r].push_back(token[r]);
    }
    rows = std::move(next);
    sums = std::move(next_sums);
    if (n + 1 < options.max_new_tokens) model.SelectRows(source);  // for the next step's logits
  }
  const int64_t n_out = options.num_return_sequences;
  TokenRows out(B * n_out);  // row b n_out + j: example b's j-th best
  for (int64_t b = 0; b < B; ++b) {
    const size_t prefix = prefixes[b].size();
    if (!done[b]) {  // the running beams compete as they are
      for (int64_t k = 0; k < K; ++k) {
        const std::vector<int64_t>& s = rows[b * K + k];
        if (s.size() > prefix)
          finished[b].Add(std::vector<int64_t>(s.begin() + prefix, s.end()), sums[b * K + k]);
      }
    }
    if (options.max_new_tokens == 0) continue;
    if (finished[b].empty()) {  // every beam excluded before it finished
      return absl::InvalidArgumentError(absl::StrCat(
          "example ", b, ": every continuation is excluded (no_repeat_ngram_size leaves none)"));
    }
    if (finished[b].size() < n_out) {  // dead beams: the exclusions left too few
      return absl::InvalidArgumentError(absl::StrCat(
          "example ", b, ": ", finished[b].size(), " hypotheses for num_return_sequences=", n_out,
          " (top_k, top_p or no_repeat_ngram_size excluded the others)"));
    }
    for (int64_t j = 0; j < n_out; ++j) out[b * n_out + j] = finished[b].at(j);
  }
  return out;
}

}  // namespace train
