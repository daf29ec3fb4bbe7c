// --backend=nccl in a build without CUDA (nccl_backend.h): a clear error.
#include "absl/status/status.h"
#include "models/common/nccl_backend.h"

namespace train {

absl::StatusOr<NcclJob> JoinNcclJob(int, int, int, int, int, const std::string&, const std::string&,
                                    absl::Duration) {
  return absl::FailedPreconditionError(
      "--backend=nccl: this binary was built without CUDA support; build it with "
      "--config=cuda (and run it on a GPU machine)");
}

}  // namespace train
