// The data-parallel command-line flags both train binaries take (--backend,
// --world_size, --strategy, --auto_wrap, --timeout_s, --rdzv,
// --backward_prefetch, --forward_prefetch, --max_inflight_all_gathers,
// --prefetch_units, --keep_last_unit,
// --hybrid_shard_group_size, --cpu_offload), defined once here. Link this library into a
// binary to give it the flags; read them with DataParallelFlagsFromCommandLine.
#ifndef MODELS_COMMON_DATA_PARALLEL_FLAGS_H_
#define MODELS_COMMON_DATA_PARALLEL_FLAGS_H_

#include "models/common/data_parallel.h"

namespace train {

// The flags above, after absl::ParseCommandLine. `precision` and `device`,
// which the binary owns, keep their defaults.
DataParallelFlags DataParallelFlagsFromCommandLine();

}  // namespace train

#endif  // MODELS_COMMON_DATA_PARALLEL_FLAGS_H_
