// Shared helpers of token sources: random window placement, content digests.
#include "models/data/token_source.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "models/data/row_random.h"
#include "tensor/fnv.h"

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

std::string ContentDigest(absl::string_view bytes) {
  constexpr size_t kWhole = size_t{64} << 20, kWindow = size_t{64} << 10, kWindows = 64;
  uint64_t h = tensor::kFnv1aBasis;
  if (bytes.size() <= kWhole) {
    h = tensor::Fnv1a64(bytes, h);
  } else {
    h = tensor::Fnv1a64(absl::StrCat(bytes.size()), h);
    // Window w starts at w / 63 of the way to the last start, the last one
    // ending where the data ends.
    const size_t last = bytes.size() - kWindow;
    for (size_t w = 0; w < kWindows; ++w) {
      const size_t at = w + 1 == kWindows ? last : w * (last / (kWindows - 1));
      h = tensor::Fnv1a64(bytes.substr(at, kWindow), h);
    }
  }
  return absl::StrFormat("%016x", h);
}

absl::Status CheckSliceRange(int64_t begin, int64_t end, int64_t total) {
  if (0 <= begin && begin < end && end <= total) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("token range [", begin, ", ", end,
                                                 ") is not a non-empty part of [0, ", total, ")"));
}

}  // namespace data
