// Data parallelism for the train binaries, its configuration: the flags
// (--backend, --strategy, --auto_wrap, ...), the launcher's environment, the
// rendezvous, and the checked DataParallelConfig they make. At run time:
// data_parallel.cc.
#include "models/common/data_parallel.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <cstring>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "dist/redis_keys.h"
#include "tensor/cuda_backend.h"
#include "tensor/tensor.h"

namespace train {
namespace {

// The variable's value parsed as an int in [min, max]; `fallback` when unset
// (nullopt fallback: required).
absl::StatusOr<int> EnvInt(const GetEnvFn& getenv, const char* name, std::optional<int> fallback,
                           int min, int max) {
  const char* value = getenv(name);
  if (value == nullptr || value[0] == '\0') {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=gloo: ", name,
                     " is not set; start the workers with //tools:launch (or torchrun), which "
                     "sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and the run's "
                     "id and restart count (RUN_ID, RESTART_COUNT; torchrun's "
                     "TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT), or use "
                     "--backend=threads"));
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=gloo: ", name, "='", value, "' is not an integer in [", min, ", ", max, "]"));
  }
  return static_cast<int>(v);
}

// Keeps [A-Za-z0-9.-], maps the rest to '_': a safe piece of a file name.
std::string FileNamePiece(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  }
  return out;
}

}  // namespace

// ---- Flags ----

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "threads") return Backend::kThreads;
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("--backend='", name, "' is not one of threads, gloo, nccl"));
}

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kThreads:
      return "threads";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
  }
  return "?";
}

absl::StatusOr<Strategy> ParseStrategy(absl::string_view name) {
  if (name == "ddp") return Strategy::kDdp;
  if (name == "zero1") return Strategy::kZero1;
  if (name == "shard_grad_op") return Strategy::kShardGradOp;
  if (name == "full_shard" || name.empty()) return Strategy::kFullShard;
  if (name == "no_shard") return Strategy::kNoShard;
  if (name == "hybrid_shard") return Strategy::kHybridShard;
  if (name == "hybrid_shard_zero2") return Strategy::kHybridShardZero2;
  // DeepSpeed's stages by the names PyTorch FSDP gives them.
  std::string hint;
  if (name == "zero2" || name == "zero_2" || name == "zero-2") {
    hint = " (DeepSpeed's ZeRO-2 is shard_grad_op)";
  } else if (name == "zero3" || name == "zero_3" || name == "zero-3") {
    hint = " (DeepSpeed's ZeRO-3 is full_shard)";
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--strategy='", name,
                   "' is not one of ddp, zero1, shard_grad_op, full_shard, no_shard, "
                   "hybrid_shard, hybrid_shard_zero2",
                   hint));
}

absl::string_view StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kDdp:
      return "DDP";
    case Strategy::kZero1:
      return "ZeRO-1";
    case Strategy::kShardGradOp:
      return "FSDP SHARD_GRAD_OP";
    case Strategy::kFullShard:
      return "FSDP FULL_SHARD";
    case Strategy::kHybridShard:
      return "FSDP HYBRID_SHARD";
    case Strategy::kHybridShardZero2:
      return "FSDP HYBRID_SHARD_ZERO2";
    case Strategy::kNoShard:
      return "FSDP NO_SHARD";
  }
  return "?";
}

bool IsFsdp(Strategy strategy) {
  return strategy != Strategy::kDdp && strategy != Strategy::kZero1;
}

bool IsHybrid(Strategy strategy) {
  return strategy == Strategy::kHybridShard || strategy == Strategy::kHybridShardZero2;
}

absl::StatusOr<dist::WrapPolicy> ParseAutoWrap(absl::string_view spec,
                                               const std::set<std::string>& block_classes) {
  if (spec == "none") return dist::WrapPolicy::None();
  if (spec == "transformer") return dist::WrapPolicy::Transformer(block_classes);
  if (absl::StartsWith(spec, "size:")) {
    int64_t min_params = 0;
    if (!absl::SimpleAtoi(spec.substr(5), &min_params) || min_params < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--auto_wrap='", spec,
                                                     "': size:N needs a whole number N >= 1 (the "
                                                     "fewest parameters of a unit)"));
    }
    return dist::WrapPolicy::SizeBased(min_params);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--auto_wrap='", spec, "' is not one of none, transformer, size:N"));
}

// ---- The launcher's environment ----

absl::StatusOr<LaunchEnv> ReadLaunchEnv(const GetEnvFn& getenv) {
  LaunchEnv env;
  absl::StatusOr<int> world = EnvInt(getenv, "WORLD_SIZE", std::nullopt, 1, 1 << 20);
  if (!world.ok()) return world.status();
  env.world_size = *world;
  absl::StatusOr<int> rank = EnvInt(getenv, "RANK", std::nullopt, 0, env.world_size - 1);
  if (!rank.ok()) return rank.status();
  env.rank = *rank;
  absl::StatusOr<int> local_world =
      EnvInt(getenv, "LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size);
  if (!local_world.ok()) return local_world.status();
  env.local_world_size = *local_world;
  absl::StatusOr<int> local_rank =
      EnvInt(getenv, "LOCAL_RANK", env.rank % env.local_world_size, 0, env.local_world_size - 1);
  if (!local_rank.ok()) return local_rank.status();
  env.local_rank = *local_rank;
  absl::StatusOr<int> port = EnvInt(getenv, "MASTER_PORT", 0, 0, 65535);
  if (!port.ok()) return port.status();
  env.master_port = *port;
  // //tools:launch's names, else torchrun's (TORCHELASTIC_*), so that runs and
  // restarts under torchrun keep their rendezvous keys apart too.
  const auto set = [&](const char* name) {
    const char* v = getenv(name);
    return v != nullptr && v[0] != '\0';
  };
  absl::StatusOr<int> restart =
      EnvInt(getenv, set("RESTART_COUNT") ? "RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT", 0, 0,
             INT_MAX);
  if (!restart.ok()) return restart.status();
  env.restart_count = *restart;
  const char* addr = getenv("MASTER_ADDR");
  env.master_addr = addr == nullptr ? "" : addr;
  const char* run_id = getenv(set("RUN_ID") ? "RUN_ID" : "TORCHELASTIC_RUN_ID");
  env.run_id = run_id == nullptr ? "" : run_id;
  const char* error_file = getenv("TORCHELASTIC_ERROR_FILE");
  env.error_file = error_file == nullptr ? "" : error_file;
  return env;
}

absl::Status CheckOwnedStore(const std::string& store) {
  const std::string base = std::filesystem::path(store).parent_path().string();
  if (::mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create the rendezvous folder ", base, ": ", std::strerror(errno),
        " (give --rdzv=<a folder of yours>, or another TMPDIR)"));
  }
  struct stat st {};
  std::string wrong;
  if (::lstat(base.c_str(), &st) != 0) {
    wrong = std::strerror(errno);
  } else if (!S_ISDIR(st.st_mode)) {
    wrong = "it is not a folder";
  } else if (st.st_uid != ::getuid()) {
    wrong = absl::StrCat("it belongs to uid ", st.st_uid, ", not to this user (uid ", ::getuid(),
                         ")");
  } else if ((st.st_mode & 022) != 0 && ::chmod(base.c_str(), 0700) != 0) {
    // Ours (an older version made it under a permissive umask): made 0700.
    wrong = absl::StrFormat("others may write it (mode %04o) and chmod 700 failed: %s",
                            st.st_mode & 07777, std::strerror(errno));
  }
  if (wrong.empty() && ::lstat(store.c_str(), &st) == 0) {
    // The run's folder in it, from an earlier attempt: ours, not a link.
    const std::string run = absl::StrCat(" (", store, ")");
    if (!S_ISDIR(st.st_mode)) {
      wrong = absl::StrCat("its run folder", run, " is not a folder");
    } else if (st.st_uid != ::getuid()) {
      wrong = absl::StrCat("its run folder", run, " belongs to uid ", st.st_uid);
    }
  }
  if (wrong.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the default rendezvous folder ", base, " is not this user's alone: ", wrong,
      "; another user could forge this run's keys there. Remove it (rm -r ", base,
      "), or give --rdzv=<a folder of yours> or another TMPDIR"));
}

std::string TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

absl::StatusOr<Rendezvous> ResolveRendezvous(const std::string& rdzv, const LaunchEnv& env,
                                             const std::string& temp_dir, int64_t uid) {
  Rendezvous r;
  const std::string attempt = absl::StrCat("restart", env.restart_count);
  if (!rdzv.empty()) {
    if (rdzv == "file://" || rdzv == "redis://") {
      return absl::InvalidArgumentError(absl::StrCat("--rdzv='", rdzv, "' names no store"));
    }
    // "host:29400" (torchrun's --rdzv-endpoint) would be a relative folder.
    const size_t colon = rdzv.rfind(':');
    const bool endpoint = rdzv.find('/') == std::string::npos && colon != std::string::npos &&
                          colon + 1 < rdzv.size() &&
                          rdzv.find_first_not_of("0123456789", colon + 1) == std::string::npos;
    if (endpoint || (absl::StrContains(rdzv, "://") && !absl::StartsWith(rdzv, "file://") &&
                     !absl::StartsWith(rdzv, "redis://"))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rdzv='", rdzv, "': the ranks meet in a directory every node sees (DIR or "
          "file://DIR) or a Redis server (redis://host:port); torchrun's tcp:// / c10d:// "
          "stores and host:port endpoints are not spoken here"));
    }
    if (absl::StartsWith(rdzv, "redis://")) {  // with the flags, not at the rendezvous
      const absl::Status endpoint = dist::ParseRedisStore(rdzv).status();
      if (!endpoint.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--rdzv: ", endpoint.message()));
      }
    }
    r.store = rdzv;
    r.prefix = absl::StrCat(env.run_id.empty() ? "run" : FileNamePiece(env.run_id), "/", attempt);
    return r;
  }
  if (env.local_world_size < env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=gloo or nccl on several nodes (WORLD_SIZE=", env.world_size,
        ", LOCAL_WORLD_SIZE=", env.local_world_size,
        ") needs --rdzv=<a directory every node shares> (gloo also takes redis://host:port); "
        "the default rendezvous directory is local to one node"));
  }
  std::vector<std::string> missing;
  if (env.master_addr.empty()) missing.push_back("MASTER_ADDR");
  if (env.master_port == 0) missing.push_back("MASTER_PORT");
  if (env.run_id.empty()) missing.push_back("RUN_ID");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=gloo or nccl without --rdzv needs ", absl::StrJoin(missing, ", "),
        " in the environment (//tools:launch sets them, torchrun its TORCHELASTIC_RUN_ID; "
        "RUN_ID keeps the rendezvous keys of earlier runs apart), or --rdzv=<a fresh "
        "directory> or redis://host:port"));
  }
  // A folder of this user's per run: a job of another user on the same
  // port does not meet a folder it cannot write, and the run removes its
  // keys when it ends well. torchrun without --rdzv-id gives every job the
  // run id "none"; its agent's log folder for the run (TORCHELASTIC_ERROR_FILE
  // is <it>/attempt_<n>/<local rank>/error.json) tells one agent's jobs apart.
  std::string run = FileNamePiece(env.run_id);
  if (env.run_id == "none" && !env.error_file.empty()) {
    const std::filesystem::path agent_run =
        std::filesystem::path(env.error_file).parent_path().parent_path().parent_path();
    if (!agent_run.filename().empty()) {
      absl::StrAppend(&run, "_", FileNamePiece(agent_run.filename().string()));
    }
  }
  r.store = absl::StrCat(temp_dir, "/fsdp_rdzv_u", uid, "_", FileNamePiece(env.master_addr), "_",
                         env.master_port, "/", run);
  r.prefix = absl::StrCat(FileNamePiece(env.run_id), "/", attempt);
  r.owned = true;
  return r;
}

// ---- The configuration ----

bool WantsDataParallel(const DataParallelFlags& flags) {
  // A negative --world_size goes on to ConfigureDataParallel, which names it.
  return flags.world_size < 0 || flags.world_size > 1 || !flags.strategy.empty() ||
         flags.backend != "threads";
}

std::string DataParallelConfig::Describe() const {
  std::string s(StrategyName(strategy));
  if (IsFsdp(strategy)) absl::StrAppend(&s, " (auto_wrap ", auto_wrap, ")");
  absl::StrAppend(&s, " over ", world_size, world_size == 1 ? " rank (" : " ranks (",
                  BackendName(backend), ")");
  if (!device.is_cpu()) {
    std::string where = device.ToString();
    if (backend == Backend::kNccl) {  // NcclRankDevice
      where = device.index == env.local_rank ? "cuda:LOCAL_RANK"
                                             : "cuda:0 (each rank's one visible GPU)";
    }
    absl::StrAppend(&s, " on ", where);
  }
  if (cpu_offload) absl::StrAppend(&s, ", CPU offload");
  return s;
}

namespace {

// The hybrid strategies' shard group: --hybrid_shard_group_size, or the
// ranks of one node (LOCAL_WORLD_SIZE, `local_world_size` > 0) with gloo; it
// must divide the world size. Other strategies: the flag must be 0.
absl::Status ResolveHybridShardGroup(int flag, int local_world_size, DataParallelConfig& config) {
  if (!IsHybrid(config.strategy)) {
    if (flag != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hybrid_shard_group_size=", flag,
                       " applies to --strategy=hybrid_shard or hybrid_shard_zero2 only"));
    }
    return absl::OkStatus();
  }
  const std::string strategy = config.strategy == Strategy::kHybridShard
                                   ? "--strategy=hybrid_shard"
                                   : "--strategy=hybrid_shard_zero2";
  const int group = flag > 0 ? flag : local_world_size;
  if (group == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        strategy,
        " with --backend=threads needs --hybrid_shard_group_size (the ranks of one shard group, "
        "e.g. the GPUs of a node)"));
  }
  if (config.world_size % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(strategy, ": a shard group of ", group,
                     flag > 0 ? " (--hybrid_shard_group_size)" : " (LOCAL_WORLD_SIZE)",
                     " ranks does not divide the world size ", config.world_size));
  }
  config.hybrid_shard_group_size = group;
  return absl::OkStatus();
}

// --device and --cpu_offload against the backend and strategy.
absl::Status ResolveDevice(const DataParallelFlags& flags, DataParallelConfig& config) {
  absl::StatusOr<tensor::Device> device = tensor::ParseDevice(flags.device);
  if (!device.ok()) return device.status();
  config.device = *device;
  if (device->is_cuda()) {
    if (config.backend == Backend::kGloo) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend=gloo runs collectives on the CPU; with --device=", flags.device,
          " use --backend=nccl (one process per GPU, through //tools:launch) or "
          "--backend=threads (ranks sharing the GPU)"));
    }
  } else if (config.backend == Backend::kNccl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=nccl needs --device=cuda (each rank on cuda:LOCAL_RANK), got --device=",
        flags.device));
  }
  if (config.backend == Backend::kNccl && flags.device != "cuda") {
    // An index would be replaced by each rank's LOCAL_RANK without a word.
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=nccl puts each rank on cuda:LOCAL_RANK: give --device=cuda, not --device=",
        flags.device, " (CUDA_VISIBLE_DEVICES chooses which GPUs a node's ranks use)"));
  }
  config.cpu_offload = flags.cpu_offload;
  if (flags.cpu_offload && (!device->is_cuda() || !IsFsdp(config.strategy))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpu_offload keeps FSDP's shards, gradients and optimizer state in host memory: it "
        "needs an FSDP strategy and --device=cuda (got --device=",
        flags.device, ")"));
  }
  return absl::OkStatus();
}

// The flags set to other than their defaults, as "--name=value", among
// FSDP's units' (`units`: their prefetch and wrapping) and the gradient
// buckets' of DDP and ZeRO-1 (`buckets`).
// Of those, the prefetch flags along the recorded order: --forward_prefetch,
// --backward_prefetch and (`with_inflight`) --max_inflight_all_gathers.
std::vector<std::string> PrefetchFlagsOffDefault(const DataParallelFlags& f, bool with_inflight) {
  const DataParallelFlags d;
  std::vector<std::string> given;
  if (f.forward_prefetch != d.forward_prefetch) given.push_back("--forward_prefetch");
  if (f.backward_prefetch != d.backward_prefetch) {
    given.push_back(absl::StrCat("--backward_prefetch=", f.backward_prefetch));
  }
  if (with_inflight && f.max_inflight_all_gathers != d.max_inflight_all_gathers) {
    given.push_back(absl::StrCat("--max_inflight_all_gathers=", f.max_inflight_all_gathers));
  }
  return given;
}

std::vector<std::string> FlagsOffDefault(const DataParallelFlags& f, bool units, bool buckets) {
  const DataParallelFlags d;
  std::vector<std::string> given;
  if (units) {
    given = PrefetchFlagsOffDefault(f, /*with_inflight=*/true);
    if (f.auto_wrap != d.auto_wrap) given.push_back(absl::StrCat("--auto_wrap=", f.auto_wrap));
  }
  if (buckets) {
    if (f.bucket_cap_mb != d.bucket_cap_mb) {
      given.push_back(absl::StrCat("--bucket_cap_mb=", f.bucket_cap_mb));
    }
    if (f.max_inflight_buckets != d.max_inflight_buckets) {
      given.push_back(absl::StrCat("--max_inflight_buckets=", f.max_inflight_buckets));
    }
  }
  return given;
}

// Flags set to other than their defaults that `strategy` does not read: the
// FSDP units' prefetch and wrapping under DDP / ZeRO-1, the gradient buckets'
// sizes under FSDP. They were ignored without a word.
absl::Status CheckFlagsApply(const DataParallelFlags& f, Strategy strategy) {
  const bool fsdp = IsFsdp(strategy);
  const std::vector<std::string> given = FlagsOffDefault(f, !fsdp, fsdp);
  if (given.empty()) return absl::OkStatus();
  if (fsdp) {
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(given, " "),
        ": gradient buckets are --strategy=ddp's and zero1's; --strategy=",
        f.strategy.empty() ? "full_shard (the default)" : f.strategy,
        " reduces gradients unit by unit (--auto_wrap sets the units)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      absl::StrJoin(given, " "), ": FSDP's units and their all-gathers; --strategy=", f.strategy,
      " has none (its gradients go in buckets: --bucket_cap_mb, --max_inflight_buckets)"));
}

}  // namespace

absl::StatusOr<DataParallelConfig> ConfigureDataParallel(const DataParallelFlags& flags,
                                                         const std::set<std::string>& block_classes,
                                                         const GetEnvFn& getenv) {
  DataParallelConfig config;
  absl::StatusOr<Backend> backend = ParseBackend(flags.backend);
  if (!backend.ok()) return backend.status();
  config.backend = *backend;
  absl::StatusOr<Strategy> strategy = ParseStrategy(flags.strategy);
  if (!strategy.ok()) return strategy.status();
  config.strategy = *strategy;
  absl::StatusOr<dist::WrapPolicy> policy = ParseAutoWrap(flags.auto_wrap, block_classes);
  if (!policy.ok()) return policy.status();
  config.policy = *policy;
  config.auto_wrap = flags.auto_wrap;
  absl::StatusOr<precision::MixedPrecisionPolicy> mixed =
      precision::MixedPrecisionPolicy::FromName(flags.precision);
  if (!mixed.ok()) return mixed.status();
  config.mixed_precision = *mixed;  // every strategy: fp32 masters, low-precision compute
  absl::Status s;
  if (flags.backward_prefetch == "pre") {
    config.backward_prefetch = dist::BackwardPrefetch::kPre;
  } else if (flags.backward_prefetch == "post") {
    config.backward_prefetch = dist::BackwardPrefetch::kPost;
  } else if (flags.backward_prefetch == "none") {
    config.backward_prefetch = dist::BackwardPrefetch::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backward_prefetch='", flags.backward_prefetch, "' is not one of pre, post, none"));
  }
  config.forward_prefetch = flags.forward_prefetch;
  if (flags.max_inflight_all_gathers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max_inflight_all_gathers=",
                                                   flags.max_inflight_all_gathers,
                                                   " must be >= 1 (1: no prefetch)"));
  }
  config.max_inflight_all_gathers = flags.max_inflight_all_gathers;
  if (flags.prefetch_units < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefetch_units=", flags.prefetch_units, " must be >= 0 (0: none)"));
  }
  if (flags.prefetch_units > 0 && !IsFsdp(config.strategy)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefetch_units=", flags.prefetch_units,
        " names FSDP units to all-gather ahead; --strategy=", flags.strategy, " has none"));
  }
  if (flags.prefetch_units > 0) {
    // The units' lists replace the prefetch along the recorded order, and
    // gather whatever --max_inflight_all_gathers says (dist::PrefetchNeighbors),
    // which under --cpu_offload still sizes the upload slots.
    const std::vector<std::string> replaced =
        PrefetchFlagsOffDefault(flags, /*with_inflight=*/!flags.cpu_offload);
    if (!replaced.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prefetch_units=", flags.prefetch_units, " prefetches that many units ahead ",
          "of each one's forward and backward in place of ", absl::StrJoin(replaced, ", "),
          ", which it would ignore: give one or the other"));
    }
  }
  config.prefetch_units = flags.prefetch_units;
  if (flags.keep_last_unit && config.strategy != Strategy::kFullShard &&
      config.strategy != Strategy::kHybridShard) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep_last_unit keeps a unit FULL_SHARD or HYBRID_SHARD would reshard after "
                     "its forward; --strategy=",
                     flags.strategy, " reshards none"));
  }
  config.keep_last_unit = flags.keep_last_unit;
  if (WantsDataParallel(flags)) {  // the one-process loop: CheckOneProcessFlags
    s = CheckFlagsApply(flags, config.strategy);
    if (!s.ok()) return s;
  }
  if (flags.hybrid_shard_group_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hybrid_shard_group_size=", flags.hybrid_shard_group_size, " must be >= 0"));
  }
  if (!(flags.bucket_cap_mb > 0) || flags.bucket_cap_mb > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bucket_cap_mb=", flags.bucket_cap_mb, " must be in (0, 1e6]"));
  }
  config.bucket_cap_mb = flags.bucket_cap_mb;
  if (flags.max_inflight_buckets < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_buckets=", flags.max_inflight_buckets, " must be >= 0 (0: no bound)"));
  }
  if (flags.max_inflight_buckets != DataParallelFlags().max_inflight_buckets &&
      !IsFsdp(config.strategy) && config.mixed_precision.reduce_dtype == tensor::Dtype::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_buckets=", flags.max_inflight_buckets,
        " bounds the low-precision copies of the buckets in flight (--precision=bf16 or fp16); "
        "with --precision=", flags.precision, " the buckets reduce in place and nothing reads it"));
  }
  config.max_inflight_buckets = flags.max_inflight_buckets;
  if (!(flags.timeout_s > 0) || flags.timeout_s > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout_s=", flags.timeout_s, " must be in (0, 1e6] seconds"));
  }
  config.timeout = absl::Seconds(flags.timeout_s);
  s = ResolveDevice(flags, config);
  if (!s.ok()) return s;
  if (flags.world_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size=", flags.world_size, " must be >= 1"));
  }
  if (config.backend == Backend::kThreads) {
    // Under a launcher every process would train the whole job on its own
    // (each saving into the same --checkpoint_dir).
    const char* launched = getenv("WORLD_SIZE");
    int launched_world = 0;
    if (launched != nullptr && absl::SimpleAtoi(launched, &launched_world) && launched_world > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WORLD_SIZE=", launched_world, " is set (a launcher such as //tools:launch or torchrun "
          "started this process) but --backend=threads trains within one process: each of the ",
          launched_world, " processes would train the whole job alone; add --backend=gloo (or "
          "nccl) to train them together, or run without the launcher (--world_size=N runs N "
          "ranks as threads)"));
    }
    config.world_size = flags.world_size == 0 ? 1 : flags.world_size;
    constexpr int kMaxThreadRanks = 1024;
    if (config.world_size > kMaxThreadRanks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--world_size=", config.world_size, ": the threads engine runs every rank as a thread "
          "of this process, each with its own model; at most ", kMaxThreadRanks,
          " (more ranks: --backend=gloo over processes)"));
    }
    if (!flags.rdzv.empty()) {
      return absl::InvalidArgumentError(
          "--rdzv applies to --backend=gloo only (the threads engine needs no rendezvous)");
    }
    s = ResolveHybridShardGroup(flags.hybrid_shard_group_size, 0, config);
    if (!s.ok()) return s;
    return config;
  }
  absl::StatusOr<LaunchEnv> env = ReadLaunchEnv(getenv);
  if (!env.ok()) return env.status();
  if (flags.world_size != 0 && flags.world_size != env->world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--world_size=", flags.world_size, " disagrees with WORLD_SIZE=", env->world_size,
        " from the launcher; with --backend=", BackendName(config.backend),
        " the launcher sets the world size (--nproc_per_node x --nnodes): leave --world_size "
        "out"));
  }
  config.env = *env;
  config.world_size = env->world_size;
  absl::StatusOr<Rendezvous> rdzv =
      ResolveRendezvous(flags.rdzv, *env, TempDir(), ::getuid());
  if (!rdzv.ok()) return rdzv.status();
  if (config.backend == Backend::kNccl) {
    if (absl::StartsWith(rdzv->store, "redis://")) {
      return absl::InvalidArgumentError(
          "--backend=nccl meets through a directory store: --rdzv=<a directory every rank "
          "sees>, not redis://");
    }
    if (absl::StartsWith(rdzv->store, "file://")) rdzv->store = rdzv->store.substr(7);
    absl::StatusOr<tensor::Device> gpu = NcclRankDevice(*env, tensor::cuda::DeviceCount());
    if (!gpu.ok()) return gpu.status();
    config.device = *gpu;  // one GPU per rank of a node
  }
  config.rendezvous = *rdzv;
  s = ResolveHybridShardGroup(flags.hybrid_shard_group_size, env->local_world_size, config);
  if (!s.ok()) return s;
  return config;
}

absl::StatusOr<tensor::Device> NcclRankDevice(const LaunchEnv& env, int visible) {
  if (visible == 1) return tensor::Device::Cuda(0);  // this rank's own GPU
  if (visible == 0 || visible >= env.local_world_size) {
    return tensor::Device::Cuda(env.local_rank);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--backend=nccl runs one rank per GPU: this node runs ", env.local_world_size,
      " ranks (LOCAL_WORLD_SIZE) but this process sees ", visible,
      " CUDA devices (CUDA_VISIBLE_DEVICES). Give every rank of the node all of its GPUs (at "
      "least one a rank: rank LOCAL_RANK uses cuda:LOCAL_RANK) or each rank one GPU of its "
      "own, launch fewer ranks a node (--nproc_per_node), or share a GPU with "
      "--backend=threads"));
}

absl::Status CheckOneProcessFlags(const DataParallelFlags& flags,
                                  const std::set<std::string>& block_classes) {
  absl::StatusOr<DataParallelConfig> checked = ConfigureDataParallel(flags, block_classes);
  if (!checked.ok()) return checked.status();
  std::string asked;  // the FSDP feature asked for
  if (flags.cpu_offload) asked = "--cpu_offload";
  if (flags.forward_prefetch) asked = "--forward_prefetch";
  if (flags.prefetch_units > 0) asked = absl::StrCat("--prefetch_units=", flags.prefetch_units);
  if (flags.keep_last_unit) asked = "--keep_last_unit";
  if (asked.empty()) {
    // What only data parallelism reads, set to other than its default
    // (--timeout_s, a bound that changes no result, may stay in a script's
    // flags for every run).
    const std::vector<std::string> given = FlagsOffDefault(flags, true, true);
    if (given.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        absl::StrJoin(given, " "), ": data parallelism's, and one process without --strategy or "
        "--world_size trains without it; add --strategy (it runs with one rank too)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(asked,
                   " is an FSDP option, and one process without --strategy trains without FSDP; "
                   "add --strategy=full_shard (it runs with one rank too)"));
}

}  // namespace train
