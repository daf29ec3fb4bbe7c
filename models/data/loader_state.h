// Data-parallel batch geometry and the saveable position of a data loader.
//
// Rank r of W with a per-rank batch of B rows gets rows [r*B, (r+1)*B) of the
// global batch of W*B rows at each step, so the union over ranks of a step is
// exactly what one process with batch W*B sees, in the same order. With
// gradient accumulation over K micro-batches the global batch is K*W*B rows:
// micro-batch m of rank r is global rows [(m*W + r)*B, (m*W + r + 1)*B), and a
// loader returns the rank's K micro-batches as K*B rows, micro-batch m at
// local rows [m*B, (m+1)*B).
//
// A loader's state is its next step plus a description of everything that
// determines its samples (source fingerprint, global batch, lengths), so a
// restore into a differently configured loader fails instead of silently
// changing the data. Data-parallel layout (W, B, K) may change on resume as
// long as the global batch K*W*B stays the same.
#ifndef MODELS_DATA_LOADER_STATE_H_
#define MODELS_DATA_LOADER_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace data {

struct DataParallel {
  int64_t batch_size = 1;     // B: rows per rank and micro-batch
  int rank = 0;               // r in [0, world_size)
  int world_size = 1;         // W
  int64_t micro_batches = 1;  // K: micro-batches per step (gradient accumulation)

  // Rows a loader returns per step on this rank: K*B.
  int64_t local_rows() const { return micro_batches * batch_size; }
  int64_t global_batch_size() const { return micro_batches * world_size * batch_size; }
  // The global row of local row i in [0, K*B).
  int64_t GlobalRow(int64_t i) const {
    return (i / batch_size * world_size + rank) * batch_size + i % batch_size;
  }
  // InvalidArgument (naming `who`) unless B >= 1, W >= 1, 0 <= r < W, K >= 1
  // and K*W*B < 2^31.
  absl::Status Validate(absl::string_view who) const;
};

struct LoaderState {
  int64_t step = 0;    // the step Next() returns next
  std::string config;  // what determines the samples; see above

  // "step=<n>;<config>": fits in checkpoint metadata (a string map).
  std::string ToString() const;
  static absl::StatusOr<LoaderState> FromString(absl::string_view s);
};

// OK when `saved` may be restored into a loader whose config is `config_now`;
// otherwise InvalidArgument showing both configs. A saved config without the
// sources' "content=" digests (a checkpoint from before them) is compared
// with `config_now`'s left out.
absl::Status CheckRestore(const LoaderState& saved, absl::string_view config_now,
                          absl::string_view who);

}  // namespace data

#endif  // MODELS_DATA_LOADER_STATE_H_
