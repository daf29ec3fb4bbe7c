// Uniform random token ids from counter-based random numbers.
#include "models/data/random_tokens.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/data/row_random.h"

namespace data {

absl::StatusOr<std::unique_ptr<RandomTokenSource>> RandomTokenSource::Create(uint64_t seed,
                                                                             int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("[random tokens] vocab_size must be in [1, 2^31], got ", vocab_size));
  }
  return std::unique_ptr<RandomTokenSource>(new RandomTokenSource(seed, vocab_size));
}

void RandomTokenSource::SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const {
  RowRandom rng(seed_, RandomStream::kTokens, step, row);
  for (size_t i = 0; i < out.size(); ++i) out[i] = rng.UniformInt(i, vocab_size_);
}

std::string RandomTokenSource::Describe() const {
  return absl::StrCat("random tokens (vocab ", vocab_size_, ", seed ", seed_, ")");
}

std::string RandomTokenSource::Fingerprint() const {
  return absl::StrCat("random_tokens(vocab=", vocab_size_, ",seed=", seed_, ")");
}

}  // namespace data
