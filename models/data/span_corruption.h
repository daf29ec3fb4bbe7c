// T5 span corruption (Raffel et al. 2020, section 3.1.4): from a sequence of
// tokens, drop ~15% of them in spans of mean length 3; the encoder input keeps
// the other tokens with one sentinel in place of each dropped span, and the
// decoder target lists each sentinel followed by the tokens it replaced, then
// a final sentinel:
//   original: Thank you for inviting me to your party last week
//   inputs:   Thank you <X> me to your party <Y> week
//   targets:  <X> for inviting <Y> last <Z>
// As in T5 (random_spans_noise_mask), an example of L tokens has
// round(L * noise_density) noise tokens in round(noise / mean_span_length)
// spans, and the lengths of the noise spans and of the non-noise runs between
// them are uniformly random compositions. One difference: T5 always starts with
// non-noise and ends with a noise span, so the last token of every example is
// dropped; here the non-noise runs before the first and after the last span may
// be empty or not, so both ends are treated alike (counts and lengths are T5's).
// By default L is the longest length whose
// corrupted input fits the encoder length S, so every example has the same
// lengths and the encoder input is full; the targets are padded to the decoder
// length.
//
// Vocabulary: sentinels are added on top of the source's vocabulary V:
// vocab_size() = V + num_sentinels and sentinel k (T5's <extra_id_k>) has id
// vocab_size() - 1 - k, so every sentinel id is >= V (for byte text: >= 256).
#ifndef MODELS_DATA_SPAN_CORRUPTION_H_
#define MODELS_DATA_SPAN_CORRUPTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "models/data/loader_state.h"
#include "models/data/token_source.h"
#include "tensor/tensor.h"

namespace data {

struct SpanCorruptionOptions {
  int64_t encoder_length = 512;  // S
  // T_dec; 0 picks exactly the length the targets need. Longer pads with
  // ignore_index; shorter is an error.
  int64_t decoder_length = 0;
  // Raw tokens per example (L); 0 picks the longest L whose corrupted input
  // fills encoder_length exactly (as T5), at most 1000 * encoder_length (a
  // noise_density that needs more is an error). A shorter L pads the encoder inputs.
  int64_t raw_length = 0;
  double noise_density = 0.15;
  double mean_noise_span_length = 3.0;
  int64_t num_sentinels = 100;
  // When >= 0, appended to every encoder input and target (T5's </s>); must be
  // an id of the source's vocabulary. -1: no EOS (the final sentinel ends the
  // targets).
  int64_t eos_id = -1;
  int64_t pad_id = 0;            // encoder padding; decoder inputs at ignored positions
  int64_t ignore_index = -100;   // decoder targets at padded positions
  int64_t decoder_start_id = 0;  // first decoder input (T5: the pad id)
  uint64_t seed = 0;             // noise masks: deterministic from (seed, step, row)
};

// Counts for an example of `length` raw tokens (T5's formulas, clamped so that
// 1 <= num_noise <= length - 1 and 1 <= num_spans <= min(noise, non-noise)).
struct SpanCounts {
  int64_t length = 0;
  int64_t num_noise = 0;
  int64_t num_spans = 0;
};
SpanCounts ComputeSpanCounts(int64_t length, double noise_density, double mean_noise_span_length);

// The noise mask of one example (true = dropped), `counts.length` long, with
// exactly counts.num_noise noise tokens in counts.num_spans separated spans.
// Deterministic from (seed, step, row).
std::vector<bool> RandomSpansNoiseMask(const SpanCounts& counts, uint64_t seed, int64_t step,
                                       int64_t row);

// The corruption of one example with fixed lengths; no state.
class SpanCorruptor {
 public:
  // InvalidArgument for options out of range, an encoder length too short for
  // one span (or for raw_length), a noise_density too close to 1 for an
  // automatic raw_length, too few sentinels for the spans, or a decoder length
  // shorter than the targets.
  static absl::StatusOr<SpanCorruptor> Create(int64_t source_vocab_size,
                                              const SpanCorruptionOptions& options);

  const SpanCorruptionOptions& options() const { return options_; }
  int64_t source_vocab_size() const { return source_vocab_size_; }
  // source vocabulary + sentinels: the model's vocabulary.
  int64_t vocab_size() const { return source_vocab_size_ + options_.num_sentinels; }
  int64_t SentinelId(int64_t k) const { return vocab_size() - 1 - k; }
  bool IsSentinel(int64_t id) const { return id >= source_vocab_size_ && id < vocab_size(); }
  // Index k of a sentinel id.
  int64_t SentinelIndex(int64_t id) const { return vocab_size() - 1 - id; }

  // Raw tokens per example (L), noise tokens and spans in each.
  const SpanCounts& counts() const { return counts_; }
  int64_t raw_length() const { return counts_.length; }
  // Unpadded lengths: non-noise + spans (+ EOS), and noise + spans + 1 (+ EOS).
  int64_t encoder_tokens() const;
  int64_t target_tokens() const;
  int64_t encoder_length() const { return options_.encoder_length; }
  int64_t decoder_length() const { return decoder_length_; }

  // Corrupts `tokens` (raw_length() ids of the source vocabulary) with `noise`
  // (raw_length() flags, as RandomSpansNoiseMask gives) into the padded rows:
  // encoder_inputs and encoder_mask (encoder_length()), decoder_inputs and
  // decoder_targets (decoder_length()).
  void Corrupt(absl::Span<const int64_t> tokens, const std::vector<bool>& noise,
               absl::Span<int64_t> encoder_inputs, absl::Span<int64_t> encoder_mask,
               absl::Span<int64_t> decoder_inputs, absl::Span<int64_t> decoder_targets) const;

  // For printing samples: ids through `decode` (e.g. DecodeBytes), sentinels as
  // "<extra_id_k>", EOS as "</s>"; ignore_index entries are skipped.
  std::string Render(absl::Span<const int64_t> ids,
                     const std::function<std::string(absl::Span<const int64_t>)>& decode) const;

 private:
  SpanCorruptor(int64_t source_vocab_size, SpanCorruptionOptions options, SpanCounts counts,
                int64_t decoder_length)
      : source_vocab_size_(source_vocab_size),
        options_(options),
        counts_(counts),
        decoder_length_(decoder_length) {}

  int64_t source_vocab_size_;
  SpanCorruptionOptions options_;
  SpanCounts counts_;
  int64_t decoder_length_;
};

struct Seq2SeqBatch {
  int64_t step = 0;
  tensor::Tensor encoder_inputs;   // (B, S) i64, pad_id after the example
  tensor::Tensor encoder_mask;     // (B, S) i64: 1 for example tokens, 0 for padding
  tensor::Tensor decoder_inputs;   // (B, T_dec) i64: decoder_start_id, then targets shifted right
                                   //   (pad_id where the target is padding)
  tensor::Tensor decoder_targets;  // (B, T_dec) i64, ignore_index at padding
};

// T5 pretraining batches over any token source, split by rank like LmLoader:
// rank r's batch is rows [r*B, (r+1)*B) of the global batch at each step (with
// K micro-batches, K*B rows: see loader_state.h).
class SpanCorruptionLoader {
 public:
  // Errors of SpanCorruptor::Create and DataParallel::Validate, and
  // InvalidArgument when the source is shorter than raw_length() tokens.
  static absl::StatusOr<SpanCorruptionLoader> Create(std::shared_ptr<const TokenSource> source,
                                                     DataParallel layout,
                                                     const SpanCorruptionOptions& options);

  Seq2SeqBatch Batch(int64_t step) const;
  Seq2SeqBatch Next();  // Batch(step()) then advances

  int64_t step() const { return step_; }
  LoaderState state() const { return {step_, Config()}; }
  absl::Status Restore(const LoaderState& state);

  const SpanCorruptor& corruptor() const { return corruptor_; }
  const TokenSource& source() const { return *source_; }
  const DataParallel& layout() const { return layout_; }
  // The model's vocabulary: the source's plus the sentinels.
  int64_t vocab_size() const { return corruptor_.vocab_size(); }

 private:
  SpanCorruptionLoader(std::shared_ptr<const TokenSource> source, DataParallel layout,
                       SpanCorruptor corruptor)
      : source_(std::move(source)), layout_(layout), corruptor_(std::move(corruptor)) {}
  std::string Config() const;

  std::shared_ptr<const TokenSource> source_;
  DataParallel layout_;
  SpanCorruptor corruptor_;
  int64_t step_ = 0;
};

// The special ids a SpanCorruptionLoader's state records (its config holds
// ",eos=<id>,pad=<id>,...,start=<id>"): what a model trained on its batches
// takes as end, padding and decoder start. InvalidArgument when `state`
// (LoaderState::ToString()) is not a span corruption loader's.
struct SpanCorruptionIds {
  int64_t eos_id = -1;  // -1: the rows end without one
  int64_t pad_id = 0;
  int64_t decoder_start_id = 0;
};
absl::StatusOr<SpanCorruptionIds> SpanCorruptionIdsOf(absl::string_view state);

// The vocabulary a SpanCorruptionLoader's state records: its source's ids
// (byte text: 256; a token file's or random tokens' "vocab=") and the
// sentinels numbered right above them, so that a model's rows can be matched
// to other data. InvalidArgument as SpanCorruptionIdsOf, or for a source
// whose vocabulary the state does not say.
struct SpanCorruptionVocab {
  int64_t source_vocab = 0;
  int64_t sentinels = 0;
};
absl::StatusOr<SpanCorruptionVocab> SpanCorruptionVocabOf(absl::string_view state);

}  // namespace data

#endif  // MODELS_DATA_SPAN_CORRUPTION_H_
