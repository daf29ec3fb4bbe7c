// Errors across ranks for the sharded checkpoint protocol: every rank's status
// (and a payload) all-gathered, so that one rank's failure ends every rank's
// save or load with the same error instead of leaving the others hanging.
// Private to the sharded_checkpoint library.
#ifndef DIST_SHARDED_CHECKPOINT_EXCHANGE_H_
#define DIST_SHARDED_CHECKPOINT_EXCHANGE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dist/process_group.h"

namespace dist::sharded {

// All-gathers every rank's status and payload (a collective; also a barrier).
// OK (with every rank's payload) when every rank is OK; otherwise the same
// error on every rank, naming the failed ranks: "<what>: rank 1 of 4:
// <message>" ("ranks 0, 2 of 4: ..." for one message shared by several, "all
// 4 ranks: ..." when shared by all), with the first failed rank's code.
absl::StatusOr<std::vector<std::string>> Exchange(ProcessGroup& pg, const absl::Status& mine,
                                                  const std::string& payload,
                                                  const std::string& what);

// A check that may fail on some ranks only (it depends on the rank): every
// rank exchanges its result, so all fail with it instead of some waiting in
// the next phase's collective for the ranks that returned.
absl::Status AgreeOnCheck(ProcessGroup& pg, const absl::Status& mine, const std::string& what);

// FailedPrecondition naming each rank's checkpoint id when the ranks staged
// different checkpoints (`ids`: a load's first exchange, by rank).
absl::Status SameCheckpointOnEveryRank(const std::vector<std::string>& ids,
                                       const std::string& what);

}  // namespace dist::sharded

#endif  // DIST_SHARDED_CHECKPOINT_EXCHANGE_H_
