// The NCCL settings the nccl engine (dist/nccl_group.h) chooses for a
// process, each only where neither the environment nor NCCL's configuration
// files (NCCL_CONF_FILE, else ~/.nccl.conf and /etc/nccl.conf, read by NCCL
// for the variables the environment leaves unset) set it:
//   NCCL_RUNTIME_CONNECT=0: NCCL (2.22 and later) connects the peers and
//   allocates its buffers at init, while the GPU's memory is free, rather
//   than at the first collective of each kind, when the caching allocator
//   may hold all of it (its cache is released when its own allocations
//   fail, but NCCL's are not its own): an out-of-memory error there breaks
//   the group mid-step. The cost: NCCL sets up every algorithm's connections,
//   used or not (more memory, a longer init). TensorRT-LLM sets it so too.
// Free of CUDA, so that it is tested without a GPU.
#ifndef DIST_NCCL_ENV_H_
#define DIST_NCCL_ENV_H_

#include <functional>
#include <string>

namespace dist {
namespace nccl {

using GetEnv = std::function<const char*(const char*)>;

// Whether one of NCCL's configuration files sets `var` (a line "VAR=value",
// spaces around allowed; "#" starts a comment). `getenv` gives NCCL_CONF_FILE
// and HOME.
bool SetInNcclConfFiles(const std::string& var, const GetEnv& getenv);

// Sets NCCL_RUNTIME_CONNECT=0 in this process's environment unless the
// environment or NCCL's configuration files set it; once a process, before
// NCCL first reads it (at its first communicator init). setenv may race
// with another thread's getenv: call it before starting threads that read
// the environment where possible (the engine calls it first thing).
void ChooseNcclEnvironment();

}  // namespace nccl
}  // namespace dist

#endif  // DIST_NCCL_ENV_H_
