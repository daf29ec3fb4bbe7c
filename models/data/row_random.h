// Random numbers for one row of one step of a data stream: a pure function of
// (seed, stream, step, row, index) built on the Philox4x32-10 generator of
// //tensor:random, so any row of any step can be regenerated on its own (resume
// without replay, one rank without the others).
//
// Philox key = seed mixed with a stream id (each data feature draws from its own
// stream: window starts, token ids, noise masks); counter = (step, row << 32 |
// block). Word i of a row is word i % 4 of block i / 4.
#ifndef MODELS_DATA_ROW_RANDOM_H_
#define MODELS_DATA_ROW_RANDOM_H_

#include <array>
#include <cstdint>

#include "glog/logging.h"
#include "tensor/random.h"

namespace data {

// Stream ids: distinct features of the data pipeline never share random words.
enum class RandomStream : uint64_t {
  kWindowStart = 1,  // where a text / token-file window starts
  kTokens = 2,       // uniform random token ids
  kNoiseMask = 3,    // T5 span corruption masks
};

class RowRandom {
 public:
  RowRandom(uint64_t seed, RandomStream stream, int64_t step, int64_t row)
      : key_(seed ^ (static_cast<uint64_t>(stream) * 0x9E3779B97F4A7C15ull)),
        step_(static_cast<uint64_t>(step)),
        row_(static_cast<uint64_t>(row)) {
    CHECK_GE(step, 0) << "step must be >= 0";
    CHECK_GE(row, 0) << "row must be >= 0";
    CHECK_LT(row, int64_t{1} << 31) << "row index too large";
  }

  // Random 32-bit word number i of this row.
  uint32_t Word(uint64_t i) {
    const uint64_t block = i >> 2;
    if (block != cached_block_) {
      CHECK_LT(block, uint64_t{1} << 32) << "too many random words for one row";
      cached_ = tensor::Philox4x32(key_, step_, (row_ << 32) | block);
      cached_block_ = block;
    }
    return cached_[i & 3];
  }

  // Random 64-bit value from words 2i and 2i+1.
  uint64_t Bits64(uint64_t i) {
    return (static_cast<uint64_t>(Word(2 * i)) << 32) | Word(2 * i + 1);
  }

  // Uniform integer in [0, n) from Bits64(i) (multiply-shift: bias below n / 2^64).
  int64_t UniformInt(uint64_t i, int64_t n) {
    CHECK_GT(n, 0);
    const unsigned __int128 p =
        static_cast<unsigned __int128>(Bits64(i)) * static_cast<uint64_t>(n);
    return static_cast<int64_t>(p >> 64);
  }

 private:
  uint64_t key_;
  uint64_t step_;
  uint64_t row_;
  uint64_t cached_block_ = ~uint64_t{0};
  std::array<uint32_t, 4> cached_{};
};

}  // namespace data

#endif  // MODELS_DATA_ROW_RANDOM_H_
