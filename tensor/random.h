// A seeded counter-based random number generator (Philox4x32-10).
//
// Element i of a fill draws from counter i of the generator's current
// offset, so results do not depend on how many threads fill the tensor. A
// Generator is a (seed, offset) pair: each fill consumes a block of counters
// and advances the offset, so successive fills differ and replaying from the
// same (seed, offset) gives the same numbers.
#ifndef TENSOR_RANDOM_H_
#define TENSOR_RANDOM_H_

#include <array>
#include <cstdint>

namespace tensor {

// Philox4x32 with 10 rounds: 4 random 32-bit words for (key, counter).
std::array<uint32_t, 4> Philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Uniform float in [0, 1) from 32 random bits (24-bit resolution).
inline float UniformFromBits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }

  // Draws for part `index` of `count` equal parts of a batch (a data-parallel
  // rank's rows, a micro-batch's): each Reserve(n) then takes this part's n
  // counters out of the count * n the whole batch would reserve, so the parts
  // draw what one draw over the whole batch gives their rows (exactly where a
  // part's elements fill whole counters: dropout's n = numel / 4 for numel a
  // multiple of 4), and no two parts draw the same numbers. Default: the whole
  // (0 of 1). index in [0, count).
  void SetBatchPart(uint64_t index, uint64_t count) {
    part_ = index;
    parts_ = count;
  }

  // Reserves `n` counters and returns the first; callers then draw counter
  // base + i for element i with Bits(). With a batch part (SetBatchPart) the
  // offset moves past every part's n.
  uint64_t Reserve(uint64_t n) {
    const uint64_t base = offset_ + part_ * n;
    offset_ += parts_ * n;
    return base;
  }
  // 4 random words for counter c (under this generator's seed).
  std::array<uint32_t, 4> Bits(uint64_t c) const { return Philox4x32(seed_, 0, c); }
  // One uniform [0,1) for counter c (first word).
  float Uniform(uint64_t c) const { return UniformFromBits(Bits(c)[0]); }
  // One standard normal for counter c (Box-Muller on the first two words).
  float Normal(uint64_t c) const;

 private:
  uint64_t seed_;
  uint64_t offset_;
  uint64_t part_ = 0;
  uint64_t parts_ = 1;
};

}  // namespace tensor

#endif  // TENSOR_RANDOM_H_
