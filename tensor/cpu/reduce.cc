// CPU reduction kernels over (outer, reduce, inner) blocks: sums in double with
// fixed blocking (thread-count independent), max with first-index ties, and
// the broadcast / scatter kernels of their backward passes.
#include "tensor/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/memory_ledger.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;    // elements per task, roughly
constexpr int64_t kBlock = 1 << 14;    // elements per partial sum
constexpr int64_t kMinBlockRows = 64;  // rows per partial sum when inner > 1
constexpr int64_t kColBlock = 256;     // columns per task when inner > 1

using vec::D4;
using vec::F8;
using vec::kLanes;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// sum_{j<n} p[j] (or p[j]^2 when kSquare) in double: four 4-lane accumulators
// over blocks of 16, then the tail, added in a fixed order.
template <bool kSquare = false, typename T>
double SumRow(const T* p, int64_t n) {
  D4 acc[4] = {};
  int64_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    const F8 v0 = vec::LoadUnit(p + j), v1 = vec::LoadUnit(p + j + kLanes);
    D4 d[4] = {vec::LowHalf(v0), vec::HighHalf(v0), vec::LowHalf(v1), vec::HighHalf(v1)};
    for (int k = 0; k < 4; ++k) acc[k] += kSquare ? d[k] * d[k] : d[k];
  }
  double tail = 0;
  for (; j < n; ++j) {
    const double d = ToFloat(p[j]);
    tail += kSquare ? d * d : d;
  }
  const D4 s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + tail;
}

// acc[i] += row[i] for i < n.
template <typename T>
inline void AccumulateRow(const T* row, int64_t n, double* acc) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const F8 v = vec::LoadUnit(row + i);
    D4 a, b;
    std::memcpy(&a, acc + i, sizeof(a));
    std::memcpy(&b, acc + i + 4, sizeof(b));
    a += vec::LowHalf(v);
    b += vec::HighHalf(v);
    std::memcpy(acc + i, &a, sizeof(a));
    std::memcpy(acc + i + 4, &b, sizeof(b));
  }
  for (; i < n; ++i) acc[i] += ToFloat(row[i]);
}

template <typename TO>
inline void StoreSum(TO* out, double sum, double scale, bool accumulate) {
  double v = scale * sum;
  if (accumulate) v += ToFloat(*out);
  *out = FromFloat<TO>(static_cast<float>(v));
}

// Rows of length n (inner == 1): each output sums one contiguous row, long rows
// in blocks of kBlock whose partial sums are added in order.
template <typename TI, typename TO>
void SumRows(const TI* x, int64_t outer, int64_t n, double scale, bool accumulate, TO* out) {
  const int64_t blocks = CeilDiv(n, kBlock);
  if (blocks <= 1) {
    ParallelFor(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t o = b; o < e; ++o) {
                    StoreSum(out + o, SumRow(x + o * n, n), scale, accumulate);
                  }
                });
    return;
  }
  std::vector<double> partial(outer * blocks);
  ParallelFor(outer * blocks, std::max<int64_t>(1, kGrain / kBlock), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / blocks, blk = t % blocks;
      const int64_t begin = blk * kBlock;
      partial[t] = SumRow(x + o * n + begin, std::min(kBlock, n - begin));
    }
  });
  for (int64_t o = 0; o < outer; ++o) {
    double s = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) s += partial[o * blocks + blk];
    StoreSum(out + o, s, scale, accumulate);
  }
}

// Column sums (inner > 1): tasks of (outer, row block, column block), each
// adding its rows into a stack buffer of doubles; with several row blocks the
// partial sums land in a buffer and are added in order.
template <typename TI, typename TO>
void SumCols(const TI* x, int64_t outer, int64_t rows, int64_t inner, double scale, bool accumulate,
             TO* out) {
  const int64_t block_rows = std::max(kMinBlockRows, CeilDiv(kBlock, inner));
  const int64_t row_blocks = CeilDiv(rows, block_rows);
  const int64_t col_blocks = CeilDiv(inner, kColBlock);
  // Up to numel / 64 doubles: a tensor, so that the memory ledger sees it.
  Tensor scratch;
  double* partial = nullptr;
  if (row_blocks > 1) {
    ScopedMemoryCategory category(MemoryCategory::kTemporaries);
    scratch = Tensor::Empty({outer * row_blocks * inner}, Dtype::kI64);  // 8-byte slots
    partial = reinterpret_cast<double*>(scratch.raw_data());
  }
  const int64_t tasks = outer * row_blocks * col_blocks;
  const int64_t task_size = std::min(block_rows, rows) * std::min(kColBlock, inner);
  ParallelFor(tasks, std::max<int64_t>(1, kGrain / task_size), [&](int64_t b, int64_t e) {
    double acc[kColBlock];
    for (int64_t t = b; t < e; ++t) {
      const int64_t cb = t % col_blocks;
      const int64_t rb = (t / col_blocks) % row_blocks;
      const int64_t o = t / (col_blocks * row_blocks);
      const int64_t c0 = cb * kColBlock, nc = std::min(kColBlock, inner - c0);
      const int64_t r0 = rb * block_rows, r1 = std::min(rows, r0 + block_rows);
      std::fill(acc, acc + nc, 0.0);
      for (int64_t r = r0; r < r1; ++r) AccumulateRow(x + (o * rows + r) * inner + c0, nc, acc);
      if (row_blocks == 1) {
        for (int64_t i = 0; i < nc; ++i)
          StoreSum(out + o * inner + c0 + i, acc[i], scale, accumulate);
      } else {
        std::copy(acc, acc + nc, partial + (o * row_blocks + rb) * inner + c0);
      }
    }
  });
  if (row_blocks == 1) return;
  ParallelFor(outer * inner, std::max<int64_t>(1, kGrain / row_blocks), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / inner, i = t % inner;
      const double* p = partial + o * row_blocks * inner + i;
      double s = 0;
      for (int64_t rb = 0; rb < row_blocks; ++rb) s += p[rb * inner];
      StoreSum(out + t, s, scale, accumulate);
    }
  });
}

// True when v should replace the running max `best`: larger, or the first NaN.
inline bool Beats(float v, float best) { return v > best || (std::isnan(v) && !std::isnan(best)); }

template <typename T>
void MaxRows(const T* x, int64_t outer, int64_t n, T* values, int64_t* indices) {
  // A row's max and index over [begin, end).
  auto scan = [&](const T* row, int64_t begin, int64_t end, float* best, int64_t* idx) {
    *best = ToFloat(row[begin]);
    *idx = begin;
    for (int64_t j = begin + 1; j < end; ++j) {
      const float v = ToFloat(row[j]);
      if (Beats(v, *best)) {
        *best = v;
        *idx = j;
      }
    }
  };
  const int64_t blocks = CeilDiv(n, kBlock);
  std::vector<float> best(outer * blocks);
  std::vector<int64_t> where(outer * blocks);
  ParallelFor(outer * blocks, std::max<int64_t>(1, kGrain / std::min(n, kBlock)),
              [&](int64_t b, int64_t e) {
                for (int64_t t = b; t < e; ++t) {
                  const int64_t o = t / blocks, begin = (t % blocks) * kBlock;
                  scan(x + o * n, begin, std::min(n, begin + kBlock), &best[t], &where[t]);
                }
              });
  for (int64_t o = 0; o < outer; ++o) {
    float m = best[o * blocks];
    int64_t idx = where[o * blocks];
    for (int64_t blk = 1; blk < blocks; ++blk) {
      if (Beats(best[o * blocks + blk], m)) {
        m = best[o * blocks + blk];
        idx = where[o * blocks + blk];
      }
    }
    values[o] = FromFloat<T>(m);
    indices[o] = idx;
  }
}

template <typename T>
void MaxCols(const T* x, int64_t outer, int64_t rows, int64_t inner, T* values, int64_t* indices) {
  const int64_t col_blocks = CeilDiv(inner, kColBlock);
  ParallelFor(outer * col_blocks,
              std::max<int64_t>(1, kGrain / (rows * std::min(kColBlock, inner))),
              [&](int64_t b, int64_t e) {
                float best[kColBlock];
                int64_t idx[kColBlock];
                for (int64_t t = b; t < e; ++t) {
                  const int64_t o = t / col_blocks, c0 = (t % col_blocks) * kColBlock;
                  const int64_t nc = std::min(kColBlock, inner - c0);
                  const T* base = x + o * rows * inner + c0;
                  for (int64_t i = 0; i < nc; ++i) {
                    best[i] = ToFloat(base[i]);
                    idx[i] = 0;
                  }
                  for (int64_t r = 1; r < rows; ++r) {
                    const T* row = base + r * inner;
                    for (int64_t i = 0; i < nc; ++i) {
                      const float v = ToFloat(row[i]);
                      if (Beats(v, best[i])) {
                        best[i] = v;
                        idx[i] = r;
                      }
                    }
                  }
                  for (int64_t i = 0; i < nc; ++i) {
                    values[o * inner + c0 + i] = FromFloat<T>(best[i]);
                    indices[o * inner + c0 + i] = idx[i];
                  }
                }
              });
}

template <typename Fn>
void DispatchPair(const char* op, Dtype in, Dtype out, Fn&& fn) {
  DispatchFloating(op, in, [&](auto* in_tag) {
    DispatchFloating(op, out, [&](auto* out_tag) { fn(in_tag, out_tag); });
  });
}

}  // namespace

void SumDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, double scale,
            bool accumulate, const Tensor& out) {
  DispatchPair("sum", x.dtype(), out.dtype(), [&](auto* in_tag, auto* out_tag) {
    using TI = std::remove_pointer_t<decltype(in_tag)>;
    using TO = std::remove_pointer_t<decltype(out_tag)>;
    const TI* px = static_cast<const TI*>(x.raw_data());
    TO* po = static_cast<TO*>(out.raw_data());
    if (outer * inner == 0) {
      return;                  // no outputs
    } else if (reduce == 0) {  // empty sums: 0 (times scale: NaN for the mean of nothing)
      for (int64_t i = 0; i < outer * inner; ++i) StoreSum(po + i, 0.0, scale, accumulate);
    } else if (inner == 1) {
      SumRows(px, outer, reduce, scale, accumulate, po);
    } else {
      SumCols(px, outer, reduce, inner, scale, accumulate, po);
    }
  });
}

void MaxDim(const Tensor& x, int64_t outer, int64_t reduce, int64_t inner, const Tensor& values,
            const Tensor& indices) {
  OP_CHECK(reduce > 0, "max", "cannot take the max over an empty dimension");
  DispatchFloating("max", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* px = static_cast<const T*>(x.raw_data());
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    if (outer * inner == 0) {
      return;  // no outputs
    } else if (inner == 1) {
      MaxRows(px, outer, reduce, pv, pi);
    } else {
      MaxCols(px, outer, reduce, inner, pv, pi);
    }
  });
}

void BroadcastDim(const Tensor& grad_out, int64_t outer, int64_t reduce, int64_t inner,
                  double scale, const Tensor& grad_in) {
  DispatchPair("sum_backward", grad_out.dtype(), grad_in.dtype(), [&](auto* in_tag, auto* out_tag) {
    using TI = std::remove_pointer_t<decltype(in_tag)>;
    using TO = std::remove_pointer_t<decltype(out_tag)>;
    const TI* pg = static_cast<const TI*>(grad_out.raw_data());
    TO* po = static_cast<TO*>(grad_in.raw_data());
    const float s = static_cast<float>(scale);
    if (inner == 1) {  // runs of `reduce` equal values
      ParallelFor(outer * reduce, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e;) {
          const int64_t o = i / reduce;
          const int64_t end = std::min(e, (o + 1) * reduce);
          std::fill(po + i, po + end, FromFloat<TO>(s * ToFloat(pg[o])));
          i = end;
        }
      });
      return;
    }
    ParallelFor(outer * reduce, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t row = b; row < e; ++row) {
                    const TI* src = pg + (row / reduce) * inner;
                    TO* dst = po + row * inner;
                    int64_t i = 0;
                    for (; i + kLanes <= inner; i += kLanes) {
                      vec::StoreUnit(dst + i, s * vec::LoadUnit(src + i));
                    }
                    for (; i < inner; ++i) dst[i] = FromFloat<TO>(s * ToFloat(src[i]));
                  }
                });
  });
}

void ScatterDim(const Tensor& grad_out, const Tensor& indices, int64_t outer, int64_t reduce,
                int64_t inner, const Tensor& grad_in) {
  DispatchPair("max_backward", grad_out.dtype(), grad_in.dtype(), [&](auto* in_tag, auto* out_tag) {
    using TI = std::remove_pointer_t<decltype(in_tag)>;
    using TO = std::remove_pointer_t<decltype(out_tag)>;
    const TI* pg = static_cast<const TI*>(grad_out.raw_data());
    const int64_t* pidx = indices.data<int64_t>();
    TO* po = static_cast<TO*>(grad_in.raw_data());
    const TO zero = FromFloat<TO>(0.0f);
    ParallelFor(outer * reduce * inner, kGrain,
                [&](int64_t b, int64_t e) { std::fill(po + b, po + e, zero); });
    ParallelFor(outer * inner, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t r = pidx[t];
        OP_CHECK(r >= 0 && r < reduce, "max_backward", "index ", r,
                 " out of range for a dimension of size ", reduce);
        const int64_t o = t / inner, i = t % inner;
        po[(o * reduce + r) * inner + i] = FromFloat<TO>(ToFloat(pg[t]));
      }
    });
  });
}

double SumSquares(const Tensor& x) {
  double result = 0;
  DispatchFloating("sum_squares", x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* px = static_cast<const T*>(x.raw_data());
    const int64_t n = x.numel();
    const int64_t blocks = CeilDiv(n, kBlock);
    std::vector<double> partial(blocks);
    ParallelFor(blocks, std::max<int64_t>(1, kGrain / kBlock), [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t begin = blk * kBlock;
        partial[blk] = SumRow</*kSquare=*/true>(px + begin, std::min(kBlock, n - begin));
      }
    });
    for (double p : partial) result += p;
  });
  return result;
}

}  // namespace cpu
}  // namespace tensor
