// CUDA kernels: BatchNorm over the channels of a contiguous (N, C, L) f32
// tensor ((N, C) is L = 1), forward and backward.
//
// Per-channel sums (the forward's statistics, the backward's sum(g) and
// sum(g (x - mean))) in two kernels: a partial-sum kernel over a grid of
// (channels) x (fixed chunks of each channel's N * L values) accumulating in
// double, then a per-channel kernel that adds the chunks in order and derives
// the per-channel results. Deterministic: the order depends only on the shapes.
// The forward's sums are of x - x[0, c, 0] (a shift inside the channel's
// range), so the one-pass variance does not cancel when |mean| >> spread.
// Layouts: L > 1, a block per (channel, chunk) walking the channel's rows of
// L; L = 1, a block per (32 channels, chunk of rows), so loads coalesce.
//
// The elementwise passes (y, grad_x) are grid-stride loops over the tensor
// that track each element's channel without a division per element.
#include "tensor/cuda/batch_norm.h"
#include "tensor/cuda/common.cuh"

namespace tensor {
namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kColTile = 32;  // channels per block of the L = 1 partial kernel
constexpr int kRowLanes = kThreads / kColTile;
constexpr int64_t kTargetBlocks = 1024;       // partial-sum blocks to aim for
constexpr int64_t kMinValuesPerBlock = 2048;  // ... each summing at least this many values

// acc += the forward's (x - shift, (x - shift)^2) or the backward's
// (g, g (x - mean)); `ref` is the shift or the mean.
template <bool kBackward>
__device__ __forceinline__ void Accumulate(float x, float g, double ref, double (&acc)[2]) {
  if constexpr (kBackward) {
    acc[0] += g;
    acc[1] += g * (static_cast<double>(x) - ref);
  } else {
    const double d = static_cast<double>(x) - ref;
    acc[0] += d;
    acc[1] += d * d;
  }
}

// ref of channel ch: x[0, ch, 0] (forward) or mean[ch] (backward).
template <bool kBackward>
__device__ __forceinline__ double Ref(const float* x, const float* mean, int64_t ch, int64_t l) {
  return kBackward ? static_cast<double>(mean[ch]) : static_cast<double>(x[ch * l]);
}

// part (C, chunks, 2): the sums of chunk blockIdx.y of channel blockIdx.x,
// whose values j = n * L + i (row n, position i) lie in [j0, j1).
template <bool kBackward>
__global__ void __launch_bounds__(kThreads)
    ChannelPartialKernel(const float* __restrict__ x, const float* __restrict__ g,
                         const float* __restrict__ mean, double* __restrict__ part, int64_t n,
                         int64_t c, int64_t l, int64_t per_chunk) {
  __shared__ double smem[2][kThreads / kWarp];
  const int64_t ch = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t m = n * l;
  const int64_t j0 = chunk * per_chunk;
  const int64_t j1 = j0 + per_chunk < m ? j0 + per_chunk : m;
  const double ref = Ref<kBackward>(x, mean, ch, l);
  double acc[2] = {0.0, 0.0};
  const int64_t step = blockDim.x, dn = step / l, di = step % l;
  int64_t j = j0 + threadIdx.x, row = j / l, i = j % l;
  for (; j < j1; j += step) {
    const int64_t off = (row * c + ch) * l + i;
    Accumulate<kBackward>(x[off], kBackward ? g[off] : 0.0f, ref, acc);
    row += dn;
    i += di;
    if (i >= l) {
      i -= l;
      ++row;
    }
  }
  // Block sum: warp butterflies, then the warps in order.
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
    acc[1] += __shfl_xor_sync(0xffffffffu, acc[1], o);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    smem[0][warp] = acc[0];
    smem[1][warp] = acc[1];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s0 = 0.0, s1 = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) {
      s0 += smem[0][w];
      s1 += smem[1][w];
    }
    part[(ch * chunks + chunk) * 2] = s0;
    part[(ch * chunks + chunk) * 2 + 1] = s1;
  }
}

// L = 1: part (C, chunks, 2) for kColTile channels (a warp reads one row's
// consecutive channels) x a chunk of rows; kRowLanes row lanes per block,
// added in order.
template <bool kBackward>
__global__ void __launch_bounds__(kThreads)
    ColumnPartialKernel(const float* __restrict__ x, const float* __restrict__ g,
                        const float* __restrict__ mean, double* __restrict__ part, int64_t n,
                        int64_t c, int64_t per_chunk) {
  __shared__ double smem[2][kRowLanes][kColTile];
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const int64_t ch = int64_t{blockIdx.x} * kColTile + tx;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = chunk * per_chunk;
  const int64_t r1 = r0 + per_chunk < n ? r0 + per_chunk : n;
  double acc[2] = {0.0, 0.0};
  if (ch < c) {
    const double ref = Ref<kBackward>(x, mean, ch, 1);
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      Accumulate<kBackward>(x[r * c + ch], kBackward ? g[r * c + ch] : 0.0f, ref, acc);
    }
  }
  smem[0][ty][tx] = acc[0];
  smem[1][ty][tx] = acc[1];
  __syncthreads();
  if (ty == 0 && ch < c) {
    double s0 = 0.0, s1 = 0.0;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) {
      s0 += smem[0][k][tx];
      s1 += smem[1][k][tx];
    }
    part[(ch * chunks + chunk) * 2] = s0;
    part[(ch * chunks + chunk) * 2 + 1] = s1;
  }
}

// The chunks of channel ch added in order.
__device__ __forceinline__ void ChannelSums(const double* part, int64_t ch, int64_t chunks,
                                            double (&s)[2]) {
  s[0] = s[1] = 0.0;
  for (int64_t k = 0; k < chunks; ++k) {
    s[0] += part[(ch * chunks + k) * 2];
    s[1] += part[(ch * chunks + k) * 2 + 1];
  }
}

// Training: mean, rstd from the batch; running stats and the counter updated
// when given (running_mean null: not updated).
__global__ void BatchStatsKernel(const double* __restrict__ part, int64_t chunks,
                                 const float* __restrict__ x, int64_t c, int64_t l, int64_t m,
                                 float eps, float momentum, float* __restrict__ mean,
                                 float* __restrict__ rstd, float* __restrict__ running_mean,
                                 float* __restrict__ running_var,
                                 int64_t* __restrict__ num_batches_tracked) {
  const double md = static_cast<double>(m), mom = momentum;
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < c;
       ch += int64_t{gridDim.x} * blockDim.x) {
    double s[2];
    ChannelSums(part, ch, chunks, s);
    const double d = s[0] / md;  // mean - shift
    const double mu = static_cast<double>(x[ch * l]) + d;
    const double sq = fmax(0.0, s[1] - s[0] * d);  // sum of (x - mu)^2
    mean[ch] = static_cast<float>(mu);
    rstd[ch] = static_cast<float>(1.0 / sqrt(sq / md + eps));
    if (running_mean != nullptr) {
      const double var_unbiased = m > 1 ? sq / (md - 1.0) : NAN;
      running_mean[ch] = static_cast<float>((1.0 - mom) * running_mean[ch] + mom * mu);
      running_var[ch] = static_cast<float>((1.0 - mom) * running_var[ch] + mom * var_unbiased);
    }
  }
  if (num_batches_tracked != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    *num_batches_tracked += 1;
  }
}

// Eval: mean, rstd from the running statistics.
__global__ void RunningStatsKernel(const float* __restrict__ running_mean,
                                   const float* __restrict__ running_var, int64_t c, float eps,
                                   float* __restrict__ mean, float* __restrict__ rstd) {
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < c;
       ch += int64_t{gridDim.x} * blockDim.x) {
    mean[ch] = running_mean[ch];
    rstd[ch] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[ch]) + eps));
  }
}

// Channel of element e of a contiguous (N, C, L) tensor along a grid-stride
// loop: advanced by the loop's step with no division per element.
struct ChannelWalk {
  int64_t i, ch;   // position in the row of L, channel
  int64_t di, dc;  // what one step adds to each (before carries)
  __device__ ChannelWalk(int64_t e, int64_t step, int64_t c, int64_t l)
      : i(e % l), ch((e / l) % c), di(step % l), dc((step / l) % c) {}
  __device__ __forceinline__ void Next(int64_t c, int64_t l) {
    i += di;
    ch += dc;
    if (i >= l) {
      i -= l;
      ++ch;
    }
    if (ch >= c) ch -= c;
  }
};

// y = (x - mean) * (rstd * w) + b.
__global__ void NormalizeKernel(const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ b, const float* __restrict__ mean,
                                const float* __restrict__ rstd, float* __restrict__ y,
                                int64_t numel, int64_t c, int64_t l) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (ChannelWalk at(e, step, c, l); e < numel; e += step, at.Next(c, l)) {
    const int64_t ch = at.ch;
    const float scale = rstd[ch] * (w != nullptr ? w[ch] : 1.0f);
    y[e] = (x[e] - mean[ch]) * scale + (b != nullptr ? b[ch] : 0.0f);
  }
}

// grad_weight, grad_bias, and coef (C, 3) = (a, b, k) of
// grad_x = g a + (x - mean) b + k:
//   a = w rstd; with batch statistics b = -a rstd sum(g xhat) / M and
//   k = -a sum(g) / M, else 0 (the statistics are constants).
__global__ void BackwardCoefKernel(const double* __restrict__ part, int64_t chunks,
                                   const float* __restrict__ w, const float* __restrict__ rstd,
                                   bool training, int64_t c, int64_t m,
                                   float* __restrict__ grad_weight, float* __restrict__ grad_bias,
                                   float* __restrict__ coef) {
  const double md = static_cast<double>(m);
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < c;
       ch += int64_t{gridDim.x} * blockDim.x) {
    double s[2];
    ChannelSums(part, ch, chunks, s);
    const double rs = rstd[ch];
    const double sum_g = s[0], sum_gxhat = s[1] * rs;
    grad_weight[ch] = static_cast<float>(sum_gxhat);
    grad_bias[ch] = static_cast<float>(sum_g);
    const double a = rs * (w != nullptr ? w[ch] : 1.0f);
    coef[ch * 3] = static_cast<float>(a);
    coef[ch * 3 + 1] = training ? static_cast<float>(-a * rs * sum_gxhat / md) : 0.0f;
    coef[ch * 3 + 2] = training ? static_cast<float>(-a * sum_g / md) : 0.0f;
  }
}

__global__ void GradInputKernel(const float* __restrict__ g, const float* __restrict__ x,
                                const float* __restrict__ mean, const float* __restrict__ coef,
                                float* __restrict__ gx, int64_t numel, int64_t c, int64_t l) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (ChannelWalk at(e, step, c, l); e < numel; e += step, at.Next(c, l)) {
    const int64_t ch = at.ch;
    gx[e] = g[e] * coef[ch * 3] + (x[e] - mean[ch]) * coef[ch * 3 + 1] + coef[ch * 3 + 2];
  }
}

const float* PtrOrNull(const Tensor& t) { return t.defined() ? Ptr<float>(t) : nullptr; }

struct Dims {
  int64_t n, c, l;
  explicit Dims(const Tensor& x) : n(x.dim(0)), c(x.dim(1)), l(x.rank() == 3 ? x.dim(2) : 1) {}
  int64_t m() const { return n * l; }  // values per channel
};

// Runs the partial-sum kernel for x's layout; returns part (C, chunks, 2) as
// doubles in an i64 tensor (the tensor library has no f64) and sets *chunks.
template <bool kBackward>
Tensor PartialSums(const char* op, const Dims& d, const Tensor& x, const Tensor& g,
                   const Tensor& mean, int64_t* chunks) {
  // Chunks per channel: about kTargetBlocks blocks in all, each with at least
  // kMinValuesPerBlock values (L = 1: kColTile channels per block).
  const int64_t col_tiles = d.l == 1 ? (d.c + kColTile - 1) / kColTile : d.c;
  const int64_t values = d.l == 1 ? d.m() * kColTile : d.m();  // per block column
  const int64_t by_blocks = (kTargetBlocks + col_tiles - 1) / col_tiles;
  const int64_t by_size = (values + kMinValuesPerBlock - 1) / kMinValuesPerBlock;
  int64_t k = by_blocks < by_size ? by_blocks : by_size;
  k = k < 1 ? 1 : (k > 65535 ? 65535 : k);
  const int64_t per_chunk = (d.m() + k - 1) / k;  // values (L > 1) or rows (L = 1)
  *chunks = (d.m() + per_chunk - 1) / per_chunk;
  Tensor part = Tensor::Empty({d.c, *chunks, 2}, Dtype::kI64, x.device());
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(*chunks));
  double* pp = static_cast<double*>(part.raw_data());
  const float* pg = kBackward ? Ptr<float>(g) : nullptr;
  const float* pm = kBackward ? Ptr<float>(mean) : nullptr;
  if (d.l == 1) {
    ColumnPartialKernel<kBackward>
        <<<grid, kThreads, 0, ComputeStream()>>>(Ptr<float>(x), pg, pm, pp, d.n, d.c, per_chunk);
  } else {
    ChannelPartialKernel<kBackward><<<grid, kThreads, 0, ComputeStream()>>>(
        Ptr<float>(x), pg, pm, pp, d.n, d.c, d.l, per_chunk);
  }
  CheckLaunch(op);
  return part;
}

}  // namespace

void BatchNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Tensor& running_mean, const Tensor& running_var,
                      const Tensor& num_batches_tracked, bool training, float momentum, float eps,
                      const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  const char* op = "batch_norm";
  SetDevice(x, op);
  const Dims d(x);
  if (training) {
    if (d.m() == 0) return;  // the op refuses this; nothing to normalize anyway
    int64_t chunks = 0;
    const Tensor part = PartialSums<false>(op, d, x, Tensor(), Tensor(), &chunks);
    const bool update = running_mean.defined();
    BatchStatsKernel<<<Blocks(d.c), kThreads, 0, ComputeStream()>>>(
        static_cast<const double*>(part.raw_data()), chunks, Ptr<float>(x), d.c, d.l, d.m(), eps,
        momentum, Ptr<float>(mean), Ptr<float>(rstd), update ? Ptr<float>(running_mean) : nullptr,
        update ? Ptr<float>(running_var) : nullptr,
        update && num_batches_tracked.defined() ? Ptr<int64_t>(num_batches_tracked) : nullptr);
  } else {
    RunningStatsKernel<<<Blocks(d.c), kThreads, 0, ComputeStream()>>>(
        Ptr<float>(running_mean), Ptr<float>(running_var), d.c, eps, Ptr<float>(mean),
        Ptr<float>(rstd));
  }
  CheckLaunch(op);
  const int64_t numel = x.numel();
  if (numel == 0) return;
  NormalizeKernel<<<Blocks(numel), kThreads, 0, ComputeStream()>>>(
      Ptr<float>(x), PtrOrNull(weight), PtrOrNull(bias), Ptr<float>(mean), Ptr<float>(rstd),
      Ptr<float>(y), numel, d.c, d.l);
  CheckLaunch(op);
}

void BatchNormBackward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd, bool training, const Tensor& grad_x,
                       const Tensor& grad_weight, const Tensor& grad_bias) {
  const char* op = "batch_norm_backward";
  SetDevice(x, op);
  const Dims d(x);
  if (d.m() == 0) {  // empty batch: no gradient
    CheckCuda(cudaMemsetAsync(grad_weight.raw_data(), 0, grad_weight.nbytes(), ComputeStream()), op,
              "cudaMemsetAsync");
    CheckCuda(cudaMemsetAsync(grad_bias.raw_data(), 0, grad_bias.nbytes(), ComputeStream()), op,
              "cudaMemsetAsync");
    return;
  }
  int64_t chunks = 0;
  const Tensor part = PartialSums<true>(op, d, x, grad_y, mean, &chunks);
  const Tensor coef = Tensor::Empty({d.c, 3}, Dtype::kF32, x.device());  // (a, b, k) per channel
  BackwardCoefKernel<<<Blocks(d.c), kThreads, 0, ComputeStream()>>>(
      static_cast<const double*>(part.raw_data()), chunks, PtrOrNull(weight), Ptr<float>(rstd),
      training, d.c, d.m(), Ptr<float>(grad_weight), Ptr<float>(grad_bias), Ptr<float>(coef));
  CheckLaunch(op);
  GradInputKernel<<<Blocks(x.numel()), kThreads, 0, ComputeStream()>>>(
      Ptr<float>(grad_y), Ptr<float>(x), Ptr<float>(mean), Ptr<float>(coef), Ptr<float>(grad_x),
      x.numel(), d.c, d.l);
  CheckLaunch(op);
}

}  // namespace cuda
}  // namespace tensor
