// CUDA emulation on the CPU (--config=cuda_emu): what a kernel source (.cu)
// sees when it is compiled as plain C++ instead of by nvcc. Force-included
// (-include) before the source, after the source went through transform.py,
// which rewrites what a header cannot: launches `K<<<g, b, s, st>>>(args)`
// become `LaunchKernel(LaunchConfig(g, b, s, st), "K", [=, emu_args =
// std::make_tuple(args)]() { std::apply(<call K>, emu_args); })`, and
// `extern __shared__ T name[];` becomes a pointer to the block's dynamic
// shared memory.
//
// The model: a launch runs synchronously on the calling thread (every stream
// is therefore in order); each block runs its CUDA threads as fibers
// (fiber.h) that switch only at __syncthreads and at warp collectives
// (shuffles, __syncwarp, mma.sync, ldmatrix), so a block's threads and a warp's lanes
// meet exactly where the GPU makes them meet, and a collective that not all of
// its threads reach is reported as a deadlock instead of hanging. Shared
// memory (static arrays and the dynamic part) is the block's, filled with
// 0xff bytes when it starts (fiber.h). Device memory is host memory
// (runtime.cc).
//
// This is a test harness: it checks the kernels' indexing, synchronization
// and arithmetic on machines without a GPU. It says nothing about speed. A
// data race the GPU would expose can stay hidden by the fixed fiber order;
// --config=cuda_emu_race checks for races (fiber.h).
#ifndef THIRD_PARTY_CUDA_EMU_CUDA_EMU_H_
#define THIRD_PARTY_CUDA_EMU_CUDA_EMU_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>  // expf, fmaxf, ... in the global namespace, as CUDA has them

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

#include "third_party/cuda/emu/fiber.h"

// ---- Qualifiers: plain C++ ----
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#undef __shared__
#undef __constant__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
// Static shared memory: transform.py rewrites a .cu's declarations into the
// block's copies (fiber.h's StaticShared) and refuses any it cannot; one in
// a header the .cu includes stays a thread_local object of the launching
// thread, which every block of a launch reuses.
#define __shared__ static thread_local
#define __constant__ static

#define TENSOR_CUDA_EMULATION 1

// ---- Built-in variables ----
#define threadIdx (::cuda_emu::CurrentThread().thread_idx)
#define blockIdx (::cuda_emu::CurrentBlock().block_idx)
#define blockDim (::cuda_emu::CurrentBlock().block_dim)
#define gridDim (::cuda_emu::CurrentBlock().grid_dim)
#ifndef warpSize
#define warpSize 32
#endif

inline void __syncthreads() { ::cuda_emu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuda_emu::SyncWarp(mask); }
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- Warp shuffles (CUDA's semantics for `width`) ----
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::cuda_emu::CurrentThread().lane;
  const int base = lane & ~(width - 1);
  return ::cuda_emu::WarpExchange(mask, v, base + (src & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::cuda_emu::CurrentThread().lane;
  const int base = lane & ~(width - 1);
  int src = lane ^ lane_mask;
  if (src < base || src >= base + width) src = lane;
  return ::cuda_emu::WarpExchange(mask, v, src);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::cuda_emu::CurrentThread().lane;
  const int in_seg = lane & (width - 1);
  const int src = in_seg + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  return ::cuda_emu::WarpExchange(mask, v, src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::cuda_emu::CurrentThread().lane;
  const int in_seg = lane & (width - 1);
  const int src = in_seg >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return ::cuda_emu::WarpExchange(mask, v, src);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return ::cuda_emu::WarpBallot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
  return (__ballot_sync(mask, pred) & mask) == (mask & ::cuda_emu::LiveLanes());
}

// ---- Atomics: relaxed read-modify-writes of the bits (fibers of one launch
// never run at the same time, but --config=cuda_emu_race must see them as
// atomic accesses, which do not race with each other) ----
namespace cuda_emu {
template <typename T, typename F>
T AtomicUpdate(T* p, F update) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "atomics of 2, 4 or 8 bytes");
  using Bits = std::conditional_t<sizeof(T) == 2, uint16_t,
                                  std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  auto* bits = reinterpret_cast<Bits*>(p);
  Bits old_bits = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    T old;
    std::memcpy(&old, &old_bits, sizeof(T));
    const T next = update(old);
    Bits next_bits;
    std::memcpy(&next_bits, &next, sizeof(T));
    if (__atomic_compare_exchange_n(bits, &old_bits, next_bits, /*weak=*/false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED)) {
      return old;
    }
  }
}
}  // namespace cuda_emu

template <typename T>
T atomicAdd(T* p, T v) {
  return ::cuda_emu::AtomicUpdate(p, [v](T old) { return static_cast<T>(old + v); });
}
template <typename T>
T atomicMin(T* p, T v) {
  return ::cuda_emu::AtomicUpdate(p, [v](T old) { return v < old ? v : old; });
}
template <typename T>
T atomicMax(T* p, T v) {
  return ::cuda_emu::AtomicUpdate(p, [v](T old) { return v > old ? v : old; });
}
template <typename T>
T atomicExch(T* p, T v) {
  return ::cuda_emu::AtomicUpdate(p, [v](T) { return v; });
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  return ::cuda_emu::AtomicUpdate(p, [compare, v](T old) { return old == compare ? v : old; });
}

// ---- Arithmetic intrinsics: the IEEE-rounded operations are exact here
// (the emulated sources are compiled with -ffp-contract=off) ----
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline int __float_as_int(float f) {
  int x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  return x;
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// CUDA's global min / max overloads (integers of one type, floats).
#define CUDA_EMU_MINMAX(T)                                  \
  inline T min(T a, T b) { return b < a ? b : a; }          \
  inline T max(T a, T b) { return a < b ? b : a; }
CUDA_EMU_MINMAX(int)
CUDA_EMU_MINMAX(unsigned)
CUDA_EMU_MINMAX(long)
CUDA_EMU_MINMAX(unsigned long)
CUDA_EMU_MINMAX(long long)
CUDA_EMU_MINMAX(unsigned long long)
#undef CUDA_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// cuda_runtime.h's template overload for kernels (nvcc only).
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

namespace cuda_emu {

// ---- Launches (transform.py turns `K<<<config>>>(args)` into
// `LaunchKernel(LaunchConfig(config), "K", <a call of K with args>)`) ----
struct LaunchConfig {
  LaunchConfig(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0)
      : grid(g), block(b), shared_bytes(smem), stream(s) {}
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
};

// The kernel's arguments are evaluated at the launch into a tuple the call
// holds (transform.py), so a launch deferred on a created stream (pending.h)
// runs with the values they had when it was issued, as a GPU copies them at
// the launch; each CUDA thread's call copies them into K's parameters.
inline void LaunchKernel(const LaunchConfig& config, const char* name,
                         std::function<void()> call) {
  LaunchOnStream(config.stream, config.grid, config.block, config.shared_bytes, std::move(call),
                 name);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, every lane
// of the warp giving its fragments (PTX ISA, "Matrix fragments for
// mma.m16n8k16 with floating point type"): g = lane / 4, t = lane % 4;
// A (16x16): a[i] holds rows g (i = 0, 2) or g + 8 (i = 1, 3), columns
// 2t, 2t + 1 (+8 for i >= 2), lower column in the low half;
// B (16x8): b0 rows 2t, 2t + 1, b1 rows 2t + 8, 2t + 9, column g;
// C / D (16x8): c0, c1 row g, c2, c3 row g + 8, columns 2t, 2t + 1.
template <typename T>
void MmaM16N8K16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(sizeof(T) == 2, "mma operands are 16-bit");
  struct Frag {
    uint32_t a[4], b[2];
  };
  const Frag mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
  Frag all[32];
  WarpGather(0xffffffffu, &mine, sizeof(Frag), all);
  auto half = [](uint32_t reg, int hi) {
    T x;
    const uint16_t bits = static_cast<uint16_t>(hi ? reg >> 16 : reg & 0xffffu);
    std::memcpy(static_cast<void*>(&x), &bits, 2);
    if constexpr (std::is_same_v<T, __half>) {
      return __half2float(x);
    } else {
      return __bfloat162float(x);
    }
  };
  float am[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const Frag& f = all[lane];
    for (int h = 0; h < 2; ++h) {
      am[g][2 * t + h] = half(f.a[0], h);
      am[g + 8][2 * t + h] = half(f.a[1], h);
      am[g][2 * t + 8 + h] = half(f.a[2], h);
      am[g + 8][2 * t + 8 + h] = half(f.a[3], h);
      bm[2 * t + h][g] = half(f.b[0], h);
      bm[2 * t + 8 + h][g] = half(f.b[1], h);
    }
  }
  const int lane = CurrentThread().lane, g = lane / 4, t = lane % 4;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  for (int i = 0; i < 4; ++i) {
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += am[rows[i]][k] * bm[k][cols[i]];
    c[i] = acc;
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level
// matrix load instruction: ldmatrix"): lanes 8m .. 8m + 7 give the addresses
// of rows 0 .. 7 of the 8x8 matrix m (8 16-bit elements, 16 bytes, 16-byte
// aligned, in shared memory); lane l receives in r[m] row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of matrix m, the lower column in the low half
// (with .trans: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1). Each lane
// reads its row when it joins, so the whole warp's reads happen at the
// instruction, as on the GPU. Addresses must lie in the block's dynamic
// shared memory.
template <bool kTrans>
void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) MisalignedAccess(row, 16);
  if (!InDynamicSharedMemory(row, 16)) NotInSharedMemory("an ldmatrix row", row);
  uint16_t mine[8], all[32][8];
  std::memcpy(mine, row, sizeof(mine));
  WarpGather(0xffffffffu, mine, sizeof(mine), all);
  const int lane = CurrentThread().lane, g = lane / 4, t = lane % 4;
  for (int m = 0; m < 4; ++m) {
    const uint16_t lo = kTrans ? all[8 * m + 2 * t][g] : all[8 * m + g][2 * t];
    const uint16_t hi = kTrans ? all[8 * m + 2 * t + 1][g] : all[8 * m + g][2 * t + 1];
    r[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}

// cp.async.cg.shared.global [dst], [src], 16, src_bytes; commit_group;
// wait_group N (see fiber.h's AsyncCopyToShared for the model).
inline void CpAsync16(void* dst, const void* src, int src_bytes) {
  AsyncCopyToShared(dst, src, 16, src_bytes);
}
inline void CpAsyncCommit() { AsyncCopyCommit(); }
template <int kNewestPending>
void CpAsyncWait() {
  AsyncCopyWait(kNewestPending);
}

}  // namespace cuda_emu

#endif  // THIRD_PARTY_CUDA_EMU_CUDA_EMU_H_
