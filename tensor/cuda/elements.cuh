// Element access in float for the CUDA kernels, f32 / bf16 / f16: one value,
// a pair rounded in one instruction, and packs of N loaded or stored as one
// access. No project dependencies, so the device backend (backend.cu: copies,
// casts) and the kernel families (through common.cuh) share it.
#ifndef TENSOR_CUDA_ELEMENTS_CUH_
#define TENSOR_CUDA_ELEMENTS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace tensor {
namespace cuda {

// A vector access of kBytes bytes at p must be kBytes-aligned on a GPU (else
// "misaligned address", and the context is lost). Kernels pass their vector
// loads' and stores' addresses through this; the CUDA emulation aborts on a
// misaligned one, naming the block and thread (a CPU would not fault); on a
// GPU it compiles to nothing.
template <int kBytes>
__device__ __forceinline__ void CheckAligned(const void* p) {
#ifdef TENSOR_CUDA_EMULATION
  if (reinterpret_cast<uintptr_t>(p) % kBytes != 0) ::cuda_emu::MisalignedAccess(p, kBytes);
#else
  (void)p;
#endif
}

// One element in float, and a float rounded to nearest even into T.
__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromF<__half>(float x) { return __float2half_rn(x); }

// Two floats rounded into a 2-byte T as one register, lo in the low half:
// one cvt.rn.{bf16x2,f16x2}.f32 on the GPU where FromF twice takes two
// conversions and a move to pair them; the same bits.
template <typename T>
__device__ __forceinline__ uint32_t FromF2(float lo, float hi) {
  static_assert(sizeof(T) == 2, "pairs of bf16 or f16");
  uint32_t bits;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    static_assert(sizeof(pair) == sizeof(bits), "two halves in one register");
    __builtin_memcpy(&bits, &pair, sizeof(bits));
  } else {
    const __half2 pair = __floats2half2_rn(lo, hi);
    static_assert(sizeof(pair) == sizeof(bits), "two halves in one register");
    __builtin_memcpy(&bits, &pair, sizeof(bits));
  }
  return bits;
}

// N elements of T loaded or stored as one access (16 bytes at most).
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Pack {
  T v[N];
};

// One access of N elements, kept as loaded (16 bytes are 4 registers
// whatever T is: a row kernel can hold a lane's share of a 16-bit row in
// half the registers its floats would take).
template <int N, typename T>
__device__ __forceinline__ Pack<T, N> LoadPack(const T* p) {
  CheckAligned<alignof(Pack<T, N>)>(p);
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <int N, typename T>
__device__ __forceinline__ void Unpack(const Pack<T, N>& pk, float (&out)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = ToF(pk.v[k]);
}

template <int N, typename T>
__device__ __forceinline__ void LoadF(const T* p, float (&out)[N]) {
  Unpack(LoadPack<N>(p), out);
}

// Rounded as FromF each; bf16 / f16 in pairs (FromF2).
template <int N, typename T>
__device__ __forceinline__ void StoreF(T* p, const float (&in)[N]) {
  CheckAligned<alignof(Pack<T, N>)>(p);
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
    struct alignas(Pack<T, N>) Words {
      uint32_t w[N / 2];
    } words;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) words.w[k] = FromF2<T>(in[2 * k], in[2 * k + 1]);
    *reinterpret_cast<Words*>(p) = words;
  } else {
    Pack<T, N> pk;
#pragma unroll
    for (int k = 0; k < N; ++k) pk.v[k] = FromF<T>(in[k]);
    *reinterpret_cast<Pack<T, N>*>(p) = pk;
  }
}

}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ELEMENTS_CUH_
