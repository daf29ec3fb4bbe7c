// Helpers of the row kernels (norm.cu, softmax.cu, loss.cu): one warp or one
// block per row, packed 16-byte loads in float, warp/block sums, and the
// online max / sum of exponentials of softmax. See common.cuh for the general
// conventions.
#ifndef TENSOR_CUDA_ROWS_CUH_
#define TENSOR_CUDA_ROWS_CUH_

#include <cstdint>
#include <type_traits>

#include "tensor/cuda/common.cuh"

namespace tensor {
namespace cuda {
namespace rows {

// ---- Row geometry, packed loads, sums ----

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxRowThreads = 1024;       // the row kernels' __launch_bounds__
constexpr int64_t kWarpRowMaxCols = 1024;  // rows up to this long: a warp per row
constexpr int kWarpRowsPerBlock = 8;
constexpr int64_t kMaxGrid = int64_t{1} << 20;  // row loops stride past this many blocks

// Packs of N elements as one access (elements.cuh).
using cuda::LoadF;
using cuda::LoadPack;
using cuda::Pack;
using cuda::StoreF;
using cuda::Unpack;

// Sums of K values over a warp; every lane gets the same bits (a butterfly:
// each step adds the same two operands in every lane of a pair).
template <int K>
__device__ __forceinline__ void WarpSum(float (&v)[K]) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(kFullMask, v[k], o);
  }
}

// Sums of K values over the block (blockDim.x a multiple of 32); every thread
// gets the same result. smem holds K * 32 floats.
template <int K>
__device__ __forceinline__ void BlockSum(float (&v)[K], float* smem) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  WarpSum(v);
  __syncthreads();  // an earlier call's readers are done with smem
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[k * kWarp + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = lane < blockDim.x / kWarp ? smem[k * kWarp + lane] : 0.0f;
  WarpSum(v);
}

// The threads that share a row: a warp (kWarpRows) or the whole block. Rows
// are visited in a grid-stride loop, so any number of rows fits the grid.
template <bool kWarpRows>
struct RowGroup {
  int rank;  // thread index within the group
  int size;  // threads in the group
  __device__ RowGroup()
      : rank(kWarpRows ? threadIdx.x % kWarp : threadIdx.x), size(kWarpRows ? kWarp : blockDim.x) {}
  __device__ int64_t FirstRow() const {
    return kWarpRows ? int64_t{blockIdx.x} * (blockDim.x / kWarp) + threadIdx.x / kWarp
                     : int64_t{blockIdx.x};
  }
  __device__ int64_t RowStride() const {
    return kWarpRows ? int64_t{gridDim.x} * (blockDim.x / kWarp) : int64_t{gridDim.x};
  }
  template <int K>
  __device__ void Sum(float (&v)[K], float* smem) const {
    if constexpr (kWarpRows) {
      WarpSum(v);
    } else {
      BlockSum(v, smem);
    }
  }
};

// Launch geometry of a row kernel.
struct RowPlan {
  bool warp_rows;
  unsigned grid;
  unsigned block;
};

// `vec`: elements per load. Block rows get about 4 loads per thread.
inline RowPlan PlanRows(int64_t rows, int64_t cols, int vec) {
  RowPlan p;
  p.warp_rows = cols <= kWarpRowMaxCols;
  int64_t grid;
  if (p.warp_rows) {
    p.block = kWarp * kWarpRowsPerBlock;
    grid = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
  } else {
    const int64_t loads = (cols + vec - 1) / vec;
    int64_t threads = ((loads + 3) / 4 + kWarp - 1) / kWarp * kWarp;
    threads = threads < 128 ? 128 : (threads > kMaxRowThreads ? kMaxRowThreads : threads);
    p.block = static_cast<unsigned>(threads);
    grid = rows;
  }
  p.grid = static_cast<unsigned>(grid < 1 ? 1 : (grid > kMaxGrid ? kMaxGrid : grid));
  return p;
}

// Calls fn(std::bool_constant<warp_rows>, std::integral_constant<int, N>) with
// N = kVec when `vec`, else 1.
template <int kVec, typename Fn>
void DispatchRows(bool warp_rows, bool vec, Fn&& fn) {
  using W = std::true_type;
  using B = std::false_type;
  using V = std::integral_constant<int, kVec>;
  using S = std::integral_constant<int, 1>;
  if (warp_rows) {
    vec ? fn(W{}, V{}) : fn(W{}, S{});
  } else {
    vec ? fn(B{}, V{}) : fn(B{}, S{});
  }
}

// ---- A lane's share of a row, held in registers ----

// fn(it, i) for the packs of N elements a lane owns in a row of c elements,
// i = first + it * step while i < c. kCount > 0: unrolled over it < kCount
// (each it a constant, so arrays indexed by it stay in registers; the row has
// at most kCount packs a lane); 0: a loop, it always 0.
template <int kCount, typename F>
__device__ __forceinline__ void ForPacks(int64_t first, int64_t step, int64_t c, F&& fn) {
  if constexpr (kCount > 0) {
#pragma unroll
    for (int it = 0; it < kCount; ++it) {
      const int64_t i = first + it * step;
      if (i < c) fn(it, i);
    }
  } else {
    for (int64_t i = first; i < c; i += step) fn(0, i);
  }
}

// A lane's packs of one row (the ForPacks ones). kHeld > 0: all of them (at
// most kHeld) loaded by the constructor, every load issued before any is
// used (one memory round trip a row instead of one or two a pack), and read
// from registers by every pass after; 0: Get loads (the first pass from
// memory, later passes from L1 / L2). A null row with c = 0 holds nothing.
template <int kHeld, int N, typename T>
class LanePacks {
 public:
  __device__ LanePacks(const T* row, int64_t first, int64_t step, int64_t c) : row_(row) {
    if constexpr (kHeld > 0) {
      ForPacks<kHeld>(first, step, c,
                      [&](int it, int64_t i) { packs_[it] = LoadPack<N>(row + i); });
    }
  }
  // Marks the held packs as changed (an empty asm on each 32-bit word, on
  // the GPU; nothing otherwise): the next pass converts them again instead of
  // the compiler keeping the previous pass's floats alive in between (twice
  // the registers for 16-bit elements).
  __device__ __forceinline__ void Refresh() {
#ifndef TENSOR_CUDA_EMULATION
    if constexpr (kHeld > 0) {
      static_assert(sizeof(Pack<T, N>) % 4 == 0, "packs of whole words");
#pragma unroll
      for (int it = 0; it < kHeld; ++it) {
        uint32_t* words = reinterpret_cast<uint32_t*>(&packs_[it]);
#pragma unroll
        for (int k = 0; k < static_cast<int>(sizeof(Pack<T, N>) / 4); ++k) {
          asm volatile("" : "+r"(words[k]));
        }
      }
    }
#endif
  }

  // Elements [i, i + N) in float, i being pack `it`'s first.
  __device__ __forceinline__ void Get(int it, int64_t i, float (&v)[N]) const {
    if constexpr (kHeld > 0) {
      Unpack(packs_[it], v);
    } else {
      LoadF<N>(row_ + i, v);
    }
  }

 private:
  const T* row_;
  Pack<T, N> packs_[kHeld > 0 ? kHeld : 1];
};

inline bool Aligned16(const Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0;
}

// ---- Online max / sum of exponentials ----

// The running max m of a set of values and s = sum(exp(v - m)) over it.
struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ void Add(MaxSum& a, float v) {
  if (v > a.m) {
    a.s = a.s * expf(a.m - v) + 1.0f;  // a.m = -inf: a.s = 0 * 0 + 1
    a.m = v;
  } else if (v != -INFINITY) {  // -inf adds exp(-inf) = 0 (and would make NaN against m = -inf)
    a.s += expf(v - a.m);
  }
}

// Symmetric in a and b, bit for bit (the products are rounded on their own, not
// fused into an FMA), so every lane of a butterfly gets the same result.
__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, __fmul_rn(a.s, expf(a.m - m)) + __fmul_rn(b.s, expf(b.m - m))};
}

__device__ __forceinline__ MaxSum WarpMaxSum(MaxSum a) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const MaxSum b{__shfl_xor_sync(kFullMask, a.m, o), __shfl_xor_sync(kFullMask, a.s, o)};
    a = Combine(a, b);
  }
  return a;
}

}  // namespace rows
}  // namespace cuda
}  // namespace tensor

#endif  // TENSOR_CUDA_ROWS_CUH_
