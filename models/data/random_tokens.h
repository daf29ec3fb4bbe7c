// Random token ids: the benchmark data of the PyTorch FSDP paper. Each id is
// uniform in [0, vocab_size) and depends only on (seed, step, row, position),
// so any step of any rank can be regenerated on its own.
#ifndef MODELS_DATA_RANDOM_TOKENS_H_
#define MODELS_DATA_RANDOM_TOKENS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/data/token_source.h"

namespace data {

// GPT-2's vocabulary size, the default for random tokens and token files.
inline constexpr int64_t kGpt2VocabSize = 50257;

class RandomTokenSource : public TokenSource {
 public:
  // InvalidArgument unless 1 <= vocab_size <= 2^31.
  static absl::StatusOr<std::unique_ptr<RandomTokenSource>> Create(
      uint64_t seed, int64_t vocab_size = kGpt2VocabSize);

  int64_t vocab_size() const override { return vocab_size_; }
  int64_t max_sequence_length() const override { return kUnlimitedLength; }
  void SampleSequence(int64_t step, int64_t row, absl::Span<int64_t> out) const override;
  std::string Describe() const override;
  std::string Fingerprint() const override;

 private:
  RandomTokenSource(uint64_t seed, int64_t vocab_size) : seed_(seed), vocab_size_(vocab_size) {}

  uint64_t seed_;
  int64_t vocab_size_;
};

}  // namespace data

#endif  // MODELS_DATA_RANDOM_TOKENS_H_
