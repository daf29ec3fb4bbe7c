// CUDA reduction kernels over contiguous (outer, reduce, inner) blocks.
//
// Sums (double accumulators, no atomics):
// - inner == 1 (row sums): one warp per chunk of kRowChunk elements of a row,
//   lanes strided over the chunk, then a shuffle tree;
// - 1 < inner < 32 (column sums of narrow rows): one thread per (outer, row
//   chunk, column), the threads of a warp on adjacent columns (coalesced),
//   rows summed in order;
// - inner >= 32 (column sums, e.g. bias gradients): a block per (column tile,
//   row chunk), 16-byte loads when the rows allow, its warps on interleaved
//   rows, their sums added in order through shared memory.
// A reduction that needs one chunk stores its result directly; otherwise the
// chunk partials go to a scratch buffer (a device tensor, seen by the memory
// ledger) and a second kernel adds them, one warp per output. Chunk counts
// depend only on the shape, so results are reproducible bit for bit.
//
// Max: the same warp-per-chunk scheme for rows, thread per column otherwise;
// ties go to the smallest index, NaN is the largest value (as on the CPU).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/reduce.h"
#include "tensor/cuda/rows.cuh"

namespace tensor {
namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr int64_t kRowChunk = 4096;          // elements per warp (row sums)
constexpr int64_t kTargetThreads = 1 << 17;  // column sums: split rows below this many
constexpr int64_t kMinChunkRows = 16;        // column sums: rows per chunk at least
constexpr unsigned kFullMask = 0xffffffffu;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of kThreads for `warps` warps (grid-stride loops cover the rest).
unsigned WarpBlocks(int64_t warps) { return Blocks(warps * kWarp); }

__device__ __forceinline__ int64_t GlobalThread() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t ThreadCount() { return int64_t{gridDim.x} * blockDim.x; }
__device__ __forceinline__ int64_t GlobalWarp() { return GlobalThread() / kWarp; }
__device__ __forceinline__ int64_t WarpCount() { return ThreadCount() / kWarp; }

__device__ __forceinline__ double WarpSum(double v) {
#pragma unroll
  for (int s = kWarp / 2; s > 0; s >>= 1) v += __shfl_down_sync(kFullMask, v, s);
  return v;  // lane 0 holds the sum
}

// ---------------------------------------------------------------------------
// Where a sum goes.
// ---------------------------------------------------------------------------

// Final output k: scale * sum (+ out[k] when accumulate), rounded once to TO
// through float, as the CPU's StoreSum (no fused multiply-add).
template <typename TO>
struct SumStore {
  TO* out;
  double scale;
  bool accumulate;
  __device__ void operator()(int64_t k, double sum) const {
    double v = __dmul_rn(scale, sum);
    if (accumulate) v = __dadd_rn(v, static_cast<double>(ToF(out[k])));
    out[k] = FromF<TO>(static_cast<float>(v));
  }
};

// A partial (or SumSquares' result): the double itself.
struct DoubleStore {
  double* out;
  __device__ void operator()(int64_t k, double sum) const { out[k] = sum; }
};

// ---------------------------------------------------------------------------
// Sum kernels.
// ---------------------------------------------------------------------------

// Warp w = (row o, chunk c) of `chunks` per row: store(w, sum of x[o, chunk c]),
// squared when kSquare.
template <bool kSquare, typename TI, typename Store>
__global__ void RowChunkSumKernel(const TI* x, int64_t rows, int64_t n, int64_t chunks,
                                  Store store) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = rows * chunks;
  for (int64_t w = GlobalWarp(); w < warps; w += WarpCount()) {  // uniform per warp
    const int64_t o = w / chunks, c = w % chunks;
    const int64_t begin = c * kRowChunk;
    const int64_t end = begin + kRowChunk < n ? begin + kRowChunk : n;
    const TI* row = x + o * n;
    double acc = 0;
    for (int64_t j = begin + lane; j < end; j += kWarp) {
      const double v = ToF(row[j]);
      acc += kSquare ? v * v : v;
    }
    acc = WarpSum(acc);
    if (lane == 0) store(w, acc);
  }
}

// Thread t = ((o * chunks + c) * inner + i): store(t, sum over the rows of
// chunk c of column i of x[o]).
template <typename TI, typename Store>
__global__ void ColChunkSumKernel(const TI* x, int64_t outer, int64_t reduce, int64_t inner,
                                  int64_t rows_per_chunk, int64_t chunks, Store store) {
  const int64_t total = outer * chunks * inner;
  for (int64_t t = GlobalThread(); t < total; t += ThreadCount()) {
    const int64_t i = t % inner, rest = t / inner;
    const int64_t c = rest % chunks, o = rest / chunks;
    const int64_t r0 = c * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < reduce ? r0 + rows_per_chunk : reduce;
    const TI* p = x + (o * reduce + r0) * inner + i;
    double acc = 0;
    for (int64_t r = r0; r < r1; ++r, p += inner) acc += ToF(*p);
    store(t, acc);
  }
}

// Column sums of rows at least kTileCols wide (a Linear layer's bias
// gradient: x (tokens, C)): block (column tile, chunk) = kTileCols column
// vectors of kVec columns (one 16-byte load each when kVec > 1: a warp reads
// 32 x 16 contiguous bytes of a row) x kRowLanes row lanes. Lane ty adds rows
// r0 + ty, r0 + ty + kRowLanes, ... of the chunk in order; the lanes are then
// added in order through shared memory and store((o * chunks + c) * inner + i,
// sum) runs for each column i of the tile. The order does not depend on kVec:
// the packed and the one-column kernels give the same bits.
constexpr int kTileCols = 32;                   // column vectors per block (a warp's width)
constexpr int kRowLanes = kThreads / kTileCols;  // warps per block, each on its own rows
template <int kVec, typename TI, typename Store>
__global__ void __launch_bounds__(kThreads)
    ColTileSumKernel(const TI* __restrict__ x, int64_t outer, int64_t reduce, int64_t inner,
                     int64_t rows_per_chunk, int64_t chunks, Store store) {
  constexpr int kWidth = kTileCols * kVec;  // columns per block
  __shared__ double lanes[kRowLanes][kWidth];
  const int tx = threadIdx.x % kTileCols, ty = threadIdx.x / kTileCols;
  const int64_t tile = int64_t{blockIdx.x} * kWidth;
  const int64_t col = tile + int64_t{tx} * kVec;  // this thread's first column
  for (int64_t oc = blockIdx.y; oc < outer * chunks; oc += gridDim.y) {  // uniform per block
    const int64_t o = oc / chunks, c = oc % chunks;
    const int64_t r0 = c * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < reduce ? r0 + rows_per_chunk : reduce;
    double acc[kVec] = {};
    if (col < inner) {  // kVec > 1 only when inner % kVec == 0: the whole vector is in
      const TI* p = x + (o * reduce + r0 + ty) * inner + col;
#pragma unroll 4
      for (int64_t r = r0 + ty; r < r1; r += kRowLanes, p += kRowLanes * inner) {
        float v[kVec];
        rows::LoadF<kVec>(p, v);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) lanes[ty][tx * kVec + k] = acc[k];
    __syncthreads();
    for (int j = threadIdx.x; j < kWidth; j += kThreads) {
      if (tile + j < inner) {
        double sum = 0;
#pragma unroll
        for (int k = 0; k < kRowLanes; ++k) sum += lanes[k][j];
        store(oc * inner + tile + j, sum);
      }
    }
    __syncthreads();  // lanes is rewritten by the next (o, c)
  }
}

// Output k = o * inner + i (one warp each): the sum of partial[(o * chunks + c)
// * inner + i] over c, lanes strided over c, then the shuffle tree.
template <typename Store>
__global__ void FinalizeSumKernel(const double* partial, int64_t outputs, int64_t chunks,
                                  int64_t inner, Store store) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t k = GlobalWarp(); k < outputs; k += WarpCount()) {
    const int64_t o = k / inner, i = k % inner;
    const double* p = partial + o * chunks * inner + i;
    double acc = 0;
    for (int64_t c = lane; c < chunks; c += kWarp) acc += p[c * inner];
    acc = WarpSum(acc);
    if (lane == 0) store(k, acc);
  }
}

// Empty sums (reduce == 0): store(k, 0) for every output.
template <typename Store>
__global__ void EmptySumKernel(int64_t outputs, Store store) {
  for (int64_t k = GlobalThread(); k < outputs; k += ThreadCount()) store(k, 0.0);
}

// 8-byte scratch slots on x's device, charged to the ledger as temporaries.
double* Scratch(const Tensor& like, int64_t count, Tensor* holder) {
  *holder = Tensor::Empty({count}, Dtype::kI64, like.device());
  return static_cast<double*>(holder->raw_data());
}

// launch(store) when one chunk covers each output; otherwise launch(partials)
// into outputs * chunks scratch slots (output o * inner + i's chunk c at
// (o * chunks + c) * inner + i) and FinalizeSumKernel adds them into `store`.
template <typename Store, typename Launch>
void SumInChunks(const Tensor& x, int64_t outputs, int64_t chunks, int64_t inner,
                 const Store& store, const Launch& launch) {
  if (chunks == 1) {
    launch(store);
    return;
  }
  Tensor scratch;
  double* partial = Scratch(x, outputs * chunks, &scratch);
  launch(DoubleStore{partial});
  FinalizeSumKernel<<<WarpBlocks(outputs), kThreads, 0, ComputeStream()>>>(partial, outputs, chunks,
                                                                           inner, store);
}

// Row sums (inner == 1) of x (rows, n) into `store` (squared when kSquare).
template <bool kSquare, typename TI, typename Store>
void RowSums(const Tensor& x, const TI* px, int64_t rows, int64_t n, const Store& store) {
  const int64_t chunks = n > kRowChunk ? CeilDiv(n, kRowChunk) : 1;
  SumInChunks(x, rows, chunks, 1, store, [&](const auto& to) {
    RowChunkSumKernel<kSquare>
        <<<WarpBlocks(rows * chunks), kThreads, 0, ComputeStream()>>>(px, rows, n, chunks, to);
  });
}

// Column sums through ColTileSumKernel (inner >= kTileCols): chunks of at
// least kTileMinRows rows, about kTileTargetValues partials in all (2 MiB),
// so gpt2's (16384, 768) bias gradients run 768 blocks of 64 rows.
constexpr int64_t kTileMinRows = 64;
constexpr int64_t kTileTargetValues = int64_t{1} << 18;
constexpr unsigned kMaxGridY = 65535;
template <typename TI, typename Store>
void ColTileSums(const Tensor& x, const TI* px, int64_t outer, int64_t reduce, int64_t inner,
                 const Store& store) {
  const int64_t outputs = outer * inner;
  int64_t chunks = std::min(CeilDiv(kTileTargetValues, outputs), CeilDiv(reduce, kTileMinRows));
  if (chunks < 1) chunks = 1;
  const int64_t rows_per_chunk = CeilDiv(reduce, chunks);
  chunks = CeilDiv(reduce, rows_per_chunk);
  constexpr int kVec = 16 / sizeof(TI);
  const bool packed = inner % kVec == 0 && reinterpret_cast<uintptr_t>(px) % 16 == 0;
  const int64_t width = packed ? kTileCols * kVec : kTileCols;
  const dim3 grid(static_cast<unsigned>(CeilDiv(inner, width)),
                  static_cast<unsigned>(std::min<int64_t>(outer * chunks, kMaxGridY)));
  SumInChunks(x, outputs, chunks, inner, store, [&](const auto& to) {
    if (packed) {
      ColTileSumKernel<kVec><<<grid, kThreads, 0, ComputeStream()>>>(px, outer, reduce, inner,
                                                                     rows_per_chunk, chunks, to);
    } else {
      ColTileSumKernel<1><<<grid, kThreads, 0, ComputeStream()>>>(px, outer, reduce, inner,
                                                                  rows_per_chunk, chunks, to);
    }
  });
}

template <typename TI, typename Store>
void ColSums(const Tensor& x, const TI* px, int64_t outer, int64_t reduce, int64_t inner,
             const Store& store) {
  if (inner >= kTileCols) {
    ColTileSums(x, px, outer, reduce, inner, store);
    return;
  }
  const int64_t outputs = outer * inner;
  int64_t chunks = 1;
  if (outputs < kTargetThreads) {
    chunks = CeilDiv(kTargetThreads, outputs);
    const int64_t most = CeilDiv(reduce, kMinChunkRows);
    if (chunks > most) chunks = most;
    if (chunks < 1) chunks = 1;
  }
  const int64_t rows_per_chunk = CeilDiv(reduce, chunks);
  chunks = CeilDiv(reduce, rows_per_chunk);
  SumInChunks(x, outputs, chunks, inner, store, [&](const auto& to) {
    ColChunkSumKernel<<<Blocks(outputs * chunks), kThreads, 0, ComputeStream()>>>(
        px, outer, reduce, inner, rows_per_chunk, chunks, to);
  });
}

// ---------------------------------------------------------------------------
// Max kernels.
// ---------------------------------------------------------------------------

__device__ __forceinline__ bool Beats(float v, float best) {
  return v > best || (isnan(v) && !isnan(best));
}

// (v, i) should replace (bv, bi): a larger value, NaN over a number, or an
// equal value (or both NaN) at a smaller index. A total order, so any
// combination tree gives the CPU's answer: the first index of the max.
__device__ __forceinline__ bool Better(float v, int64_t i, float bv, int64_t bi) {
  if (Beats(v, bv)) return true;
  if (Beats(bv, v)) return false;
  return i < bi;
}

__device__ __forceinline__ void WarpMax(float* v, int64_t* i) {
#pragma unroll
  for (int s = kWarp / 2; s > 0; s >>= 1) {
    const float ov = __shfl_down_sync(kFullMask, *v, s);
    const int64_t oi = __shfl_down_sync(kFullMask, *i, s);
    if (Better(ov, oi, *v, *i)) {
      *v = ov;
      *i = oi;
    }
  }
}

constexpr int64_t kNoIndex = std::numeric_limits<int64_t>::max();

// Where a (max, index) pair goes: the final outputs, or chunk partials.
template <typename T>
struct MaxStore {
  T* values;
  int64_t* indices;
  __device__ void operator()(int64_t k, float v, int64_t i) const {
    values[k] = FromF<T>(v);
    indices[k] = i;
  }
};
struct MaxPartialStore {
  float* values;
  int64_t* indices;
  __device__ void operator()(int64_t k, float v, int64_t i) const {
    values[k] = v;
    indices[k] = i;
  }
};

// Warp w = (row o, chunk c): the max of the chunk and its index in the row.
template <typename T, typename Store>
__global__ void RowChunkMaxKernel(const T* x, int64_t rows, int64_t n, int64_t chunks,
                                  Store store) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = rows * chunks;
  for (int64_t w = GlobalWarp(); w < warps; w += WarpCount()) {
    const int64_t o = w / chunks, c = w % chunks;
    const int64_t begin = c * kRowChunk;
    const int64_t end = begin + kRowChunk < n ? begin + kRowChunk : n;
    const T* row = x + o * n;
    float best = -INFINITY;
    int64_t idx = kNoIndex;
    for (int64_t j = begin + lane; j < end; j += kWarp) {
      const float v = ToF(row[j]);
      if (Better(v, j, best, idx)) {
        best = v;
        idx = j;
      }
    }
    WarpMax(&best, &idx);
    if (lane == 0) store(w, best, idx);
  }
}

// Output o (one warp each): the best of its `chunks` partials.
template <typename Store>
__global__ void FinalizeMaxKernel(const float* values, const int64_t* indices, int64_t rows,
                                  int64_t chunks, Store store) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t o = GlobalWarp(); o < rows; o += WarpCount()) {
    float best = -INFINITY;
    int64_t idx = kNoIndex;
    for (int64_t c = lane; c < chunks; c += kWarp) {
      const float v = values[o * chunks + c];
      const int64_t i = indices[o * chunks + c];
      if (Better(v, i, best, idx)) {
        best = v;
        idx = i;
      }
    }
    WarpMax(&best, &idx);
    if (lane == 0) store(o, best, idx);
  }
}

// Column maxima (inner > 1): thread per (o, i), rows scanned in order.
template <typename T>
__global__ void ColMaxKernel(const T* x, int64_t outer, int64_t reduce, int64_t inner, T* values,
                             int64_t* indices) {
  const int64_t total = outer * inner;
  for (int64_t t = GlobalThread(); t < total; t += ThreadCount()) {
    const int64_t o = t / inner, i = t % inner;
    const T* p = x + o * reduce * inner + i;
    float best = ToF(p[0]);
    int64_t idx = 0;
    for (int64_t r = 1; r < reduce; ++r) {
      const float v = ToF(p[r * inner]);
      if (Beats(v, best)) {
        best = v;
        idx = r;
      }
    }
    values[t] = FromF<T>(best);
    indices[t] = idx;
  }
}

// ---------------------------------------------------------------------------
// Backward kernels.
// ---------------------------------------------------------------------------

template <typename TI, typename TO>
__global__ void BroadcastDimKernel(const TI* grad_out, int64_t reduce, int64_t inner, float scale,
                                   TO* grad_in, int64_t total) {
  for (int64_t e = GlobalThread(); e < total; e += ThreadCount()) {
    const int64_t i = e % inner, o = e / (reduce * inner);
    grad_in[e] = FromF<TO>(__fmul_rn(scale, ToF(grad_out[o * inner + i])));
  }
}

// grad_in (zeroed before) at the argmax positions; the first position t whose
// index is out of range is recorded in *bad (atomicMin).
template <typename TI, typename TO>
__global__ void ScatterDimKernel(const TI* grad_out, const int64_t* indices, int64_t reduce,
                                 int64_t inner, TO* grad_in, int64_t total,
                                 unsigned long long* bad) {
  for (int64_t t = GlobalThread(); t < total; t += ThreadCount()) {
    const int64_t r = indices[t];
    if (r < 0 || r >= reduce) {
      atomicMin(bad, static_cast<unsigned long long>(t));
      continue;
    }
    const int64_t o = t / inner, i = t % inner;
    grad_in[(o * reduce + r) * inner + i] = FromF<TO>(ToF(grad_out[t]));
  }
}

template <typename Fn>
void DispatchPair(const char* op, Dtype in, Dtype out, Fn&& fn) {
  DispatchFloat(in, op, [&](auto in_zero) {
    DispatchFloat(out, op, [&](auto out_zero) { fn(in_zero, out_zero); });
  });
}

template <typename T>
void CopyToHost(T* host, const void* device, const char* op) {
  CheckCuda(cudaMemcpyAsync(host, device, sizeof(T), cudaMemcpyDeviceToHost, ComputeStream()), op,
            "cudaMemcpyAsync");
  WaitForComputeStream(op, "cudaStreamSynchronize");
}

}  // namespace

void SumDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, double scale,
            bool accumulate, const Tensor& out) {
  const char* op = "sum";
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  SetDevice(x, op);
  DispatchPair(op, x.dtype(), out.dtype(), [&](auto in_zero, auto out_zero) {
    using TI = decltype(in_zero);
    using TO = decltype(out_zero);
    const TI* px = Ptr<TI>(x);
    const SumStore<TO> store{Ptr<TO>(out), scale, accumulate};
    if (reduce == 0) {  // empty sums: 0 (times scale: NaN for the mean of nothing)
      EmptySumKernel<<<Blocks(outputs), kThreads, 0, ComputeStream()>>>(outputs, store);
    } else if (inner == 1) {
      RowSums</*kSquare=*/false>(x, px, outer, reduce, store);
    } else {
      ColSums(x, px, outer, reduce, inner, store);
    }
  });
  CheckLaunch(op);
}

void MaxDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, const Tensor& values,
            const Tensor& indices) {
  const char* op = "max";
  OP_CHECK(reduce > 0, op, "cannot take the max over an empty dimension");
  if (outer * inner == 0) return;
  SetDevice(x, op);
  DispatchFloat(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* px = Ptr<T>(x);
    T* pv = Ptr<T>(values);
    int64_t* pi = Ptr<int64_t>(indices);
    if (inner > 1) {
      ColMaxKernel<<<Blocks(outer * inner), kThreads, 0, ComputeStream()>>>(px, outer, reduce,
                                                                            inner, pv, pi);
      return;
    }
    const int64_t chunks = reduce > kRowChunk ? CeilDiv(reduce, kRowChunk) : 1;
    if (chunks == 1) {
      RowChunkMaxKernel<<<WarpBlocks(outer), kThreads, 0, ComputeStream()>>>(px, outer, reduce, 1,
                                                                             MaxStore<T>{pv, pi});
      return;
    }
    Tensor scratch_v = Tensor::Empty({outer * chunks}, Dtype::kF32, x.device());
    Tensor scratch_i = Tensor::Empty({outer * chunks}, Dtype::kI64, x.device());
    const MaxPartialStore partial{Ptr<float>(scratch_v), Ptr<int64_t>(scratch_i)};
    RowChunkMaxKernel<<<WarpBlocks(outer * chunks), kThreads, 0, ComputeStream()>>>(
        px, outer, reduce, chunks, partial);
    FinalizeMaxKernel<<<WarpBlocks(outer), kThreads, 0, ComputeStream()>>>(
        partial.values, partial.indices, outer, chunks, MaxStore<T>{pv, pi});
  });
  CheckLaunch(op);
}

void BroadcastDim(const Tensor& grad_out, int64_t outer, int64_t reduce, int64_t inner,
                  double scale, const Tensor& grad_in) {
  const char* op = "sum_backward";
  const int64_t total = outer * reduce * inner;
  if (total == 0) return;
  SetDevice(grad_in, op);
  DispatchPair(op, grad_out.dtype(), grad_in.dtype(), [&](auto in_zero, auto out_zero) {
    using TI = decltype(in_zero);
    using TO = decltype(out_zero);
    BroadcastDimKernel<<<Blocks(total), kThreads, 0, ComputeStream()>>>(
        Ptr<TI>(grad_out), reduce, inner, static_cast<float>(scale), Ptr<TO>(grad_in), total);
  });
  CheckLaunch(op);
}

void ScatterDim(const Tensor& grad_out, const Tensor& indices, int64_t outer, int64_t reduce,
                int64_t inner, const Tensor& grad_in) {
  const char* op = "max_backward";
  SetDevice(grad_in, op);
  if (grad_in.numel() > 0) {
    CheckCuda(cudaMemsetAsync(grad_in.raw_data(), 0, grad_in.nbytes(), ComputeStream()), op,
              "cudaMemsetAsync");  // all-zero bits: +0 in every floating dtype
  }
  const int64_t total = outer * inner;
  if (total == 0) return;
  Tensor flag = Tensor::Empty({1}, Dtype::kI64, grad_in.device());
  auto* bad = static_cast<unsigned long long*>(flag.raw_data());
  constexpr unsigned long long kNone = 0x7f7f7f7f7f7f7f7full;  // memset 0x7f: above any position
  CheckCuda(cudaMemsetAsync(bad, 0x7f, sizeof(*bad), ComputeStream()), op, "cudaMemsetAsync");
  DispatchPair(op, grad_out.dtype(), grad_in.dtype(), [&](auto in_zero, auto out_zero) {
    using TI = decltype(in_zero);
    using TO = decltype(out_zero);
    ScatterDimKernel<<<Blocks(total), kThreads, 0, ComputeStream()>>>(
        Ptr<TI>(grad_out), Ptr<int64_t>(indices), reduce, inner, Ptr<TO>(grad_in), total, bad);
  });
  CheckLaunch(op);
  unsigned long long first_bad = kNone;
  CopyToHost(&first_bad, bad, op);
  if (first_bad != kNone) {
    int64_t r = 0;
    CopyToHost(&r, Ptr<int64_t>(indices) + first_bad, op);
    ThrowOpError(op, "index ", r, " out of range for a dimension of size ", reduce);
  }
}

double SumSquares(const Tensor& x) {
  const char* op = "sum_squares";
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  SetDevice(x, op);
  Tensor result_holder;
  double* result = Scratch(x, 1, &result_holder);
  DispatchFloat(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    RowSums</*kSquare=*/true>(x, Ptr<T>(x), 1, n, DoubleStore{result});
  });
  CheckLaunch(op);
  double host = 0;
  CopyToHost(&host, result, op);
  return host;
}

}  // namespace cuda
}  // namespace tensor
