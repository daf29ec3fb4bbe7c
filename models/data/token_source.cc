// Shared helpers of token sources: random window placement.
#include "models/data/token_source.h"

#include "glog/logging.h"
#include "models/data/row_random.h"

namespace data {

int64_t SampleWindowStart(uint64_t seed, int64_t step, int64_t row, int64_t total, int64_t length) {
  CHECK_GT(length, 0);
  CHECK_LE(length, total) << "window longer than the data";
  RowRandom rng(seed, RandomStream::kWindowStart, step, row);
  return rng.UniformInt(0, total - length + 1);
}

}  // namespace data
