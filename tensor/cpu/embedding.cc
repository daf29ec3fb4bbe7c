// Embedding kernels: a parallel row gather, and a scatter-add partitioned by
// vocabulary row (no two threads write the same row).
#include "tensor/cpu/embedding.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec8.h"
#include "tensor/thread_pool.h"

namespace tensor {
namespace cpu {
namespace {

// Positions 0..n-1 grouped by id: the positions of id v are
// order[start[v] .. start[v + 1]), ascending.
template <typename I>
void GroupById(const I* ids, int64_t n, int64_t vocab, std::vector<int64_t>* start,
               std::vector<int64_t>* order) {
  start->assign(vocab + 1, 0);
  for (int64_t p = 0; p < n; ++p) ++(*start)[static_cast<int64_t>(ids[p]) + 1];
  for (int64_t v = 0; v < vocab; ++v) (*start)[v + 1] += (*start)[v];
  std::vector<int64_t> cursor(start->begin(), start->end() - 1);
  order->resize(n);
  for (int64_t p = 0; p < n; ++p) (*order)[cursor[static_cast<int64_t>(ids[p])]++] = p;
}

template <typename G, typename W>
void ScatterAdd(const G* grad_out, const std::vector<int64_t>& start,
                const std::vector<int64_t>& order, W* grad_weight, int64_t vocab, int64_t c,
                bool accumulate) {
  ParallelFor(vocab, vec::RowGrain(c), [&](int64_t v0, int64_t v1) {
    std::vector<float> acc(c);  // (C)
    for (int64_t v = v0; v < v1; ++v) {
      W* dst = grad_weight + v * c;  // (C)
      if (start[v] == start[v + 1]) {
        if (!accumulate) vec::ZeroRow(dst, c);
        continue;
      }
      if (accumulate) {
        vec::LoadRow(dst, acc.data(), c);
      } else {
        std::fill(acc.begin(), acc.end(), 0.0f);
      }
      for (int64_t s = start[v]; s < start[v + 1]; ++s) {
        const G* src = grad_out + order[s] * c;  // (C)
        float* a = acc.data();
        vec::ForEachBlock(c, [&](int64_t i, auto k) {
          vec::StoreAs(a + i, vec::LoadAs(a + i, k) + vec::LoadAs(src + i, k), k);
        });
      }
      vec::StoreRow(acc.data(), dst, c);
    }
  });
}

}  // namespace

void EmbeddingForward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const int64_t c = weight.dim(1);
  const int64_t row_bytes = c * weight.element_size();
  const char* w = static_cast<const char*>(weight.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  DispatchIndex("embedding", ids.dtype(), [&](auto* tag) {
    using I = std::remove_pointer_t<decltype(tag)>;
    const I* id = ids.data<I>();
    ParallelFor(ids.numel(), vec::RowGrain(c), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        std::memcpy(o + n * row_bytes, w + static_cast<int64_t>(id[n]) * row_bytes, row_bytes);
      }
    });
  });
}

void EmbeddingBackward(const Tensor& grad_out, const Tensor& ids, const Tensor& grad_weight,
                       bool accumulate) {
  const int64_t vocab = grad_weight.dim(0);
  const int64_t c = grad_weight.dim(1);
  std::vector<int64_t> start, order;
  DispatchIndex("embedding_backward", ids.dtype(), [&](auto* tag) {
    using I = std::remove_pointer_t<decltype(tag)>;
    GroupById(ids.data<I>(), ids.numel(), vocab, &start, &order);
  });
  DispatchFloating("embedding_backward", grad_out.dtype(), [&](auto* g_tag) {
    using G = std::remove_pointer_t<decltype(g_tag)>;
    DispatchFloating("embedding_backward", grad_weight.dtype(), [&](auto* w_tag) {
      using W = std::remove_pointer_t<decltype(w_tag)>;
      ScatterAdd(grad_out.data<G>(), start, order, grad_weight.data<W>(), vocab, c, accumulate);
    });
  });
}

}  // namespace cpu
}  // namespace tensor
