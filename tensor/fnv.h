// FNV-1a (64-bit): a stable hash of bytes, the same on every host and build.
// Used where a value must agree across processes and runs: parameter and
// checkpoint seeds keyed by a module's name, host names, data digests and
// configurations compared over ranks. Not for security.
//
// The default start, kFnv1aBasis, is this project's: 1469598103934665603,
// the published offset basis (kFnv1aPublishedBasis, 14695981039346656037)
// short of its last digit. It stays, as parameter initialization, activation
// checkpointing's seeds and the data digests checkpoints record depend on it;
// start from kFnv1aPublishedBasis for the published hash.
#ifndef TENSOR_FNV_H_
#define TENSOR_FNV_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tensor {

inline constexpr uint64_t kFnv1aBasis = 1469598103934665603ull;
inline constexpr uint64_t kFnv1aPublishedBasis = 14695981039346656037ull;  // 0xcbf29ce484222325
inline constexpr uint64_t kFnv1aPrime = 1099511628211ull;                  // 0x100000001b3

// FNV-1a of `bytes`, continuing from `h` (kFnv1aBasis for a fresh hash).
inline uint64_t Fnv1a64(absl::string_view bytes, uint64_t h = kFnv1aBasis) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnv1aPrime;
  }
  return h;
}

}  // namespace tensor

#endif  // TENSOR_FNV_H_
