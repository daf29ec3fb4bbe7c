// Shared helpers of token sources: random window placement.
#include "models/data/token_source.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "models/data/row_random.h"

namespace data {

int64_t SampleWindowStart(uint64_t seed, int64_t step, int64_t row, int64_t total, int64_t length) {
  CHECK_GT(length, 0);
  CHECK_LE(length, total) << "window longer than the data";
  RowRandom rng(seed, RandomStream::kWindowStart, step, row);
  return rng.UniformInt(0, total - length + 1);
}

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::Slice(int64_t, int64_t, uint64_t) const {
  return absl::UnimplementedError(
      absl::StrCat(Describe(), " has no fixed tokens to split into training and held-out parts"));
}

absl::Status CheckSliceRange(int64_t begin, int64_t end, int64_t total) {
  if (0 <= begin && begin < end && end <= total) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("token range [", begin, ", ", end,
                                                 ") is not a non-empty part of [0, ", total, ")"));
}

}  // namespace data
