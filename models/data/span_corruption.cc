// T5 span corruption: noise masks, the corruption of one example, and the
// batch loader.
#include "models/data/span_corruption.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "models/data/row_random.h"

namespace data {
namespace {

// A uniformly random composition of n into k positive parts (k <= n): k - 1
// distinct cut points out of {1, ..., n - 1}. Draws words from *counter on.
std::vector<int64_t> RandomComposition(int64_t n, int64_t k, RowRandom* rng, uint64_t* counter) {
  CHECK(k >= 1 && k <= n) << "composition of " << n << " into " << k << " parts";
  std::vector<int64_t> cuts(n - 1);
  for (int64_t i = 0; i < n - 1; ++i) cuts[i] = i + 1;
  for (int64_t i = 0; i < k - 1; ++i) {  // partial Fisher-Yates
    const int64_t j = i + rng->UniformInt((*counter)++, n - 1 - i);
    std::swap(cuts[i], cuts[j]);
  }
  cuts.resize(k - 1);
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> parts(k);
  int64_t prev = 0;
  for (int64_t i = 0; i < k - 1; ++i) {
    parts[i] = cuts[i] - prev;
    prev = cuts[i];
  }
  parts[k - 1] = n - prev;
  return parts;
}

// The automatic raw length (raw_length 0) is searched up to this many raw
// tokens per encoder position (noise densities up to about 0.999 fit) and never
// past kMaxSearchedLength (lengths stay exact in a double).
constexpr int64_t kMaxRawPerEncoderPosition = 1000;
constexpr int64_t kMaxSearchedLength = int64_t{1} << 52;

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("[span corruption] ", what));
}

}  // namespace

SpanCounts ComputeSpanCounts(int64_t length, double noise_density, double mean_noise_span_length) {
  CHECK_GE(length, 2) << "span corruption needs at least 2 tokens";
  SpanCounts c;
  c.length = length;
  // Round half to even, as T5's tf.math.round.
  c.num_noise = static_cast<int64_t>(std::nearbyint(static_cast<double>(length) * noise_density));
  c.num_noise = std::min(std::max<int64_t>(c.num_noise, 1), length - 1);
  c.num_spans = static_cast<int64_t>(
      std::nearbyint(static_cast<double>(c.num_noise) / mean_noise_span_length));
  c.num_spans = std::min({std::max<int64_t>(c.num_spans, 1), c.num_noise, length - c.num_noise});
  return c;
}

std::vector<bool> RandomSpansNoiseMask(const SpanCounts& counts, uint64_t seed, int64_t step,
                                       int64_t row) {
  const int64_t K = counts.num_spans, keep_total = counts.length - counts.num_noise;
  CHECK(K >= 1 && K <= counts.num_noise && K <= keep_total) << "bad span counts";
  RowRandom rng(seed, RandomStream::kNoiseMask, step, row);
  uint64_t counter = 0;
  // K noise spans of >= 1 token; K + 1 non-noise runs around them, the inner
  // K - 1 of >= 1 token and the two outer ones possibly empty (a composition
  // of keep_total + 2 into K + 1 positive parts, less one at each end).
  const std::vector<int64_t> noise = RandomComposition(counts.num_noise, K, &rng, &counter);
  std::vector<int64_t> keep = RandomComposition(keep_total + 2, K + 1, &rng, &counter);
  --keep.front();
  --keep.back();
  std::vector<bool> mask;
  mask.reserve(counts.length);
  for (int64_t s = 0; s < K; ++s) {
    mask.insert(mask.end(), keep[s], false);
    mask.insert(mask.end(), noise[s], true);
  }
  mask.insert(mask.end(), keep[K], false);
  CHECK_EQ(static_cast<int64_t>(mask.size()), counts.length);
  return mask;
}

absl::StatusOr<SpanCorruptor> SpanCorruptor::Create(int64_t source_vocab_size,
                                                    const SpanCorruptionOptions& o) {
  if (source_vocab_size < 1) {
    return Invalid(absl::StrCat("source vocab_size must be >= 1, got ", source_vocab_size));
  }
  if (!(o.noise_density > 0.0 && o.noise_density < 1.0)) {
    return Invalid(absl::StrCat("noise_density must be in (0, 1), got ", o.noise_density));
  }
  if (!(o.mean_noise_span_length >= 1.0)) {
    return Invalid(
        absl::StrCat("mean_noise_span_length must be >= 1, got ", o.mean_noise_span_length));
  }
  if (o.num_sentinels < 1) {
    return Invalid(absl::StrCat("num_sentinels must be >= 1, got ", o.num_sentinels));
  }
  if (source_vocab_size + o.num_sentinels > (int64_t{1} << 31)) {
    return Invalid("vocabulary plus sentinels exceeds 2^31");
  }
  const int64_t vocab = source_vocab_size + o.num_sentinels;
  if (o.pad_id < 0 || o.pad_id >= vocab) {
    return Invalid(absl::StrCat("pad_id ", o.pad_id, " is not in [0, ", vocab, ")"));
  }
  if (o.decoder_start_id < 0 || o.decoder_start_id >= vocab) {
    return Invalid(
        absl::StrCat("decoder_start_id ", o.decoder_start_id, " is not in [0, ", vocab, ")"));
  }
  if (o.eos_id < -1 || o.eos_id >= source_vocab_size) {
    return Invalid(absl::StrCat("eos_id ", o.eos_id,
                                " must be -1 (none) or an id of the source "
                                "vocabulary [0, ",
                                source_vocab_size, ")"));
  }
  if (o.ignore_index >= 0 && o.ignore_index < vocab) {
    return Invalid(absl::StrCat("ignore_index ", o.ignore_index,
                                " is a token id; use a value outside [0, ", vocab, ")"));
  }
  const int64_t eos = o.eos_id >= 0 ? 1 : 0;
  auto encoder_tokens = [&](int64_t length) {
    const SpanCounts c = ComputeSpanCounts(length, o.noise_density, o.mean_noise_span_length);
    return length - c.num_noise + c.num_spans + eos;
  };
  if (o.encoder_length < encoder_tokens(2)) {
    return Invalid(absl::StrCat("encoder_length ", o.encoder_length,
                                " is too short: it needs at "
                                "least ",
                                encoder_tokens(2), " positions"));
  }
  int64_t length = o.raw_length;
  if (length == 0) {
    // As T5's compute_input_and_target_lengths: the longest length whose input
    // still fits. encoder_tokens is non-decreasing in the length (noise tokens
    // and spans grow by at most one per token, the kept tokens never shrink), so
    // a binary search finds what T5's one-token-at-a-time loop finds. With a
    // noise_density near 1 the kept tokens grow ever more slowly (and without a
    // bound on the search, start-up spins): past kMaxRawPerEncoderPosition raw
    // tokens per encoder position the density is refused.
    const int64_t cap = o.encoder_length <= kMaxSearchedLength / kMaxRawPerEncoderPosition
                            ? o.encoder_length * kMaxRawPerEncoderPosition
                            : kMaxSearchedLength;
    if (encoder_tokens(cap + 1) <= o.encoder_length) {
      return Invalid(absl::StrCat(
          "noise_density ", absl::StrFormat("%.12g", o.noise_density),
          " (mean_noise_span_length ", o.mean_noise_span_length,
          ") keeps too few tokens: filling encoder_length ", o.encoder_length,
          " would take more than ", cap, " raw tokens per example (", kMaxRawPerEncoderPosition,
          " per encoder position); use a lower noise_density or set raw_length"));
    }
    int64_t fits = 2, too_long = cap + 1;  // encoder_tokens(fits) <= S < encoder_tokens(too_long)
    while (too_long - fits > 1) {
      const int64_t mid = fits + (too_long - fits) / 2;
      if (encoder_tokens(mid) <= o.encoder_length) {
        fits = mid;
      } else {
        too_long = mid;
      }
    }
    length = fits;
  } else if (length < 2) {
    return Invalid(absl::StrCat("raw_length must be 0 (automatic) or >= 2, got ", length));
  } else if (encoder_tokens(length) > o.encoder_length) {
    return Invalid(absl::StrCat("raw_length ", length, " makes ", encoder_tokens(length),
                                " encoder tokens, more than encoder_length ", o.encoder_length));
  }
  const SpanCounts counts = ComputeSpanCounts(length, o.noise_density, o.mean_noise_span_length);
  if (counts.num_spans + 1 > o.num_sentinels) {
    return Invalid(absl::StrCat("encoder_length ", o.encoder_length, " gives ", counts.num_spans,
                                " noise spans, which need ", counts.num_spans + 1,
                                " sentinels; num_sentinels is ", o.num_sentinels));
  }
  const int64_t target_tokens = counts.num_noise + counts.num_spans + 1 + eos;
  int64_t decoder_length = o.decoder_length;
  if (decoder_length == 0) decoder_length = target_tokens;
  if (decoder_length < target_tokens) {
    return Invalid(absl::StrCat("decoder_length ", o.decoder_length,
                                " is shorter than the targets: encoder_length ", o.encoder_length,
                                " makes ", target_tokens, " target tokens"));
  }
  return SpanCorruptor(source_vocab_size, o, counts, decoder_length);
}

int64_t SpanCorruptor::encoder_tokens() const {
  return counts_.length - counts_.num_noise + counts_.num_spans + (options_.eos_id >= 0 ? 1 : 0);
}

int64_t SpanCorruptor::target_tokens() const {
  return counts_.num_noise + counts_.num_spans + 1 + (options_.eos_id >= 0 ? 1 : 0);
}

void SpanCorruptor::Corrupt(absl::Span<const int64_t> tokens, const std::vector<bool>& noise,
                            absl::Span<int64_t> encoder_inputs, absl::Span<int64_t> encoder_mask,
                            absl::Span<int64_t> decoder_inputs,
                            absl::Span<int64_t> decoder_targets) const {
  const int64_t L = counts_.length, S = options_.encoder_length, Td = decoder_length_;
  CHECK_EQ(static_cast<int64_t>(tokens.size()), L);
  CHECK_EQ(static_cast<int64_t>(noise.size()), L);
  CHECK_EQ(static_cast<int64_t>(encoder_inputs.size()), S);
  CHECK_EQ(static_cast<int64_t>(encoder_mask.size()), S);
  CHECK_EQ(static_cast<int64_t>(decoder_inputs.size()), Td);
  CHECK_EQ(static_cast<int64_t>(decoder_targets.size()), Td);
  int64_t e = 0, t = 0, span = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (!noise[i]) {
      CHECK_LT(e, S);
      encoder_inputs[e++] = tokens[i];
      continue;
    }
    if (i == 0 || !noise[i - 1]) {  // a span starts: one sentinel in both
      CHECK_LT(span, counts_.num_spans) << "noise mask has more spans than counts()";
      const int64_t sentinel = SentinelId(span++);
      CHECK_LT(e, S);
      CHECK_LT(t, Td);
      encoder_inputs[e++] = sentinel;
      decoder_targets[t++] = sentinel;
    }
    CHECK_LT(t, Td);
    decoder_targets[t++] = tokens[i];
  }
  CHECK_LT(t, Td);
  decoder_targets[t++] = SentinelId(span);  // the final sentinel
  if (options_.eos_id >= 0) {
    CHECK_LT(e, S);
    CHECK_LT(t, Td);
    encoder_inputs[e++] = options_.eos_id;
    decoder_targets[t++] = options_.eos_id;
  }
  for (int64_t i = 0; i < S; ++i) encoder_mask[i] = i < e ? 1 : 0;
  for (int64_t i = e; i < S; ++i) encoder_inputs[i] = options_.pad_id;
  for (int64_t i = t; i < Td; ++i) decoder_targets[i] = options_.ignore_index;
  decoder_inputs[0] = options_.decoder_start_id;
  for (int64_t i = 1; i < Td; ++i) {
    const int64_t prev = decoder_targets[i - 1];
    decoder_inputs[i] = prev == options_.ignore_index ? options_.pad_id : prev;
  }
}

std::string SpanCorruptor::Render(
    absl::Span<const int64_t> ids,
    const std::function<std::string(absl::Span<const int64_t>)>& decode) const {
  std::string out;
  std::vector<int64_t> run;
  auto flush = [&]() {
    if (!run.empty()) out += decode(run);
    run.clear();
  };
  for (int64_t id : ids) {
    if (id == options_.ignore_index) continue;
    if (IsSentinel(id)) {
      flush();
      absl::StrAppend(&out, "<extra_id_", SentinelIndex(id), ">");
    } else if (options_.eos_id >= 0 && id == options_.eos_id) {
      flush();
      out += "</s>";
    } else {
      run.push_back(id);
    }
  }
  flush();
  return out;
}

absl::StatusOr<SpanCorruptionLoader> SpanCorruptionLoader::Create(
    std::shared_ptr<const TokenSource> source, DataParallel layout,
    const SpanCorruptionOptions& options) {
  if (source == nullptr) return Invalid("no token source");
  if (absl::Status s = layout.Validate("span corruption"); !s.ok()) return s;
  absl::StatusOr<SpanCorruptor> corruptor = SpanCorruptor::Create(source->vocab_size(), options);
  if (!corruptor.ok()) return corruptor.status();
  if (source->max_sequence_length() < corruptor->raw_length()) {
    return Invalid(absl::StrCat(source->Describe(), " is too small: encoder_length ",
                                options.encoder_length, " takes ", corruptor->raw_length(),
                                " tokens per example but it has ", source->max_sequence_length()));
  }
  return SpanCorruptionLoader(std::move(source), layout, *std::move(corruptor));
}

Seq2SeqBatch SpanCorruptionLoader::Batch(int64_t step) const {
  CHECK_GE(step, 0) << "[span corruption] negative step";
  const int64_t B = layout_.local_rows();  // K micro-batches of batch_size
  const int64_t S = corruptor_.encoder_length(), Td = corruptor_.decoder_length();
  Seq2SeqBatch batch;
  batch.step = step;
  batch.encoder_inputs = tensor::Tensor::Empty({B, S}, tensor::Dtype::kI64);
  batch.encoder_mask = tensor::Tensor::Empty({B, S}, tensor::Dtype::kI64);
  batch.decoder_inputs = tensor::Tensor::Empty({B, Td}, tensor::Dtype::kI64);
  batch.decoder_targets = tensor::Tensor::Empty({B, Td}, tensor::Dtype::kI64);
  std::vector<int64_t> tokens(corruptor_.raw_length());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t row = layout_.GlobalRow(b);
    source_->SampleSequence(step, row, absl::MakeSpan(tokens));
    const std::vector<bool> noise =
        RandomSpansNoiseMask(corruptor_.counts(), corruptor_.options().seed, step, row);
    corruptor_.Corrupt(tokens, noise,
                       absl::MakeSpan(batch.encoder_inputs.data<int64_t>() + b * S, S),
                       absl::MakeSpan(batch.encoder_mask.data<int64_t>() + b * S, S),
                       absl::MakeSpan(batch.decoder_inputs.data<int64_t>() + b * Td, Td),
                       absl::MakeSpan(batch.decoder_targets.data<int64_t>() + b * Td, Td));
  }
  return batch;
}

Seq2SeqBatch SpanCorruptionLoader::Next() { return Batch(step_++); }

absl::Status SpanCorruptionLoader::Restore(const LoaderState& state) {
  if (absl::Status s = CheckRestore(state, Config(), "span corruption"); !s.ok()) return s;
  step_ = state.step;
  return absl::OkStatus();
}

absl::StatusOr<SpanCorruptionIds> SpanCorruptionIdsOf(absl::string_view state) {
  const size_t open = state.find(";span_corruption(");
  if (open == absl::string_view::npos || !absl::EndsWith(state, ")")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a span corruption loader's state: \"", state, "\""));
  }
  // The ids come after the source's fingerprint: read the last of each.
  auto id = [&](absl::string_view key, int64_t* out) {
    const size_t at = state.rfind(absl::StrCat(",", key, "="));
    if (at == absl::string_view::npos || at < open) return false;
    absl::string_view rest = state.substr(at + key.size() + 2);
    return absl::SimpleAtoi(rest.substr(0, rest.find_first_of(",)")), out);
  };
  SpanCorruptionIds ids;
  if (!id("eos", &ids.eos_id) || !id("pad", &ids.pad_id) ||
      !id("start", &ids.decoder_start_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a span corruption loader's state without its ids: \"", state, "\""));
  }
  return ids;
}

absl::StatusOr<SpanCorruptionVocab> SpanCorruptionVocabOf(absl::string_view state) {
  const size_t open = state.find(";span_corruption(");
  if (open == absl::string_view::npos || !absl::EndsWith(state, ")")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a span corruption loader's state: \"", state, "\""));
  }
  // The source's fingerprint comes first, up to the loader's own fields:
  // "byte_text(...)", or "token_file(...,vocab=V,...)" (a slice's holds
  // "range=[b, e)") / "random_tokens(vocab=V,...)".
  const absl::string_view source = state.substr(open + 17);
  const absl::string_view fingerprint = source.substr(0, source.find(",global_batch="));
  SpanCorruptionVocab vocab;
  bool known = false;
  if (absl::StartsWith(fingerprint, "byte_text(")) {
    vocab.source_vocab = 256;  // ByteTextSource's (kByteVocabSize)
    known = true;
  } else if (size_t at = fingerprint.find("vocab="); at != absl::string_view::npos) {
    absl::string_view rest = fingerprint.substr(at + 6);
    known = absl::SimpleAtoi(rest.substr(0, rest.find(',')), &vocab.source_vocab) &&
            vocab.source_vocab > 0;
  }
  const size_t sentinels = state.rfind(",sentinels=");
  absl::string_view count =
      sentinels == absl::string_view::npos || sentinels < open ? "" : state.substr(sentinels + 11);
  if (!known || !absl::SimpleAtoi(count.substr(0, count.find_first_of(",)")), &vocab.sentinels) ||
      vocab.sentinels < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a span corruption loader's state without its source's vocabulary and sentinels: \"",
        state, "\""));
  }
  return vocab;
}

std::string SpanCorruptionLoader::Config() const {
  const SpanCorruptionOptions& o = corruptor_.options();
  return absl::StrCat("span_corruption(", source_->Fingerprint(),
                      ",global_batch=", layout_.global_batch_size(), ",S=", o.encoder_length,
                      ",T_dec=", corruptor_.decoder_length(), ",L=", corruptor_.raw_length(),
                      ",density=", o.noise_density, ",mean_span=", o.mean_noise_span_length,
                      ",sentinels=", o.num_sentinels, ",eos=", o.eos_id, ",pad=", o.pad_id,
                      ",ignore=", o.ignore_index, ",start=", o.decoder_start_id, ",seed=", o.seed,
                      ")");
}

}  // namespace data
