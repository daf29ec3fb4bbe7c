// What a data-parallel run leaves of its rendezvous once it ended well on
// this rank: the run's own folder (the default directory, Rendezvous::owned)
// is removed, a Redis store loses the attempt's keys, and in a shared folder
// given as --rdzv every gloo rank removes the key files it wrote, and an
// nccl run's rank 0 the keys under the attempt's prefix. A run that failed
// leaves them all (a supervisor's restart uses fresh keys).
#ifndef MODELS_COMMON_RUN_KEYS_H_
#define MODELS_COMMON_RUN_KEYS_H_

#include <string>

#include "absl/time/time.h"
#include "dist/process_group.h"

namespace train {

// After a gloo run: once every rank is done with the store (a barrier over
// `pg`; a gloo group does not use it after its rendezvous), rank 0 removes
// the `owned` folder `store` or the keys under `prefix` of a Redis store, and
// in a shared folder every rank removes the key files it wrote (a failure to
// is said on stderr, not fatal: the run is done). A shared folder keeps the
// files of attempts that failed before a restart (Gloo's FileStore names
// them by a hash, not listable by prefix). A peer that failed closes its
// connections, so the barrier fails fast (and nothing is removed).
void RemoveGlooRunKeys(const std::string& store, const std::string& prefix, bool owned,
                       dist::ProcessGroup& pg);

// At the end of an NCCL rank, its group destroyed (which writes the rank's
// departure to the store): every rank counts itself finished in the store
// at `folder` ("<prefix>/finished"), or failed ("<prefix>/failed", `ok`
// false), and rank 0, when it finished, waits for all `world_size` to
// finish, up to `wait`, then removes the folder when it is the run's own
// (`owned`), else (a shared --rdzv folder) the keys under `prefix`. A rank
// that failed, or that did not say within `wait`, keeps them (a run that
// failed keeps its keys); the reason is said on stderr.
void FinishNcclRunFolder(const std::string& folder, const std::string& prefix, bool owned,
                         int rank, int world_size, absl::Duration wait, bool ok);

}  // namespace train

#endif  // MODELS_COMMON_RUN_KEYS_H_
