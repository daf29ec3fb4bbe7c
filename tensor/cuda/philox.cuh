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

// Whether element i of a dropout over mask (seed, offset) is kept: word i % 4
// of counter offset + i / 4, kept iff (word >> 8) >= threshold = ceil(p 2^24).
__device__ __forceinline__ bool DropoutKeeps(uint64_t seed, uint64_t offset, uint32_t threshold,
                                             uint64_t i) {
  uint32_t w[4];
  Philox(seed, offset + i / 4, w);
  return (w[i % 4] >> 8) >= threshold;
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_PHILOX_CUH_
