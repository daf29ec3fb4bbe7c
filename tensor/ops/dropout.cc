// Dropout: argument checks and the mask kernel, shared by the forward and the
// backward (both multiply by the same regenerated mask). Work is split into
// blocks of 32 elements (8 Philox counters, generated 8 at a time with AVX2),
// so a block's mask is the same whichever thread computes it. Tensors on a
// CUDA device go to tensor/cuda/dropout.h, which evaluates the same mask
// function per element (GPU and CPU dropout agree bit for bit).
#include "tensor/ops/dropout.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/cuda/dropout.h"
#include "tensor/ops/check.h"
#include "tensor/ops/elementwise.h"
#include "tensor/thread_pool.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace tensor {
namespace {

using cpu::vec::F8;
using cpu::vec::I8;
using cpu::vec::kLanes;

// Elements are kept iff (word >> 8) >= Threshold(p), i.e. (word >> 8) * 2^-24 >= p.
uint32_t Threshold(float p) {
  return static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
}

constexpr int64_t kCountersPerBlock = 8;
constexpr int64_t kBlock = 4 * kCountersPerBlock;  // elements per block

#if defined(__AVX2__)
// Philox4x32-10 as in tensor/random.cc, 8 counters at a time; the tests check
// it against Philox4x32 word for word.
inline void MulHiLo(__m256i a, __m256i k, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(a, k);                        // lanes 0, 2, 4, 6
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), k);  // lanes 1, 3, 5, 7
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
#endif

// words[w][j] = Philox4x32(seed, 0, base + j)[w] for j < 8.
inline void Philox8(uint64_t seed, uint64_t base, uint32_t words[4][kCountersPerBlock]) {
#if defined(__AVX2__)
  alignas(32) uint32_t lo[kCountersPerBlock], hi[kCountersPerBlock];
  for (int j = 0; j < kCountersPerBlock; ++j) {
    lo[j] = static_cast<uint32_t>(base + j);
    hi[j] = static_cast<uint32_t>((base + j) >> 32);
  }
  __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
  __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  __m256i k0 = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(seed)));
  __m256i k1 = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(seed >> 32)));
  const __m256i mul0 = _mm256_set1_epi32(static_cast<int32_t>(0xD2511F53u));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<int32_t>(0xCD9E8D57u));
  const __m256i weyl0 = _mm256_set1_epi32(static_cast<int32_t>(0x9E3779B9u));
  const __m256i weyl1 = _mm256_set1_epi32(static_cast<int32_t>(0xBB67AE85u));
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    MulHiLo(c0, mul0, &hi0, &lo0);
    MulHiLo(c2, mul1, &hi1, &lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
    c3 = lo0;
    k0 = _mm256_add_epi32(k0, weyl0);
    k1 = _mm256_add_epi32(k1, weyl1);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[0]), c0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[1]), c1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[2]), c2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[3]), c3);
#else
  for (int j = 0; j < kCountersPerBlock; ++j) {
    const std::array<uint32_t, 4> r = Philox4x32(seed, 0, base + j);
    for (int w = 0; w < 4; ++w) words[w][j] = r[w];
  }
#endif
}

// keep[e] = -1 (keep) or 0 (drop) for element kBlock * block + e.
inline void KeepBlock(const DropoutState& s, uint32_t threshold, int64_t block,
                      int32_t keep[kBlock]) {
  alignas(32) uint32_t words[4][kCountersPerBlock];
  Philox8(s.seed, s.offset + kCountersPerBlock * static_cast<uint64_t>(block), words);
#if defined(__AVX2__)
  // Compare word vectors ((word >> 8) < 2^24, so a signed compare with
  // threshold - 1 works), then transpose (word, counter) to element order 4 j + w.
  const __m256i limit = _mm256_set1_epi32(static_cast<int32_t>(threshold) - 1);
  __m256i k[4];
  for (int w = 0; w < 4; ++w) {
    const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(words[w]));
    k[w] = _mm256_cmpgt_epi32(_mm256_srli_epi32(v, 8), limit);
  }
  const __m256i t0 = _mm256_unpacklo_epi32(k[0], k[1]);  // counters 0,1 | 4,5: words 0,1
  const __m256i t1 = _mm256_unpacklo_epi32(k[2], k[3]);  // counters 0,1 | 4,5: words 2,3
  const __m256i t2 = _mm256_unpackhi_epi32(k[0], k[1]);  // counters 2,3 | 6,7: words 0,1
  const __m256i t3 = _mm256_unpackhi_epi32(k[2], k[3]);  // counters 2,3 | 6,7: words 2,3
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t1);      // counters 0 | 4
  const __m256i u1 = _mm256_unpackhi_epi64(t0, t1);      // counters 1 | 5
  const __m256i u2 = _mm256_unpacklo_epi64(t2, t3);      // counters 2 | 6
  const __m256i u3 = _mm256_unpackhi_epi64(t2, t3);      // counters 3 | 7
  __m256i* out = reinterpret_cast<__m256i*>(keep);
  _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(u0, u1, 0x20));  // counters 0, 1
  _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(u2, u3, 0x20));  // counters 2, 3
  _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(u0, u1, 0x31));  // counters 4, 5
  _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(u2, u3, 0x31));  // counters 6, 7
#else
  for (int j = 0; j < kCountersPerBlock; ++j) {
    for (int w = 0; w < 4; ++w) keep[4 * j + w] = (words[w][j] >> 8) >= threshold ? -1 : 0;
  }
#endif
}

// Calls fn(i, keep, count) for each vector of kLanes elements starting at i
// (count: cpu::vec::FullBlock{}, or the number left in the last one), keep
// holding -1 (kept) or 0 (dropped) per lane: the mask of `s` over n elements,
// generated one block at a time on the thread pool.
// `all_dropped(block)`: the block's result does not depend on its mask (its
// input is all +0), so the mask is not generated and every lane reads as
// dropped.
template <typename Fn, typename Skip>
void ForEachKeepVector(int64_t n, const DropoutState& s, const Skip& all_dropped, const Fn& fn) {
  const uint32_t threshold = Threshold(s.p);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  ParallelFor(blocks, 1024, [&](int64_t b0, int64_t b1) {
    int32_t keep[kBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      if (all_dropped(blk)) {
        std::fill(keep, keep + kBlock, 0);
      } else {
        KeepBlock(s, threshold, blk, keep);
      }
      for (int64_t v = 0; v < kBlock; v += kLanes) {
        const int64_t i = blk * kBlock + v;
        if (i >= n) break;
        I8 keep_v;
        std::memcpy(&keep_v, keep + v, sizeof(keep_v));
        if (i + kLanes <= n) {
          fn(i, keep_v, cpu::vec::FullBlock{});
        } else {
          fn(i, keep_v, n - i);
        }
      }
    }
  });
}

// out[i, i + count) = in * mask / (1 - p), from the lanes' keep; a select,
// not a multiply by 0: dropped inf / NaN inputs give 0 too.
template <typename T, typename Count>
inline void MaskVector(const T* in, T* out, int64_t i, I8 keep, F8 scale, Count count) {
  const F8 x = keep ? cpu::vec::LoadAs(in + i, count) * scale : cpu::vec::Splat(0.0f);
  cpu::vec::StoreAs(out + i, x, count);
}

// True when in[begin, end) are all +0 (every bit clear).
template <typename T>
bool AllPositiveZero(const T* in, int64_t begin, int64_t end) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
  static_assert(sizeof(T) == sizeof(Bits));
  Bits any = 0;
  for (int64_t i = begin; i < end; ++i) {
    Bits b;
    std::memcpy(&b, in + i, sizeof(b));
    any |= b;
  }
  return any == 0;
}

// ForEachKeepVector's `all_dropped` for a result that is +0 wherever `in`
// (n elements) is +0, kept or dropped: the blocks of in that are all +0.
template <typename T>
auto ZeroBlocksOf(const T* in, int64_t n) {
  return [in, n](int64_t blk) {
    return AllPositiveZero(in, blk * kBlock, std::min(n, (blk + 1) * kBlock));
  };
}

// out = in * mask / (1 - p); in and out contiguous with n elements (out may be in).
// A block of +0 inputs gives +0 whether kept or dropped, so its mask is not
// generated: causal attention's probabilities above the diagonal (about half
// of them) cost no random numbers.
template <typename T>
void ApplyMask(const T* in, T* out, int64_t n, const DropoutState& s) {
  const F8 scale = cpu::vec::Splat(static_cast<float>(1.0 / (1.0 - s.p)));
  ForEachKeepVector(n, s, ZeroBlocksOf(in, n), [&](int64_t i, I8 keep, auto count) {
    MaskVector(in, out, i, keep, scale, count);
  });
}

// ApplyMask on two tensors with one generation of the mask.
template <typename A, typename B>
void ApplyMaskToBoth(const A* a_in, A* a_out, const B* b_in, B* b_out, int64_t n,
                     const DropoutState& s) {
  const F8 scale = cpu::vec::Splat(static_cast<float>(1.0 / (1.0 - s.p)));
  auto never = [](int64_t) { return false; };  // b may be non-zero where a is zero
  ForEachKeepVector(n, s, never, [&](int64_t i, I8 keep, auto count) {
    MaskVector(a_in, a_out, i, keep, scale, count);
    MaskVector(b_in, b_out, i, keep, scale, count);
  });
}

// out = res + in * mask / (1 - p) over n contiguous elements (out may be
// res), the sum in f32 and rounded once. A block of +0 inputs adds +0 kept
// or dropped: its mask is not generated.
template <typename R, typename X>
void ApplyMaskAdd(const R* res, const X* in, R* out, int64_t n, const DropoutState& s) {
  const F8 scale = cpu::vec::Splat(static_cast<float>(1.0 / (1.0 - s.p)));
  ForEachKeepVector(n, s, ZeroBlocksOf(in, n), [&](int64_t i, I8 keep, auto count) {
    const F8 kept = keep ? cpu::vec::LoadAs(in + i, count) * scale : cpu::vec::Splat(0.0f);
    cpu::vec::StoreAs(out + i, cpu::vec::LoadAs(res + i, count) + kept, count);
  });
}

void CheckP(const char* op, float p) {
  OP_CHECK(p >= 0.0f && p <= 1.0f, op, "p must be in [0, 1]; got ", p);
}

// Throws unless t is defined; true when it is on a CUDA device.
bool OnCuda(const char* op, const Tensor& t) {
  OP_CHECK(t.defined(), op, "got an undefined tensor");
  return t.device().is_cuda();
}

// The backward's checks of a gradient against its forward's state; true
// when it is on a CUDA device.
bool CheckBackwardInput(const char* op, const Tensor& grad_y, const DropoutState& state) {
  const bool on_cuda = OnCuda(op, grad_y);
  CheckFloating(op, grad_y);
  CheckP(op, state.p);
  OP_CHECK(grad_y.numel() == state.numel, op, Describe("grad_y", grad_y), " has ", grad_y.numel(),
           " elements but the forward's x had ", state.numel);
  return on_cuda;
}

}  // namespace

DropoutState DrawDropoutState(int64_t numel, float p, Generator& gen, bool training) {
  CheckP("dropout", p);
  DropoutState state;
  state.p = p;
  state.numel = numel;
  if (!training || p == 0.0f) return state;
  state.active = true;
  if (p == 1.0f) return state;  // all zeros: no mask to draw
  state.seed = gen.seed();
  state.offset = gen.Reserve((static_cast<uint64_t>(numel) + 3) / 4);
  return state;
}

DropoutResult Dropout(const Tensor& x, float p, Generator& gen, bool training) {
  const char* op = "dropout";
  const bool on_cuda = OnCuda(op, x);
  CheckFloating(op, x);
  DropoutResult out;
  out.state = DrawDropoutState(x.numel(), p, gen, training);
  if (!out.state.active) {
    out.y = x;
    return out;
  }
  if (p == 1.0f) {
    out.y = Tensor::Zeros(x.shape(), x.dtype(), x.device());
    return out;
  }
  const Tensor xc = x.Contiguous();
  out.y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (on_cuda) {
    cuda::DropoutApply(op, xc, out.y, p, out.state.seed, out.state.offset);
    return out;
  }
  DispatchFloating(op, x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ApplyMask(xc.data<T>(), out.y.data<T>(), x.numel(), out.state);
  });
  return out;
}

DropoutResult DropoutAdd(const Tensor& residual, const Tensor& x, float p, Generator& gen,
                         bool training) {
  const char* op = "dropout_add";
  const bool on_cuda = OnCuda(op, x);
  OP_CHECK(residual.defined() && residual.shape() == x.shape() && residual.device() == x.device(),
           op, "the residual must have x's shape and device; got ", Describe("residual", residual),
           " and ", Describe("x", x));
  CheckFloating(op, x);
  CheckFloating(op, residual);
  DropoutResult out;
  out.state = DrawDropoutState(x.numel(), p, gen, training);
  if (!out.state.active) {
    out.y = Add(residual, x.To(residual.dtype()));
    return out;
  }
  if (p == 1.0f) {
    out.y = residual.Clone();
    return out;
  }
  const Tensor rc = residual.Contiguous(), xc = x.Contiguous();
  out.y = Tensor::Empty(residual.shape(), residual.dtype(), residual.device());
  if (on_cuda) {
    cuda::DropoutAddApply(op, rc, xc, out.y, p, out.state.seed, out.state.offset);
    return out;
  }
  DispatchFloating(op, residual.dtype(), [&](auto* r_tag) {
    using R = std::remove_pointer_t<decltype(r_tag)>;
    DispatchFloating(op, x.dtype(), [&](auto* x_tag) {
      using X = std::remove_pointer_t<decltype(x_tag)>;
      ApplyMaskAdd(rc.data<R>(), xc.data<X>(), out.y.data<R>(), x.numel(), out.state);
    });
  });
  return out;
}

Tensor DropoutBackward(const Tensor& grad_y, const DropoutState& state) {
  const char* op = "dropout_backward";
  const bool on_cuda = CheckBackwardInput(op, grad_y, state);
  if (!state.active) return grad_y;
  if (state.p == 1.0f) return Tensor::Zeros(grad_y.shape(), grad_y.dtype(), grad_y.device());
  const Tensor gc = grad_y.Contiguous();
  Tensor grad_x = Tensor::Empty(grad_y.shape(), grad_y.dtype(), grad_y.device());
  if (on_cuda) {
    cuda::DropoutApply(op, gc, grad_x, state.p, state.seed, state.offset);
    return grad_x;
  }
  DispatchFloating(op, grad_y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ApplyMask(gc.data<T>(), grad_x.data<T>(), grad_y.numel(), state);
  });
  return grad_x;
}

std::array<Tensor, 2> DropoutBackwardOfBoth(const Tensor& a, const Tensor& b,
                                            const DropoutState& state) {
  const char* op = "dropout_backward";
  OP_CHECK(a.defined() && b.defined() && a.device() == b.device(), op,
           "expects two tensors on one device; got ", Describe("a", a), " and ", Describe("b", b));
  const bool on_cuda = CheckBackwardInput(op, a, state);
  CheckBackwardInput(op, b, state);
  if (on_cuda || !state.active || state.p == 1.0f) {
    return {DropoutBackward(a, state), DropoutBackward(b, state)};
  }
  const Tensor ac = a.Contiguous(), bc = b.Contiguous();
  std::array<Tensor, 2> out = {Tensor::Empty(a.shape(), a.dtype(), a.device()),
                               Tensor::Empty(b.shape(), b.dtype(), b.device())};
  DispatchFloating(op, a.dtype(), [&](auto* a_tag) {
    using A = std::remove_pointer_t<decltype(a_tag)>;
    DispatchFloating(op, b.dtype(), [&](auto* b_tag) {
      using B = std::remove_pointer_t<decltype(b_tag)>;
      ApplyMaskToBoth(ac.data<A>(), out[0].data<A>(), bc.data<B>(), out[1].data<B>(), a.numel(),
                      state);
    });
  });
  return out;
}

Tensor DropoutMask(const Shape& shape, const DropoutState& state) {
  const char* op = "dropout_mask";
  CheckP(op, state.p);
  Tensor mask = Tensor::Empty(shape, Dtype::kU8);
  uint8_t* m = mask.data<uint8_t>();
  const int64_t n = shape.numel();
  if (!state.active || state.p == 1.0f) {
    std::fill(m, m + n, state.active ? 0 : 1);
    return mask;
  }
  auto never = [](int64_t) { return false; };
  ForEachKeepVector(n, state, never, [&](int64_t i, I8 keep, auto) {
    for (int64_t e = 0; e < std::min<int64_t>(kLanes, n - i); ++e) m[i + e] = keep[e] != 0;
  });
  return mask;
}

}  // namespace tensor
