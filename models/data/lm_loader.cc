// Next-token-prediction batches from a token source, split by rank.
#include "models/data/lm_loader.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace data {

absl::StatusOr<LmLoader> LmLoader::Create(std::shared_ptr<const TokenSource> source,
                                          DataParallel layout, int64_t seq_len) {
  if (source == nullptr) return absl::InvalidArgumentError("[lm loader] no token source");
  if (absl::Status s = layout.Validate("lm loader"); !s.ok()) return s;
  if (seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("[lm loader] seq_len must be >= 1, got ", seq_len));
  }
  if (source->max_sequence_length() < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[lm loader] ", source->Describe(), " is too small: a sample needs seq_len + 1 = ",
        seq_len + 1, " tokens but it has ", source->max_sequence_length()));
  }
  return LmLoader(std::move(source), layout, seq_len);
}

LmBatch LmLoader::Batch(int64_t step) const {
  CHECK_GE(step, 0) << "[lm loader] negative step";
  const int64_t B = layout_.local_rows(), T = seq_len_;  // K micro-batches of batch_size
  LmBatch batch;
  batch.step = step;
  batch.inputs = tensor::Tensor::Empty({B, T}, tensor::Dtype::kI64);
  batch.targets = tensor::Tensor::Empty({B, T}, tensor::Dtype::kI64);
  int64_t* inputs = batch.inputs.data<int64_t>();
  int64_t* targets = batch.targets.data<int64_t>();
  std::vector<int64_t> row(T + 1);
  for (int64_t b = 0; b < B; ++b) {
    source_->SampleSequence(step, layout_.GlobalRow(b), absl::MakeSpan(row));
    std::copy(row.begin(), row.end() - 1, inputs + b * T);
    std::copy(row.begin() + 1, row.end(), targets + b * T);
  }
  return batch;
}

LmBatch LmLoader::Next() { return Batch(step_++); }

absl::Status LmLoader::Restore(const LoaderState& state) {
  if (absl::Status s = CheckRestore(state, Config(), "lm loader"); !s.ok()) return s;
  step_ = state.step;
  return absl::OkStatus();
}

std::string LmLoader::Config() const {
  return absl::StrCat("lm(", source_->Fingerprint(), ",global_batch=", layout_.global_batch_size(),
                      ",seq_len=", seq_len_, ")");
}

}  // namespace data
