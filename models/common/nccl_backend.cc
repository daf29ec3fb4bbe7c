// --backend=nccl for the train binaries (nccl_backend.h), in a --config=cuda build.
#include "models/common/nccl_backend.h"

#include <utility>

#include "dist/file_store.h"
#include "dist/nccl_group.h"

namespace train {

absl::StatusOr<NcclJob> JoinNcclJob(int rank, int world_size, int local_rank,
                                    int local_world_size, int device_index,
                                    const std::string& store_dir, const std::string& prefix,
                                    absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<dist::FileStore>> store = dist::FileStore::Open(store_dir, timeout);
  if (!store.ok()) return store.status();
  std::shared_ptr<dist::FileStore> shared = std::move(*store);
  dist::NcclGroupOptions options;
  options.prefix = prefix;
  options.timeout = timeout;
  options.local_rank = local_rank;
  options.local_world_size = local_world_size;
  absl::StatusOr<std::unique_ptr<dist::ProcessGroup>> group =
      dist::CreateNcclProcessGroup(rank, world_size, device_index, *shared, options);
  if (!group.ok()) return group.status();
  NcclJob job;
  job.store = shared;
  job.group = std::move(*group);
  return job;
}

}  // namespace train
