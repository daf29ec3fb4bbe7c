// CUDA embedding kernels: an id range check whose first bad position and id
// the host reads at its next wait (a deferred check), a row gather in the
// widest aligned unit (up to 16 bytes), and a deterministic
// backward: positions sorted by id with CUB's stable radix sort, then one
// block per run of equal ids summing the run's gradient rows in position
// order (one thread per column), so no two threads write the same element.
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <functional>
#include <string>
#include <utility>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/embedding.h"
#include "tensor/cuda_backend.h"

namespace tensor {
namespace cuda {
namespace {

constexpr unsigned long long kNoPosition = 0x7f7f7f7f7f7f7f7full;  // memset 0x7f

__device__ __forceinline__ int64_t GlobalThread() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t ThreadCount() { return int64_t{gridDim.x} * blockDim.x; }

template <typename I>
__global__ void FindBadIdKernel(const I* ids, int64_t n, int64_t vocab, unsigned long long* bad) {
  for (int64_t p = GlobalThread(); p < n; p += ThreadCount()) {
    const int64_t v = static_cast<int64_t>(ids[p]);
    if (v < 0 || v >= vocab) atomicMin(bad, static_cast<unsigned long long>(p));
  }
}

// bad[1] = ids[bad[0]] when bad[0] (FindBadIdKernel's) names a position.
template <typename I>
__global__ void BadIdKernel(const I* ids, int64_t n, unsigned long long* bad) {
  if (bad[0] < static_cast<unsigned long long>(n)) {
    bad[1] = static_cast<unsigned long long>(static_cast<int64_t>(ids[bad[0]]));
  }
}

// out row n = weight row ids[n], copied in units of U (row_units per row); a
// row of zeros for an id outside [0, vocab), whose error the host reports at
// its next wait (CheckIdsDeferred): never a read out of bounds.
template <typename U, typename I>
__global__ void GatherKernel(const U* weight, const I* ids, int64_t rows, int64_t row_units,
                             int64_t vocab, U* out) {
  const int64_t total = rows * row_units;
  for (int64_t e = GlobalThread(); e < total; e += ThreadCount()) {
    const int64_t n = e / row_units, u = e % row_units;
    const int64_t id = static_cast<int64_t>(ids[n]);
    out[e] = id >= 0 && id < vocab ? weight[id * row_units + u] : U{};
  }
}

// Sort input: key = id, value = position. An id outside [0, vocab) (the
// callers check ids first, or trust a check the forward made) gets key vocab,
// which the scatter skips: never a write out of bounds.
template <typename I>
__global__ void MakeKeysKernel(const I* ids, int64_t n, int64_t vocab, uint32_t* keys,
                               int32_t* positions) {
  for (int64_t p = GlobalThread(); p < n; p += ThreadCount()) {
    const int64_t v = static_cast<int64_t>(ids[p]);
    keys[p] = static_cast<uint32_t>(v >= 0 && v < vocab ? v : vocab);
    positions[p] = static_cast<int32_t>(p);
  }
}

// Block per sorted index k (grid-stride): where k starts a run of equal ids v,
// grad_weight row v = (its old value when accumulating, else 0) + the
// grad_out rows of the run's positions, added in ascending position order.
template <typename G, typename W>
__global__ void ScatterAddKernel(const G* grad_out, const uint32_t* keys, const int32_t* positions,
                                 int64_t n, int64_t c, int64_t vocab, bool accumulate,
                                 W* grad_weight) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const uint32_t v = keys[k];
    if (k > 0 && keys[k - 1] == v) continue;  // not the start of a run (uniform per block)
    if (v >= vocab) continue;                 // an out-of-range id (MakeKeysKernel)
    W* dst = grad_weight + static_cast<int64_t>(v) * c;
    for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
      float acc = accumulate ? ToF(dst[col]) : 0.0f;
      for (int64_t s = k; s < n && keys[s] == v; ++s) {
        acc = __fadd_rn(acc, ToF(grad_out[static_cast<int64_t>(positions[s]) * c + col]));
      }
      dst[col] = FromF<W>(acc);
    }
  }
}

template <typename Fn>
void DispatchIds(const Tensor& ids, const char* op, Fn&& fn) {
  switch (ids.dtype()) {
    case Dtype::kI32:
      return fn(int32_t{});
    case Dtype::kI64:
      return fn(int64_t{});
    default:
      ThrowOpError(op, "index dtype ", DtypeName(ids.dtype()),
                   " is not supported; expected i32 or i64");
  }
}

template <typename U, typename I>
void LaunchGather(const Tensor& weight, const I* ids, int64_t rows, int64_t row_bytes,
                  const Tensor& out) {
  const int64_t row_units = row_bytes / static_cast<int64_t>(sizeof(U));
  GatherKernel<U, I><<<Blocks(rows * row_units), kThreads, 0, ComputeStream()>>>(
      static_cast<const U*>(weight.raw_data()), ids, rows, row_units, weight.dim(0),
      static_cast<U*>(out.raw_data()));
}

bool Aligned(const void* p, int64_t unit) { return reinterpret_cast<uintptr_t>(p) % unit == 0; }

}  // namespace

void CheckIdsDeferred(const char* op, const Tensor& ids, int64_t vocab,
                      std::function<std::string(int64_t position, int64_t id)> report) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  SetDevice(ids, op);
  // (2,): the first bad position (kNoPosition: none), then its id.
  Tensor words = Tensor::Empty({2}, Dtype::kI64, ids.device());
  auto* bad = static_cast<unsigned long long*>(words.raw_data());
  CheckCuda(cudaMemsetAsync(bad, 0x7f, sizeof(*bad), ComputeStream()), op, "cudaMemsetAsync");
  DispatchIds(ids, op, [&](auto zero) {
    using I = decltype(zero);
    FindBadIdKernel<<<Blocks(n), kThreads, 0, ComputeStream()>>>(Ptr<I>(ids), n, vocab, bad);
    CheckLaunch(op);
    BadIdKernel<<<1, 1, 0, ComputeStream()>>>(Ptr<I>(ids), n, bad);
    CheckLaunch(op);
  });
  DeferCheck(op, ids.device().index, bad, 2,
             [report = std::move(report)](const int64_t* w) -> std::string {
               if (static_cast<unsigned long long>(w[0]) == kNoPosition) return "";
               return report(w[0], w[1]);
             });
}

void EmbeddingForward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const char* op = "embedding";
  const int64_t rows = ids.numel();
  const int64_t row_bytes = weight.dim(1) * weight.element_size();
  if (rows == 0 || row_bytes == 0) return;
  SetDevice(weight, op);
  DispatchIds(ids, op, [&](auto zero) {
    using I = decltype(zero);
    const I* pid = Ptr<I>(ids);
    // The widest unit that divides a row and aligns both tables.
    int64_t unit = 16;
    while (unit > 1 && (row_bytes % unit != 0 || !Aligned(weight.raw_data(), unit) ||
                        !Aligned(out.raw_data(), unit))) {
      unit /= 2;
    }
    switch (unit) {
      case 16:
        return LaunchGather<uint4>(weight, pid, rows, row_bytes, out);
      case 8:
        return LaunchGather<uint2>(weight, pid, rows, row_bytes, out);
      case 4:
        return LaunchGather<uint32_t>(weight, pid, rows, row_bytes, out);
      case 2:
        return LaunchGather<uint16_t>(weight, pid, rows, row_bytes, out);
      default:
        return LaunchGather<uint8_t>(weight, pid, rows, row_bytes, out);
    }
  });
  CheckLaunch(op);
}

void EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight,
                       bool accumulate) {
  const char* op = "embedding_backward";
  const int64_t vocab = grad_weight.dim(0);
  const int64_t c = grad_weight.dim(1);
  const int64_t n = ids.numel();
  SetDevice(grad_weight, op);
  if (!accumulate && grad_weight.numel() > 0) {
    CheckCuda(cudaMemsetAsync(grad_weight.raw_data(), 0, grad_weight.nbytes(), ComputeStream()), op,
              "cudaMemsetAsync");  // all-zero bits: +0 in every floating dtype
  }
  if (n == 0 || c == 0) return;
  OP_CHECK(vocab < (int64_t{1} << 31) && n < (int64_t{1} << 31), op,
           "on CUDA the vocabulary and the number of ids must be below 2^31; got ", vocab, " and ",
           n);
  // Keys and positions, unsorted and sorted: one i32 buffer of 4 n.
  Tensor buffers = Tensor::Empty({4 * n}, Dtype::kI32, grad_weight.device());
  auto* keys_in = static_cast<uint32_t*>(buffers.raw_data());
  uint32_t* keys_out = keys_in + n;
  auto* pos_in = reinterpret_cast<int32_t*>(keys_in + 2 * n);
  int32_t* pos_out = pos_in + n;
  DispatchIds(ids, op, [&](auto zero) {
    using I = decltype(zero);
    MakeKeysKernel<<<Blocks(n), kThreads, 0, ComputeStream()>>>(Ptr<I>(ids), n, vocab, keys_in,
                                                                pos_in);
  });
  CheckLaunch(op);
  int end_bit = 1;  // bits of the largest key, vocab (the out-of-range key)
  while (end_bit < 32 && (int64_t{1} << end_bit) <= vocab) ++end_bit;
  size_t temp_bytes = 0;
  CheckCuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                            static_cast<int>(n), 0, end_bit, ComputeStream()),
            op, "cub::DeviceRadixSort::SortPairs (size query)");
  Tensor temp = Tensor::Empty({static_cast<int64_t>(temp_bytes)}, Dtype::kU8, grad_weight.device());
  CheckCuda(
      cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys_out, pos_in,
                                      pos_out, static_cast<int>(n), 0, end_bit, ComputeStream()),
      op, "cub::DeviceRadixSort::SortPairs");
  const int threads = c >= 256 ? 256 : static_cast<int>((c + 31) / 32 * 32);
  const unsigned blocks = static_cast<unsigned>(n < 65535 * 32 ? n : 65535 * 32);
  DispatchFloat(grad_out.dtype(), op, [&](auto g_zero) {
    using G = decltype(g_zero);
    DispatchFloat(grad_weight.dtype(), op, [&](auto w_zero) {
      using W = decltype(w_zero);
      ScatterAddKernel<<<blocks, threads, 0, ComputeStream()>>>(
          Ptr<G>(grad_out), keys_out, pos_out, n, c, vocab, accumulate, Ptr<W>(grad_weight));
    });
  });
  CheckLaunch(op);
}

}  // namespace cuda
}  // namespace tensor
