// TellPeersOfFailure (failure_notice.h): a rank's failure before joining,
// said in the store its engine meets through.
#include "models/common/failure_notice.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "dist/file_store.h"
#include "dist/gloo_group.h"
#include "dist/nccl_rendezvous.h"

namespace train {

void TellPeersOfFailure(const DataParallelFlags& flags, const GetEnvFn& getenv,
                        const absl::Status& failure) {
  if (failure.ok() || (flags.backend != "gloo" && flags.backend != "nccl")) return;
  const absl::StatusOr<LaunchEnv> env = ReadLaunchEnv(getenv);
  if (!env.ok() || env->world_size < 2) return;
  const absl::StatusOr<Rendezvous> rdzv =
      ResolveRendezvous(flags.rdzv, *env, TempDir(), ::getuid());
  if (!rdzv.ok() || rdzv->owned) return;
  const std::string why(failure.message());
  absl::StatusOr<bool> said;
  if (flags.backend == "gloo") {
    dist::GlooGroupOptions options;
    options.store = rdzv->store;
    options.prefix = rdzv->prefix;
    said = dist::AnnounceGlooFailure(env->rank, env->world_size, options, why);
  } else if (absl::StartsWith(rdzv->store, "redis://")) {
    return;  // the nccl engine meets through a folder only (refused at its flags)
  } else {
    absl::StatusOr<std::unique_ptr<dist::FileStore>> store = dist::FileStore::Open(
        std::string(absl::StripPrefix(rdzv->store, "file://")), absl::Seconds(10));
    if (!store.ok()) {
      said = store.status();
    } else {
      said = dist::nccl::AnnounceFailure(**store, rdzv->prefix, env->rank, env->world_size, why);
    }
  }
  if (!said.ok()) {
    std::fprintf(stderr, "train: note: could not tell the other ranks of this failure: %s\n",
                 std::string(said.status().message()).c_str());
  }
}

}  // namespace train
