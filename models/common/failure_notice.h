// What a launched rank (--backend=gloo or nccl) that fails before it joins
// its group leaves for the others: its failure, in the rendezvous store, so
// that the ranks waiting for it there fail at once naming it instead of at
// their --timeout_s (dist/launch_layout.h). The case a launcher cannot see:
// on several nodes each node's launcher stops only its own workers, so a
// --data missing on one node left the other nodes waiting.
#ifndef MODELS_COMMON_FAILURE_NOTICE_H_
#define MODELS_COMMON_FAILURE_NOTICE_H_

#include "absl/status/status.h"
#include "models/common/data_parallel.h"

namespace train {

// After `failure` ended a train binary: when `flags` ask for --backend=gloo
// or nccl over a shared store (--rdzv: a folder every node sees, or Redis
// for gloo) and the launcher's environment (`getenv`) names a rank of a
// world of two or more, says in that store that this rank failed before
// joining, and why (its message). Nothing when the rank joined (its peers
// learn of its failure from the group), another rank's failure was said
// first, or the run is the default folder's (one node, whose launcher stops
// every worker when one fails). A store this cannot reach is said on stderr,
// as a note: the failure itself stands.
void TellPeersOfFailure(const DataParallelFlags& flags, const GetEnvFn& getenv,
                        const absl::Status& failure);

}  // namespace train

#endif  // MODELS_COMMON_FAILURE_NOTICE_H_
