// CUDA kernels: cross-entropy fused with log-softmax (the language-model head's
// loss, V = 50257 for GPT-2).
//
// Three launches on the compute stream, then one read-back:
// 1. TargetStatsKernel (one block): counts the targets that are not
//    ignore_index, finds the first out-of-range one, and computes the gradient
//    scale grad_loss / count on the device (no host round trip before the
//    gradient is written).
// 2. CrossEntropyRowsKernel: one block per row (grid-stride over rows). The
//    forward reads the row once for an online max / sum of exponentials; the
//    backward writes (softmax - onehot) * scale in a second pass (llm.c's
//    fused classifier; in place over the logits for the fused op). Rows of
//    odd length are not 16-byte aligned, so each row is a scalar head up to
//    the first aligned element, 16-byte vectors, and a scalar tail.
// 3. LossSumKernel (one block): the per-row losses added in double in a fixed
//    order (deterministic), loss = total / count written on the device.
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/rows.cuh"
#include "tensor/cuda/loss.h"

namespace tensor {
namespace cuda {
namespace {

using namespace rows;  // NOLINT: the shared row helpers (rows.cuh)

// Over the block; every thread gets the same result. smem holds 2 * 32 floats.
__device__ __forceinline__ MaxSum BlockMaxSum(MaxSum a, float* smem) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  a = WarpMaxSum(a);
  __syncthreads();  // an earlier call's readers are done with smem
  if (lane == 0) {
    smem[warp] = a.m;
    smem[kWarp + warp] = a.s;
  }
  __syncthreads();
  const bool live = lane < blockDim.x / kWarp;
  a = {live ? smem[lane] : -INFINITY, live ? smem[kWarp + lane] : 0.0f};
  return WarpMaxSum(a);
}

// ---- Rows that are not 16-byte aligned ----

// Elements before the first 16-byte aligned one of p[0, n) (0 for N == 1).
template <int N, typename T>
__device__ __forceinline__ int64_t AlignedHead(const T* p, int64_t n) {
  if constexpr (N == 1) return 0;
  const int64_t off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 16 / sizeof(T));
  const int64_t head = off == 0 ? 0 : N - off;
  return head < n ? head : n;
}

// a += the N values: their max first, then one rescale and N independent
// exponentials (base 2: exp2f is a few instructions where expf is a dozen),
// so a thread's chain of dependent exponentials is one per N values, not N.
template <int N>
__device__ __forceinline__ void AddMany(MaxSum& a, const float (&v)[N]) {
  float mx = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) mx = fmaxf(mx, v[k]);
  if (mx == -INFINITY) return;  // all -inf: each adds exp(-inf) = 0
  if (mx > a.m) {
    a.s *= exp2f((a.m - mx) * kLog2e);  // a.m = -inf: a.s is 0 and stays 0
    a.m = mx;
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) {  // v = m adds 1 (also at m = +inf); NaN stays NaN
    sum += v[k] == a.m ? 1.0f : exp2f((v[k] - a.m) * kLog2e);
  }
  a.s += sum;
}

// a += row[0, n) for the elements this thread owns: a scalar head up to the
// first 16-byte aligned element, N-wide vectors, a scalar tail; the block
// covers the row. (Tried and dropped: loading 4 vectors before using any, in
// this pass and the gradient's, took gpt2's fused loss on the H200 from 1.38
// to 2.33 ms, at 1024 threads a block and 64 registers a thread.)
template <int N, typename T>
__device__ __forceinline__ void AddRow(MaxSum& a, const T* row, int64_t n) {
  const int64_t head = AlignedHead<N>(row, n);
  const int64_t body_end = head + (n - head) / N * N;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) Add(a, ToF(row[i]));
  for (int64_t i = head + int64_t{threadIdx.x} * N; i < body_end; i += int64_t{blockDim.x} * N) {
    float v[N];
    LoadF<N>(row + i, v);
    AddMany<N>(a, v);
  }
  for (int64_t i = body_end + threadIdx.x; i < n; i += blockDim.x) Add(a, ToF(row[i]));
}

// out[i] = f(i, row[i] as float) (or f(i, 0) without kRead) for i in [0, n).
// out may be row; out and row lie at the same address modulo 16 (or N == 1).
template <bool kRead, int N, typename T, typename F>
__device__ __forceinline__ void MapRow(const T* row, T* out, int64_t n, F&& f) {
  const int64_t head = AlignedHead<N>(out, n);
  const int64_t body_end = head + (n - head) / N * N;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) {
    out[i] = FromF<T>(f(i, kRead ? ToF(row[i]) : 0.0f));
  }
  for (int64_t i = head + int64_t{threadIdx.x} * N; i < body_end; i += int64_t{blockDim.x} * N) {
    float v[N];
    if constexpr (kRead) {
      LoadF<N>(row + i, v);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = f(i + k, v[k]);
    StoreF<N>(out + i, v);
  }
  for (int64_t i = body_end + threadIdx.x; i < n; i += blockDim.x) {
    out[i] = FromF<T>(f(i, kRead ? ToF(row[i]) : 0.0f));
  }
}

// ---- Cross-entropy kernels ----

// Device-side results, read back once at the end (kStatsWords 8-byte words).
struct Stats {
  double total;
  long long count;
  long long first_bad;  // -1: every target valid
  long long bad_value;
  float grad_scale;  // grad_loss / count, 0 when count is 0
  float unused;
};
constexpr int64_t kStatsWords = sizeof(Stats) / 8;
static_assert(sizeof(Stats) % 8 == 0, "Stats is allocated as 8-byte words");

constexpr int kStatThreads = 1024;  // the single-block kernels

enum Mode { kForward = 1, kBackward = 2, kBoth = 3 };

// One block: count, first out-of-range target, gradient scale.
template <typename I>
__global__ void __launch_bounds__(kStatThreads)
    TargetStatsKernel(const I* __restrict__ targets, int64_t rows, int64_t v, int64_t ignore_index,
                      float grad_loss, Stats* stats) {
  __shared__ long long s_count[kWarp];
  __shared__ long long s_bad[kWarp];
  long long count = 0, bad = LLONG_MAX;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) continue;
    if (t < 0 || t >= v) {
      bad = r < bad ? r : bad;
    } else {
      ++count;
    }
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    count += __shfl_xor_sync(kFullMask, count, o);
    const long long other = __shfl_xor_sync(kFullMask, bad, o);
    bad = other < bad ? other : bad;
  }
  if (lane == 0) {
    s_count[warp] = count;
    s_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    long long total_count = 0, first_bad = LLONG_MAX;
    for (int w = 0; w < blockDim.x / kWarp; ++w) {
      total_count += s_count[w];
      first_bad = s_bad[w] < first_bad ? s_bad[w] : first_bad;
    }
    stats->total = 0.0;
    stats->count = total_count;
    stats->first_bad = first_bad == LLONG_MAX ? -1 : first_bad;
    stats->bad_value = first_bad == LLONG_MAX ? 0 : static_cast<long long>(targets[first_bad]);
    stats->grad_scale =
        total_count == 0 ? 0.0f : static_cast<float>(static_cast<double>(grad_loss) / total_count);
    stats->unused = 0.0f;
  }
}

// One block per row. kForward: lse[r] and row_loss[r] = (max - x_t) + log(sum)
// (the CPU's formula: keeps the precision max + log(sum) would round away).
// kBackward: grad[r] = exp((x - shift) - log_sum) * scale, minus scale at the
// target, with (shift, log_sum) = (max, log(sum)) or (lse[r], 0).
template <int kMode, int N, typename T, typename I>
__global__ void __launch_bounds__(kMaxRowThreads)
    CrossEntropyRowsKernel(const T* logits, const I* __restrict__ targets, int64_t ignore_index,
                           float* __restrict__ lse, const Stats* __restrict__ stats, T* grad,
                           double* __restrict__ row_loss, int64_t rows, int64_t v,
                           int64_t ld, int64_t gld) {
  constexpr bool kFwd = (kMode & kForward) != 0;
  constexpr bool kBwd = (kMode & kBackward) != 0;
  __shared__ float smem[2 * kWarp];
  float gs = 0.0f;
  if constexpr (kBwd) {
    if (stats->first_bad >= 0) return;  // the op throws; leave the outputs alone
    gs = stats->grad_scale;
  }
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r]);  // the same in the whole block
    const T* xr = logits + r * ld;                       // (V)
    if (t == ignore_index || t < 0 || t >= v) {  // out of range: forward only, the op throws
      if constexpr (kFwd) {
        if (threadIdx.x == 0) {
          lse[r] = 0.0f;
          row_loss[r] = 0.0;
        }
      }
      if constexpr (kBwd)
        MapRow<false, N>(xr, grad + r * gld, v, [](int64_t, float) { return 0.0f; });
      continue;
    }
    float shift, log_sum;
    if constexpr (kFwd) {
      // Read before the reduction: in place, the row is overwritten after it.
      const float x_target = threadIdx.x == 0 ? ToF(xr[t]) : 0.0f;
      MaxSum ms{-INFINITY, 0.0f};
      AddRow<N>(ms, xr, v);
      ms = BlockMaxSum(ms, smem);
      shift = ms.m;
      log_sum = logf(ms.s);
      if (threadIdx.x == 0) {
        lse[r] = shift + log_sum;
        row_loss[r] = static_cast<double>(shift - x_target) + static_cast<double>(log_sum);
      }
    } else {
      shift = lse[r];
      log_sum = 0.0f;
    }
    if constexpr (kBwd) {
      // p = exp((x - shift) - log_sum) through exp2f (the differences first: a
      // row's max with log_sum 0, a single logit, gives exactly 1).
      MapRow<true, N>(xr, grad + r * gld, v, [&](int64_t i, float x) {
        const float p = __fmul_rn(exp2f(((x - shift) - log_sum) * kLog2e), gs);
        return i == t ? p - gs : p;
      });
    }
  }
}

// One block: total = sum of row_loss in a fixed order (per thread strided,
// then a fixed tree), in double; loss = total / count.
__global__ void __launch_bounds__(kStatThreads)
    LossSumKernel(const double* __restrict__ row_loss, int64_t rows, Stats* stats,
                  float* __restrict__ loss) {
  __shared__ double s_sum[kWarp];
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += row_loss[r];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(kFullMask, acc, o);
  if (lane == 0) s_sum[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < blockDim.x / kWarp; ++w) total += s_sum[w];
    stats->total = total;
    const long long count = stats->count;
    *loss = count == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(count));
  }
}

template <typename Fn>
void DispatchIndexType(const char* op, Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kI32:
      fn(int32_t{});
      return;
    case Dtype::kI64:
      fn(int64_t{});
      return;
    default:
      ThrowOpError(op, "index dtype ", DtypeName(dtype), " is not supported; expected i32 or i64");
  }
}

static_assert(kWarp == 32 && kMaxRowThreads == 1024,
              "ValidCrossEntropyRowThreads (loss.h) spells out the warp and the block limit");

// FSDP_CUDA_LOSS_ROW_THREADS as a row block's size (unset or empty: 0, the
// default); throws OpError naming the variable when it is not one.
int RowThreadsFromEnv() {
  const char* env = std::getenv("FSDP_CUDA_LOSS_ROW_THREADS");
  if (env == nullptr || env[0] == '\0') return 0;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || (v != 0 && !ValidCrossEntropyRowThreads(v))) {
    ThrowOpError("cross_entropy", "FSDP_CUDA_LOSS_ROW_THREADS='", env,
                 "' must be 0 (the default) or a multiple of 32 in [32, 1024]");
  }
  return static_cast<int>(v);
}

// The threads a row's block is given (0: RowThreads' choice). Read from the
// environment at its first use; a throw there leaves it unset, so each call
// says so again.
std::atomic<int>& RowThreadsSetting() {
  static std::atomic<int> threads{RowThreadsFromEnv()};
  return threads;
}

// Threads per row block: the setting, or about 4 loads a thread, 128 to 1024.
unsigned RowThreads(int64_t v, int vec) {
  const int setting = RowThreadsSetting().load(std::memory_order_relaxed);
  if (setting > 0) return static_cast<unsigned>(setting);
  const int64_t loads = (v + vec - 1) / vec;
  int64_t threads = ((loads + 3) / 4 + kWarp - 1) / kWarp * kWarp;
  threads = threads < 128 ? 128 : (threads > kMaxRowThreads ? kMaxRowThreads : threads);
  return static_cast<unsigned>(threads);
}

template <int kMode>
CrossEntropyStats Run(const char* op, const Tensor& logits, const Tensor& targets,
                      int64_t ignore_index, float grad_loss, const Tensor& lse, const Tensor& loss,
                      const Tensor& grad) {
  constexpr bool kFwd = (kMode & kForward) != 0;
  constexpr bool kBwd = (kMode & kBackward) != 0;
  SetDevice(logits, op);
  const int64_t v = logits.dim(-1);
  const int64_t rows = v == 0 ? 0 : logits.numel() / v;
  // Rows may be padded (a view of a wider buffer): their strides.
  const int64_t ld = logits.RowStride();
  const int64_t gld = kBwd ? grad.RowStride() : ld;
  OP_CHECK(ld >= 0 && gld >= 0, op, "logits and their gradient must be stacked rows (contiguous "
           "or row-padded); got strides of shape ", logits.shape().ToString());
  const cudaStream_t stream = ComputeStream();
  // Scratch: the Stats words and, for the forward, one double per row (8-byte
  // words: the tensor library has no f64 dtype).
  const Tensor stats_buf = Tensor::Empty({kStatsWords}, Dtype::kI64, logits.device());
  Stats* stats = static_cast<Stats*>(stats_buf.raw_data());
  const Tensor row_loss =
      kFwd && rows > 0 ? Tensor::Empty({rows}, Dtype::kI64, logits.device()) : Tensor();
  double* row_loss_p = row_loss.defined() ? static_cast<double*>(row_loss.raw_data()) : nullptr;
  DispatchIndexType(op, targets.dtype(), [&](auto iz) {
    using I = decltype(iz);
    const I* t = rows > 0 ? Ptr<I>(targets) : nullptr;
    TargetStatsKernel<I>
        <<<1, kStatThreads, 0, stream>>>(t, rows, v, ignore_index, grad_loss, stats);
    CheckLaunch(op);
    if (rows == 0) return;
    DispatchFloat(logits.dtype(), op, [&](auto tz) {
      using T = decltype(tz);
      constexpr int kVec = 16 / sizeof(T);
      // Vector accesses need every gradient row to share its logits row's
      // alignment: the same start modulo 16 bytes and row strides that keep it.
      const bool vec = !kBwd || (reinterpret_cast<uintptr_t>(logits.raw_data()) % 16 ==
                                     reinterpret_cast<uintptr_t>(grad.raw_data()) % 16 &&
                                 (ld - gld) * static_cast<int64_t>(sizeof(T)) % 16 == 0);
      const unsigned grid = static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
      const unsigned block = RowThreads(v, vec ? kVec : 1);
      float* lse_p = Ptr<float>(lse);
      T* grad_p = kBwd ? Ptr<T>(grad) : nullptr;
      if (vec) {
        CrossEntropyRowsKernel<kMode, kVec, T, I><<<grid, block, 0, stream>>>(
            Ptr<T>(logits), t, ignore_index, lse_p, stats, grad_p, row_loss_p, rows, v, ld, gld);
      } else {
        CrossEntropyRowsKernel<kMode, 1, T, I><<<grid, block, 0, stream>>>(
            Ptr<T>(logits), t, ignore_index, lse_p, stats, grad_p, row_loss_p, rows, v, ld, gld);
      }
      CheckLaunch(op);
    });
  });
  if constexpr (kFwd) {
    LossSumKernel<<<1, kStatThreads, 0, stream>>>(row_loss_p, rows, stats, Ptr<float>(loss));
    CheckLaunch(op);
  }
  Stats host;
  CheckCuda(cudaMemcpyAsync(&host, stats, sizeof(Stats), cudaMemcpyDeviceToHost, stream), op,
            "reading back the loss statistics");
  WaitForComputeStream(op, "cross-entropy kernels");
  CrossEntropyStats out;
  out.total = host.total;
  out.count = host.count;
  out.first_bad = host.first_bad;
  out.bad_target = host.bad_value;
  return out;
}

}  // namespace

CrossEntropyStats CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                      int64_t ignore_index, const Tensor& lse, const Tensor& loss) {
  return Run<kForward>("cross_entropy", logits, targets, ignore_index, 0.0f, lse, loss, Tensor());
}

CrossEntropyStats CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                       const Tensor& lse, int64_t ignore_index, float grad_loss,
                                       const Tensor& grad_logits) {
  return Run<kBackward>("cross_entropy_backward", logits, targets, ignore_index, grad_loss, lse,
                        Tensor(), grad_logits);
}

CrossEntropyStats CrossEntropyForwardBackwardInPlace(const Tensor& logits, const Tensor& targets,
                                                     int64_t ignore_index, float grad_loss,
                                                     const Tensor& lse, const Tensor& loss) {
  return Run<kBoth>("cross_entropy", logits, targets, ignore_index, grad_loss, lse, loss, logits);
}

void SetCrossEntropyRowThreads(int threads) {
  OP_CHECK(threads == 0 || ValidCrossEntropyRowThreads(threads), "cross_entropy",
           "row threads must be 0 (the default) or a multiple of 32 in [32, 1024]; got ", threads);
  RowThreadsSetting().store(threads);
}

int CrossEntropyRowThreads() { return RowThreadsSetting().load(std::memory_order_relaxed); }

int CrossEntropyBlockThreads(int64_t v, int per_load) {
  OP_CHECK(v >= 0 && per_load >= 1, "cross_entropy", "rows of ", v, " elements loaded ", per_load,
           " at a time");
  return static_cast<int>(RowThreads(v, per_load));
}

}  // namespace cuda
}  // namespace tensor
