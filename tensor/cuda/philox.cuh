// Philox4x32-10 on the device (key, counter_hi = 0, counter_lo = counter), as
// tensor::Philox4x32 (tensor/random.h): the generator of the dropout masks
// (tensor/ops/dropout.h), evaluated where the masks are used (dropout.cu,
// the fused attention's dropout in attention.cu).
#ifndef TENSOR_CUDA_PHILOX_CUH_
#define TENSOR_CUDA_PHILOX_CUH_

#include <cstdint>

namespace tensor {
namespace cuda {

__device__ __forceinline__ void Philox(uint64_t key, uint64_t counter, uint32_t w[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

// w[k] for a k known only at run time, as a select: indexing w directly would
// put it in local memory.
__device__ __forceinline__ uint32_t PhiloxWord(const uint32_t (&w)[4], uint32_t k) {
  return k == 0 ? w[0] : (k == 1 ? w[1] : (k == 2 ? w[2] : w[3]));
}

// Whether elements i and i + 1 of a dropout over mask (seed, offset) are kept:
// element i uses word i % 4 of counter offset + i / 4 and is kept iff
// (word >> 8) >= threshold = ceil(p 2^24). One Philox evaluation serves both
// unless i % 4 == 3.
__device__ __forceinline__ void DropoutKeepsPair(uint64_t seed, uint64_t offset,
                                                 uint32_t threshold, uint64_t i, bool keep[2]) {
  uint32_t w[4];
  Philox(seed, offset + i / 4, w);
  const uint32_t k = static_cast<uint32_t>(i & 3);
  uint32_t next;
  if (k == 3) {
    uint32_t v[4];
    Philox(seed, offset + i / 4 + 1, v);
    next = v[0];
  } else {
    next = PhiloxWord(w, k + 1);
  }
  keep[0] = (PhiloxWord(w, k) >> 8) >= threshold;
  keep[1] = (next >> 8) >= threshold;
}

// Whether element i of such a dropout is kept.
__device__ __forceinline__ bool DropoutKeeps(uint64_t seed, uint64_t offset, uint32_t threshold,
                                             uint64_t i) {
  uint32_t w[4];
  Philox(seed, offset + i / 4, w);
  return (PhiloxWord(w, static_cast<uint32_t>(i & 3)) >> 8) >= threshold;
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_PHILOX_CUH_
