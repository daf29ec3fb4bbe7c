// TokenSource: the interface every data source implements (random tokens, byte
// text, uint16 token files). A source is a seeded, stateless function
//   (step, row, length) -> `length` token ids in [0, vocab_size())
// where `row` is the row of the *global* batch at that step. Loaders
// (lm_loader.h, span_corruption.h) turn rows into batches for one rank, so a
// rank's batch is exactly its slice of the global batch and any step can be
// regenerated without replaying the ones before it.
#ifndef MODELS_DATA_TOKEN_SOURCE_H_
#define MODELS_DATA_TOKEN_SOURCE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Every id SampleSequence writes is in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;

  // The longest sequence SampleSequence can produce (the number of tokens of a
  // file; unlimited for random tokens).
  virtual int64_t max_sequence_length() const = 0;

  // Writes the sequence for global row `row` of step `step` into `out`
  // (out.size() tokens, 1 <= out.size() <= max_sequence_length()). A pure
  // function of (seed, step, row, out.size()); thread-safe.
  virtual void SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const = 0;

  // What the source is, for messages: "bytes of models/data/text/x.txt (567198 bytes)".
  virtual std::string Describe() const = 0;

  // What determines the stream of samples (kind, size, vocabulary, content
  // digest, seed), not where the data lives: a checkpoint's loader state
  // records it, and restoring into a loader whose source has another
  // fingerprint is an error.
  virtual std::string Fingerprint() const = 0;

  // The same data restricted to its tokens [begin, end) (0 <= begin < end <=
  // max_sequence_length()), sampled with `seed`: a held-out split of a file
  // (--val_fraction). Describe and Fingerprint name the range. Unimplemented
  // for sources with no fixed tokens (random tokens: nothing to hold out).
  virtual absl::StatusOr<std::unique_ptr<TokenSource>> Slice(int64_t begin, int64_t end,
                                                             uint64_t seed) const;
};

// Checks a Slice range against a source's max_sequence_length().
absl::Status CheckSliceRange(int64_t begin, int64_t end, int64_t total);

// Start of a uniformly random window of `length` tokens in a sequence of
// `total` tokens (both > 0, length <= total): in [0, total - length].
// Deterministic from (seed, step, row).
int64_t SampleWindowStart(uint64_t seed, int64_t step, int64_t row, int64_t total, int64_t length);

inline constexpr int64_t kUnlimitedLength = std::numeric_limits<int64_t>::max();

// A digest of a source's data for its fingerprint's "content=" field (16 hex
// digits): FNV-1a (64-bit) of `bytes` whole up to 64 MiB (about 0.1 s there);
// past that, of its size and 64 windows of 64 KiB spread over it, the first
// at its start and the last at its end. Another text of the same size
// differs in it, except, past 64 MiB, where only bytes between the windows
// differ. Checkpoints hold it: changing how it is computed would refuse
// their resumes as other data.
std::string ContentDigest(absl::string_view bytes);

}  // namespace data

#endif  // MODELS_DATA_TOKEN_SOURCE_H_
