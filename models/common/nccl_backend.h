// --backend=nccl for the train binaries: this process is one rank of a job
// the launcher started, on cuda:LOCAL_RANK, meeting the others through a
// directory store (the rendezvous directory) and talking over NCCL. Real in a
// --config=cuda build (dist::CreateNcclProcessGroup); elsewhere every call
// fails with a message saying how to build it.
#ifndef MODELS_COMMON_NCCL_BACKEND_H_
#define MODELS_COMMON_NCCL_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist/process_group.h"

namespace train {

// What the group needs to outlive it (the store) and the group itself.
struct NcclJob {
  std::shared_ptr<void> store;  // the dist::FileStore the ranks met through
  std::unique_ptr<dist::ProcessGroup> group;
};

// Joins the group of `world_size` ranks as `rank` (local rank `local_rank`
// of `local_world_size` on its node: the nodes' launches are compared) on
// cuda:`device_index` through the FileStore at directory `store_dir`, keys
// under `prefix`. Blocks until every rank joined or `timeout` passed (naming
// the missing ranks).
absl::StatusOr<NcclJob> JoinNcclJob(int rank, int world_size, int local_rank,
                                    int local_world_size, int device_index,
                                    const std::string& store_dir, const std::string& prefix,
                                    absl::Duration timeout);

}  // namespace train

#endif  // MODELS_COMMON_NCCL_BACKEND_H_
