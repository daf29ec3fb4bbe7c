// cub::DeviceRadixSort::SortPairs for the CPU emulation (cuda_emu.h): a stable
// sort by the key bits [begin_bit, end_bit), as CUB's radix sort is; the size
// query (temp == nullptr) asks for one byte of temporary storage. The sort runs
// in its stream's order (pending.h), and fails on a stream of another device
// than the current one.
#ifndef THIRD_PARTY_CUDA_EMU_CUB_H_
#define THIRD_PARTY_CUDA_EMU_CUB_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "third_party/cuda/emu/pending.h"
#include "third_party/cuda/emu/stream_device.h"

namespace cub {

struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                               const V* values_in, V* values_out, int num_items, int begin_bit = 0,
                               int end_bit = static_cast<int>(sizeof(K) * 8),
                               cudaStream_t stream = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    if (temp_bytes < 1 || num_items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) ||
        begin_bit > end_bit) {
      return cudaErrorInvalidValue;
    }
    if (!::cuda_emu::StreamOnCurrentDevice(stream, "cub::DeviceRadixSort::SortPairs")) {
      return cudaErrorInvalidResourceHandle;
    }
    if (!::cuda_emu::KernelsRun()) {
      ::cuda_emu::RunOnStream(stream, [] {});
      return cudaSuccess;
    }
    // Stream-ordered, as CUB's kernels are (deferred where the stream defers).
    ::cuda_emu::RunOnStream(stream, [=] {
      const int bits = end_bit - begin_bit;
      const unsigned long long mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
      auto digit = [&](K k) { return (static_cast<unsigned long long>(k) >> begin_bit) & mask; };
      std::vector<int> order(static_cast<size_t>(num_items));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return digit(keys_in[a]) < digit(keys_in[b]); });
      std::vector<K> k(order.size());
      std::vector<V> v(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        k[i] = keys_in[order[i]];
        v[i] = values_in[order[i]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub

#endif  // THIRD_PARTY_CUDA_EMU_CUB_H_
