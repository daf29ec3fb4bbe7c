// models/common:data_parallel's configuration: flag parsing, the launcher's
// environment and the rendezvous it implies, and the configuration checks
// with their messages (data_parallel_config.cc). Running ranks and each
// strategy's step: data_parallel_test.cc.
#include "models/common/data_parallel.h"

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/wrap_policy.h"
#include "gtest/gtest.h"
#include "models/common/data_parallel_testing.h"
#include "models/mingpt/model.h"
#include "tensor/cuda_backend.h"

namespace train {
namespace {

using namespace dp_testing;  // NOLINT: the shared fixtures

// ---- Flags ----

TEST(ParseTest, Backends) {
  EXPECT_EQ(*ParseBackend("threads"), Backend::kThreads);
  EXPECT_EQ(*ParseBackend("gloo"), Backend::kGloo);
  EXPECT_EQ(*ParseBackend("nccl"), Backend::kNccl);
  absl::StatusOr<Backend> bad = ParseBackend("mpi");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "--backend='mpi' is not one of"));
}

TEST(ParseTest, Strategies) {
  EXPECT_EQ(*ParseStrategy("ddp"), Strategy::kDdp);
  EXPECT_EQ(*ParseStrategy("zero1"), Strategy::kZero1);
  EXPECT_EQ(*ParseStrategy("shard_grad_op"), Strategy::kShardGradOp);
  EXPECT_EQ(*ParseStrategy("full_shard"), Strategy::kFullShard);
  EXPECT_EQ(*ParseStrategy(""), Strategy::kFullShard);
  EXPECT_EQ(*ParseStrategy("no_shard"), Strategy::kNoShard);
  EXPECT_FALSE(IsFsdp(Strategy::kDdp));
  EXPECT_FALSE(IsFsdp(Strategy::kZero1));
  EXPECT_TRUE(IsFsdp(Strategy::kNoShard));
  EXPECT_EQ(StrategyName(Strategy::kFullShard), "FSDP FULL_SHARD");
  EXPECT_EQ(*ParseStrategy("hybrid_shard"), Strategy::kHybridShard);
  EXPECT_TRUE(IsFsdp(Strategy::kHybridShard));
  EXPECT_EQ(*ParseStrategy("hybrid_shard_zero2"), Strategy::kHybridShardZero2);
  EXPECT_TRUE(IsFsdp(Strategy::kHybridShardZero2));
  EXPECT_EQ(StrategyName(Strategy::kHybridShardZero2), "FSDP HYBRID_SHARD_ZERO2");
  EXPECT_TRUE(IsHybrid(Strategy::kHybridShard));
  EXPECT_TRUE(IsHybrid(Strategy::kHybridShardZero2));
  EXPECT_FALSE(IsHybrid(Strategy::kFullShard));
  EXPECT_FALSE(IsHybrid(Strategy::kShardGradOp));
  absl::StatusOr<Strategy> bad = ParseStrategy("fsdp");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "--strategy='fsdp' is not one of"));
}

std::vector<std::string> UnitNames(nn::Module& model, const dist::WrapPolicy& policy) {
  std::vector<std::string> names;
  for (const dist::UnitPlan& unit : dist::PlanUnits(model, policy)) names.push_back(unit.name);
  return names;
}

TEST(ParseTest, AutoWrap) {
  mingpt::GPT model(Tiny());
  EXPECT_EQ(UnitNames(model, *ParseAutoWrap("none", {"Block"})), std::vector<std::string>{""});
  const std::vector<std::string> blocks =
      UnitNames(model, *ParseAutoWrap("transformer", {"Block"}));
  EXPECT_EQ(blocks, (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1"}));
  // size:N is dist's size-based policy: the same units.
  for (int64_t n : {1, 100, 300, 100000}) {
    SCOPED_TRACE(n);
    absl::StatusOr<dist::WrapPolicy> p = ParseAutoWrap(absl::StrCat("size:", n), {"Block"});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(UnitNames(model, *p), UnitNames(model, dist::WrapPolicy::SizeBased(n)));
  }
  EXPECT_GT(UnitNames(model, *ParseAutoWrap("size:1", {"Block"})).size(), blocks.size());
  EXPECT_EQ(UnitNames(model, *ParseAutoWrap("size:100000", {"Block"})).size(), 1u);
  for (const char* bad : {"size:", "size:0", "size:-3", "size:1e3", "blocks", ""}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<dist::WrapPolicy> p = ParseAutoWrap(bad, {"Block"});
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(p.status().message(), "--auto_wrap=")) << p.status();
  }
}

// ---- The launcher's environment ----

TEST(LaunchEnvTest, ReadsTheLaunchersVariables) {
  absl::StatusOr<LaunchEnv> env = ReadLaunchEnv(FakeEnv(LaunchVars(1, 2)));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->master_addr, "127.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->restart_count, 0);
  EXPECT_EQ(env->run_id, "123-456");
  // Only RANK and WORLD_SIZE are required.
  env = ReadLaunchEnv(FakeEnv({{"RANK", "3"}, {"WORLD_SIZE", "4"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 3);
  EXPECT_EQ(env->local_world_size, 4);
  EXPECT_EQ(env->master_port, 0);
  EXPECT_EQ(env->run_id, "");
  // torchrun's names for the run and the restart, when the launcher's are unset.
  std::map<std::string, std::string> torchrun = {{"RANK", "0"},
                                                 {"WORLD_SIZE", "2"},
                                                 {"TORCHELASTIC_RUN_ID", "job7"},
                                                 {"TORCHELASTIC_RESTART_COUNT", "2"}};
  env = ReadLaunchEnv(FakeEnv(torchrun));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->run_id, "job7");
  EXPECT_EQ(env->restart_count, 2);
  torchrun["TORCHELASTIC_RESTART_COUNT"] = "x";
  env = ReadLaunchEnv(FakeEnv(torchrun));
  ASSERT_FALSE(env.ok());
  EXPECT_TRUE(absl::StrContains(env.status().message(), "TORCHELASTIC_RESTART_COUNT='x'"))
      << env.status();
}

TEST(LaunchEnvTest, MissingOrInvalidVariablesAreNamed) {
  struct Case {
    std::string var, value, expected;  // value "" removes the variable
  };
  const std::vector<Case> cases = {
      {"RANK", "", "RANK is not set"},
      {"WORLD_SIZE", "", "WORLD_SIZE is not set"},
      {"RANK", "2", "RANK='2' is not an integer in [0, 1]"},
      {"RANK", "-1", "RANK='-1' is not an integer"},
      {"RANK", "one", "RANK='one' is not an integer"},
      {"WORLD_SIZE", "0", "WORLD_SIZE='0' is not an integer"},
      {"LOCAL_WORLD_SIZE", "3", "LOCAL_WORLD_SIZE='3' is not an integer in [1, 2]"},
      {"MASTER_PORT", "70000", "MASTER_PORT='70000'"},
      {"RESTART_COUNT", "x", "RESTART_COUNT='x'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.var + "=" + c.value);
    std::map<std::string, std::string> vars = LaunchVars(1, 2);
    if (c.value.empty()) {
      vars.erase(c.var);
    } else {
      vars[c.var] = c.value;
    }
    absl::StatusOr<LaunchEnv> env = ReadLaunchEnv(FakeEnv(vars));
    ASSERT_FALSE(env.ok());
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(env.status().message(), c.expected)) << env.status();
  }
}

TEST(RendezvousTest, DefaultDirectoryAndPerRunPrefix) {
  LaunchEnv env = *ReadLaunchEnv(FakeEnv(LaunchVars(0, 2)));
  absl::StatusOr<Rendezvous> r = ResolveRendezvous("", env, "/scratch", 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  // This user's, this run's (removed when the run ends well).
  EXPECT_EQ(r->store, "/scratch/fsdp_rdzv_u1000_127.0.0.1_29500/123-456");
  EXPECT_EQ(r->prefix, "123-456/restart0");
  EXPECT_TRUE(r->owned);
  EXPECT_EQ(ResolveRendezvous("", env, "/scratch", 1001)->store,
            "/scratch/fsdp_rdzv_u1001_127.0.0.1_29500/123-456");
  // Another run, or a restart of this one, meets under other keys.
  env.run_id = "124-999";
  EXPECT_EQ(ResolveRendezvous("", env, "/scratch", 1000)->prefix, "124-999/restart0");
  env.restart_count = 2;
  EXPECT_EQ(ResolveRendezvous("", env, "/scratch", 1000)->prefix, "124-999/restart2");
  // torchrun's run id when none is given ("none", every job's): its agent's
  // log folder for the run, which all of the agent's workers share.
  env.run_id = "none";
  env.error_file = "/tmp/torchelastic_ab12/none_x9y8/attempt_2/1/error.json";
  r = ResolveRendezvous("", env, "/scratch", 1000);
  EXPECT_EQ(r->store, "/scratch/fsdp_rdzv_u1000_127.0.0.1_29500/none_none_x9y8");
  EXPECT_EQ(r->prefix, "none/restart2");
  env.error_file = "";
  EXPECT_EQ(ResolveRendezvous("", env, "/scratch", 1000)->store,
            "/scratch/fsdp_rdzv_u1000_127.0.0.1_29500/none");
  // Odd characters do not reach the file names.
  env.master_addr = "node-1/x";
  env.run_id = "a b";
  r = ResolveRendezvous("", env, "/scratch", 1000);
  EXPECT_EQ(r->store, "/scratch/fsdp_rdzv_u1000_node-1_x_29500/a_b");
  EXPECT_EQ(r->prefix, "a_b/restart2");
  // An explicit store is used as given, and kept.
  r = ResolveRendezvous("redis://10.0.0.1:6379", env, "/scratch", 1000);
  EXPECT_EQ(r->store, "redis://10.0.0.1:6379");
  EXPECT_EQ(r->prefix, "a_b/restart2");
  EXPECT_FALSE(r->owned);
  env.run_id = "";
  r = ResolveRendezvous("/shared/rdzv", env, "/scratch", 1000);
  EXPECT_EQ(r->prefix, "run/restart2");
  EXPECT_FALSE(r->owned);
}

// The default store's folder must be this user's alone: made 0700, and
// refused when others may write it or it is not a folder.
TEST(RendezvousTest, TheOwnedStoresFolderIsThisUsersAlone) {
  namespace fs = std::filesystem;
  const std::string base = ::testing::TempDir() + "/owned_base";
  fs::remove_all(base);
  ASSERT_TRUE(CheckOwnedStore(base + "/run").ok());
  EXPECT_EQ(fs::status(base).permissions(), fs::perms::owner_all);
  // One that others may write (an older version's, under umask 0): made 0700.
  fs::permissions(base, fs::perms::all);  // 0777
  EXPECT_TRUE(CheckOwnedStore(base + "/run").ok());
  EXPECT_EQ(fs::status(base).permissions(), fs::perms::owner_all);
  // 0755 (an older version's default) is kept as it is.
  fs::permissions(base, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  EXPECT_TRUE(CheckOwnedStore(base + "/run").ok());
  EXPECT_EQ(fs::status(base).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                fs::perms::others_read | fs::perms::others_exec);
  // A run folder that is a link: refused.
  fs::create_directory_symlink("/", base + "/run");
  EXPECT_TRUE(absl::StrContains(CheckOwnedStore(base + "/run").message(),
                                "its run folder (" + base + "/run) is not a folder"));
  fs::remove_all(base);
  fs::create_directories(base + "_target");
  fs::create_directory_symlink(base + "_target", base);
  const absl::Status s = CheckOwnedStore(base + "/run");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("the default rendezvous folder ", base,
                                                          " is not this user's alone: it is not "
                                                          "a folder")))
      << s;
  fs::remove(base);
}

TEST(RendezvousTest, ErrorsNameWhatIsMissing) {
  LaunchEnv env = *ReadLaunchEnv(FakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  absl::StatusOr<Rendezvous> r = ResolveRendezvous("", env, "/tmp", 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "needs MASTER_ADDR, MASTER_PORT, RUN_ID"))
      << r.status();
  env = *ReadLaunchEnv(FakeEnv(LaunchVars(0, 4)));
  env.local_world_size = 2;  // two nodes
  r = ResolveRendezvous("", env, "/tmp", 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "several nodes")) << r.status();
  EXPECT_TRUE(ResolveRendezvous("redis://10.0.0.1:6379", env, "/tmp", 1000).ok());
  EXPECT_FALSE(ResolveRendezvous("redis://", env, "/tmp", 1000).ok());
  // A malformed Redis endpoint is refused here, before any rank starts.
  EXPECT_TRUE(ResolveRendezvous("redis://[::1]:6379", env, "/tmp", 1000).ok());
  r = ResolveRendezvous("redis://user:pw@10.0.0.1:6379", env, "/tmp", 1000);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(r.status().message(),
                               "--rdzv: store \"redis://user:pw@10.0.0.1:6379\" holds credentials"))
      << r.status();
  // torchrun's stores are not a directory of that name.
  for (const char* other : {"tcp://127.0.0.1:29800", "c10d://node0:29400", "node0:29400"}) {
    r = ResolveRendezvous(other, env, "/tmp", 1000);
    ASSERT_FALSE(r.ok()) << other;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(r.status().message(),
                                  absl::StrCat("--rdzv='", other, "': the ranks meet in")))
        << r.status();
  }
  EXPECT_TRUE(ResolveRendezvous("file:///shared/rdzv", env, "/tmp", 1000).ok());
}

// ---- The configuration ----

// The launcher's variables for gloo and nccl; none for the threads engine
// (which refuses WORLD_SIZE > 1: a launcher started it).
absl::Status ConfigError(const DataParallelFlags& f, int world = 2) {
  const GetEnvFn env = f.backend == "threads" ? FakeEnv({}) : FakeEnv(LaunchVars(0, world));
  return ConfigureDataParallel(f, {"Block"}, env).status();
}

// Flags to refuse, and what the error must say.
struct Refusal {
  DataParallelFlags flags;
  std::string expected;
};

// `check` refuses each case's flags: InvalidArgument with its text.
void ExpectRefused(const std::vector<Refusal>& cases,
                   const std::function<absl::Status(const DataParallelFlags&)>& check) {
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.expected);
    absl::Status s = check(c.flags);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), c.expected)) << s;
  }
}

TEST(ConfigureTest, ThreadsAndGloo) {
  EXPECT_FALSE(WantsDataParallel(Flags("threads", "", 0)));
  EXPECT_FALSE(WantsDataParallel(Flags("threads", "", 1)));
  EXPECT_TRUE(WantsDataParallel(Flags("threads", "", 2)));
  EXPECT_TRUE(WantsDataParallel(Flags("threads", "ddp", 1)));
  EXPECT_TRUE(WantsDataParallel(Flags("gloo", "", 0)));
  EXPECT_TRUE(WantsDataParallel(Flags("threads", "", -2)));  // to be refused

  absl::StatusOr<DataParallelConfig> c =
      ConfigureDataParallel(Flags("threads", "ddp", 0), {"Block"}, FakeEnv({}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->world_size, 1);
  EXPECT_EQ(c->Describe(), "DDP over 1 rank (threads)");

  DataParallelFlags gloo = Flags("gloo", "", 0);
  gloo.timeout_s = 7.5;
  c = ConfigureDataParallel(gloo, {"Block"}, FakeEnv(LaunchVars(1, 3)));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->world_size, 3);
  EXPECT_EQ(c->env.rank, 1);
  EXPECT_EQ(c->timeout, absl::Seconds(7.5));
  EXPECT_EQ(c->rendezvous.prefix, "123-456/restart0");
  EXPECT_TRUE(absl::StartsWith(c->rendezvous.store,
                               absl::StrCat(TempDir(), "/fsdp_rdzv_u", ::getuid(),
                                            "_127.0.0.1_29500/")));
  EXPECT_EQ(c->Describe(), "FSDP FULL_SHARD (auto_wrap transformer) over 3 ranks (gloo)");
  gloo.world_size = 3;  // agrees with WORLD_SIZE
  EXPECT_TRUE(ConfigureDataParallel(gloo, {"Block"}, FakeEnv(LaunchVars(1, 3))).ok());

  // Started by a launcher without --backend=gloo: each process would train
  // the whole job alone (one process, or threads); WORLD_SIZE=1 is fine.
  for (const DataParallelFlags& threads : {Flags("threads", "", 0), Flags("threads", "ddp", 2)}) {
    c = ConfigureDataParallel(threads, {"Block"}, FakeEnv(LaunchVars(1, 3)));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("WORLD_SIZE=3 is set (a launcher such as //tools:launch "
                                        "or torchrun started this process) but --backend=threads"),
              std::string::npos)
        << c.status();
  }
  EXPECT_TRUE(ConfigureDataParallel(Flags("threads", "", 0), {"Block"}, FakeEnv(LaunchVars(0, 1)))
                  .ok());
}

TEST(ConfigureTest, DevicesAndNccl) {
  // Threads: every rank on the given GPU, optionally offloading.
  DataParallelFlags f = Flags("threads", "full_shard", 2);
  f.device = "cuda:1";
  f.cpu_offload = true;
  absl::StatusOr<DataParallelConfig> c = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, tensor::Device::Cuda(1));
  EXPECT_TRUE(c->cpu_offload);
  EXPECT_EQ(c->Describe(),
            "FSDP FULL_SHARD (auto_wrap transformer) over 2 ranks (threads) on cuda:1, CPU "
            "offload");
  // Offloading, --max_inflight_all_gathers sizes the upload slots: it goes
  // with --prefetch_units.
  f.prefetch_units = 3;
  f.max_inflight_all_gathers = 4;
  c = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_inflight_all_gathers, 4);
  // nccl: one process per GPU, cuda:LOCAL_RANK, meeting in a directory.
  f = Flags("nccl", "no_shard", 0);
  f.device = "cuda";
  c = ConfigureDataParallel(f, {"Block"}, FakeEnv(LaunchVars(1, 3)));
  const int visible = tensor::cuda::DeviceCount();  // 0 without CUDA
  if (visible == 2) {  // too few for 3 ranks on this node (NcclRankDevice)
    EXPECT_FALSE(c.ok());
    return;
  }
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend, Backend::kNccl);
  // LOCAL_RANK defaults to RANK; one visible GPU is the rank's own.
  EXPECT_EQ(c->device, tensor::Device::Cuda(visible == 1 ? 0 : 1));
  EXPECT_TRUE(absl::StartsWith(c->rendezvous.store, TempDir() + "/fsdp_rdzv_"));
  EXPECT_EQ(c->Describe(),
            absl::StrCat("FSDP NO_SHARD (auto_wrap transformer) over 3 ranks (nccl) on ",
                         visible == 1 ? "cuda:0 (each rank's one visible GPU)"
                                      : "cuda:LOCAL_RANK"));
  f.rdzv = "file:///shared/rdzv";
  c = ConfigureDataParallel(f, {"Block"}, FakeEnv(LaunchVars(1, 3)));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rendezvous.store, "/shared/rdzv");
}

// A nccl rank's GPU from the devices its process sees: all of the node's
// (cuda:LOCAL_RANK), one of its own (cuda:0), or too few (an error naming
// both counts).
TEST(ConfigureTest, NcclRankDeviceFollowsTheVisibleGpus) {
  LaunchEnv env;
  env.rank = 5;
  env.world_size = 8;
  env.local_rank = 5;
  env.local_world_size = 8;
  EXPECT_EQ(NcclRankDevice(env, 8).value(), tensor::Device::Cuda(5));
  EXPECT_EQ(NcclRankDevice(env, 16).value(), tensor::Device::Cuda(5));
  EXPECT_EQ(NcclRankDevice(env, 1).value(), tensor::Device::Cuda(0));  // CUDA_VISIBLE_DEVICES=5
  EXPECT_EQ(NcclRankDevice(env, 0).value(), tensor::Device::Cuda(5));  // the engine says why
  const absl::StatusOr<tensor::Device> few = NcclRankDevice(env, 4);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(few.status().message(),
                                "this node runs 8 ranks (LOCAL_WORLD_SIZE) but this process sees "
                                "4 CUDA devices"))
      << few.status();
  env.local_rank = 0;
  EXPECT_FALSE(NcclRankDevice(env, 4).ok()) << "a rank whose GPU exists fails with the others";
}

TEST(RunDataParallelTest, NcclWithoutCudaSaysHowToBuildIt) {
  if (tensor::cuda::Built()) GTEST_SKIP() << "a --config=cuda build";
  DataParallelFlags f = Flags("nccl", "", 0);
  f.device = "cuda";
  absl::StatusOr<DataParallelConfig> c =
      ConfigureDataParallel(f, {"Block"}, FakeEnv(LaunchVars(1, 2)));
  ASSERT_TRUE(c.ok()) << c.status();
  bool ran = false;
  absl::Status s = RunDataParallel(*c, [&](RankContext&) {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_FALSE(ran);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1: --backend=nccl: this binary was built "
                                             "without CUDA support; build it with --config=cuda"))
      << s;
}

TEST(ConfigureTest, RefusesWithClearMessages) {
  std::vector<Refusal> cases;
  cases.push_back({Flags("gloo", "", 4), "--world_size=4 disagrees with WORLD_SIZE=2"});
  cases.push_back({Flags("nccl", ""), "--backend=nccl needs --device=cuda"});
  DataParallelFlags nccl_index = Flags("nccl", "");
  nccl_index.device = "cuda:1";
  cases.push_back({nccl_index, "--backend=nccl puts each rank on cuda:LOCAL_RANK: give "
                               "--device=cuda, not --device=cuda:1"});
  DataParallelFlags on_gpu = Flags("gloo", "", 0);
  on_gpu.device = "cuda";
  cases.push_back({on_gpu, "--backend=gloo runs collectives on the CPU; with --device=cuda"});
  on_gpu = Flags("nccl", "", 0);
  on_gpu.device = "cuda";
  on_gpu.rdzv = "redis://127.0.0.1:6379";
  cases.push_back({on_gpu, "--backend=nccl meets through a directory store"});
  on_gpu = Flags("threads", "full_shard", 2);
  on_gpu.cpu_offload = true;
  cases.push_back({on_gpu, "--cpu_offload keeps FSDP's shards"});
  on_gpu.device = "cuda";
  on_gpu.strategy = "zero1";
  cases.push_back({on_gpu, "--cpu_offload keeps FSDP's shards"});
  on_gpu = Flags("threads", "full_shard", 2);
  on_gpu.device = "tpu";
  cases.push_back({on_gpu, "tpu"});
  cases.push_back({Flags("threads", "hybrid_shard", 4),
                   "--strategy=hybrid_shard with --backend=threads needs --hybrid_shard_group_size"});
  DataParallelFlags hybrid = Flags("threads", "hybrid_shard", 4);
  hybrid.hybrid_shard_group_size = 3;
  cases.push_back({hybrid, "a shard group of 3 (--hybrid_shard_group_size) ranks does not divide "
                           "the world size 4"});
  hybrid = Flags("threads", "full_shard", 4);
  hybrid.hybrid_shard_group_size = 2;
  cases.push_back({hybrid,
                   "--hybrid_shard_group_size=2 applies to --strategy=hybrid_shard or "
                   "hybrid_shard_zero2 only"});
  cases.push_back({Flags("threads", "hybrid_shard_zero2", 4),
                   "--strategy=hybrid_shard_zero2 with --backend=threads needs "
                   "--hybrid_shard_group_size"});
  hybrid = Flags("threads", "full_shard", 4);
  hybrid.backward_prefetch = "early";
  cases.push_back({hybrid, "--backward_prefetch='early' is not one of pre, post, none"});
  hybrid = Flags("threads", "zero3", 4);
  cases.push_back({hybrid, "--strategy='zero3' is not one of ddp, zero1, shard_grad_op, "
                           "full_shard, no_shard, hybrid_shard, hybrid_shard_zero2 (DeepSpeed's "
                           "ZeRO-3 is full_shard)"});
  hybrid = Flags("threads", "zero2", 4);
  cases.push_back({hybrid, "(DeepSpeed's ZeRO-2 is shard_grad_op)"});
  hybrid = Flags("threads", "full_shard", 4);
  hybrid.max_inflight_all_gathers = 0;
  cases.push_back({hybrid, "--max_inflight_all_gathers=0 must be >= 1"});
  DataParallelFlags ahead = Flags("threads", "full_shard", 2);
  ahead.prefetch_units = -1;
  cases.push_back({ahead, "--prefetch_units=-1 must be >= 0 (0: none)"});
  ahead = Flags("threads", "ddp", 2);
  ahead.prefetch_units = 2;
  cases.push_back({ahead,
                   "--prefetch_units=2 names FSDP units to all-gather ahead; --strategy=ddp "
                   "has none"});
  ahead = Flags("threads", "full_shard", 2);
  ahead.prefetch_units = 1;
  ahead.backward_prefetch = "none";
  cases.push_back({ahead,
                   "--prefetch_units=1 prefetches that many units ahead of each one's forward "
                   "and backward in place of --backward_prefetch=none, which it would ignore: "
                   "give one or the other"});
  ahead.backward_prefetch = "post";
  ahead.forward_prefetch = true;
  ahead.max_inflight_all_gathers = 1;
  cases.push_back({ahead, "in place of --forward_prefetch, --backward_prefetch=post, "
                          "--max_inflight_all_gathers=1, which"});
  ahead = Flags("threads", "shard_grad_op", 2);
  ahead.keep_last_unit = true;
  cases.push_back({ahead,
                   "--keep_last_unit keeps a unit FULL_SHARD or HYBRID_SHARD would reshard "
                   "after its forward; --strategy=shard_grad_op reshards none"});
  hybrid = Flags("threads", "zero1", 2);
  hybrid.bucket_cap_mb = 0;
  cases.push_back({hybrid, "--bucket_cap_mb=0 must be in (0, 1e6]"});
  DataParallelFlags inflight = Flags("threads", "zero1", 2);
  inflight.max_inflight_buckets = -1;
  cases.push_back({inflight, "--max_inflight_buckets=-1 must be >= 0 (0: no bound)"});
  cases.push_back({Flags("threads", "", -1), "--world_size=-1 must be >= 1"});
  cases.push_back({Flags("threads", "", 100000),
                   "--world_size=100000: the threads engine runs every rank as a thread"});
  DataParallelFlags f = Flags("threads", "", 2);
  f.timeout_s = 0;
  cases.push_back({f, "--timeout_s=0 must be in (0, 1e6]"});
  f = Flags("threads", "", 2);
  f.rdzv = "/tmp/x";
  cases.push_back({f, "--rdzv applies to --backend=gloo only"});
  f = Flags("threads", "", 2);
  f.auto_wrap = "blocks";
  cases.push_back({f, "--auto_wrap='blocks'"});
  f = Flags("threads", "", 2);
  f.precision = "fp8";
  cases.push_back({f, "fp8"});
  ExpectRefused(cases, [](const DataParallelFlags& f) { return ConfigError(f); });
  // A flag the strategy does not read, set to other than its default: FSDP's
  // under DDP / ZeRO-1, the buckets' under FSDP (their defaults pass).
  std::vector<std::pair<DataParallelFlags, std::string>> unread;
  f = Flags("threads", "ddp", 2);
  f.forward_prefetch = true;
  f.max_inflight_all_gathers = 7;
  unread.push_back({f, "--forward_prefetch --max_inflight_all_gathers=7: FSDP's units and their "
                       "all-gathers; --strategy=ddp has none"});
  f = Flags("threads", "zero1", 2);
  f.auto_wrap = "size:5";
  f.backward_prefetch = "post";
  unread.push_back({f, "--backward_prefetch=post --auto_wrap=size:5: FSDP's units"});
  f = Flags("threads", "full_shard", 2);
  f.bucket_cap_mb = 0.001;
  f.max_inflight_buckets = 9;
  unread.push_back({f, "--bucket_cap_mb=0.001 --max_inflight_buckets=9: gradient buckets are "
                       "--strategy=ddp's and zero1's; --strategy=full_shard reduces gradients unit "
                       "by unit"});
  // The bound on the buckets' low-precision copies, with fp32 buckets.
  for (const char* strategy : {"ddp", "zero1"}) {
    f = Flags("threads", strategy, 2);
    f.max_inflight_buckets = 3;
    unread.push_back({f, "--max_inflight_buckets=3 bounds the low-precision copies of the "
                         "buckets in flight (--precision=bf16 or fp16); with --precision=fp32 "
                         "the buckets reduce in place and nothing reads it"});
    f.precision = "bf16";
    EXPECT_TRUE(ConfigError(f).ok()) << strategy;
  }
  for (const auto& [flags, says] : unread) {
    const absl::Status refused = ConfigError(flags);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << says;
    EXPECT_NE(refused.message().find(says), std::string::npos) << refused;
  }
  for (const char* strategy : {"ddp", "zero1", "full_shard"}) {
    EXPECT_TRUE(ConfigError(Flags("threads", strategy, 2)).ok()) << strategy;
  }
  // bf16 with every strategy is fine.
  for (const char* strategy : {"ddp", "zero1", "full_shard", "shard_grad_op", "no_shard"}) {
    f = Flags("threads", strategy, 2);
    f.precision = "bf16";
    EXPECT_TRUE(ConfigError(f).ok()) << strategy;
  }
}

// The one-process loop uses none of the data-parallel flags, yet checks them:
// a malformed value, or an FSDP feature it does not have, is an error.
TEST(ConfigureTest, OneProcessChecksTheFlagsItDoesNotUse) {
  const std::set<std::string> blocks = {"Block"};
  DataParallelFlags f = Flags("threads", "", 0);
  EXPECT_TRUE(CheckOneProcessFlags(f, blocks).ok());
  f.world_size = 1;
  f.device = "cuda";  // one process on a GPU (any count of devices: not opened here)
  f.precision = "bf16";
  EXPECT_TRUE(CheckOneProcessFlags(f, blocks).ok());
  std::vector<Refusal> cases;
  f = Flags("threads", "", 0);
  f.auto_wrap = "size:abc";
  cases.push_back({f, "--auto_wrap='size:abc': size:N needs a whole number N >= 1"});
  f = Flags("threads", "", 0);
  f.backward_prefetch = "bogus";
  cases.push_back({f, "--backward_prefetch='bogus' is not one of pre, post, none"});
  f = Flags("threads", "", 0);
  f.bucket_cap_mb = -5;
  cases.push_back({f, "--bucket_cap_mb=-5 must be in (0, 1e6]"});
  f = Flags("threads", "", 0);
  f.hybrid_shard_group_size = 2;
  cases.push_back({f, "--hybrid_shard_group_size=2 applies to --strategy=hybrid_shard"});
  f = Flags("threads", "", 0);
  f.cpu_offload = true;  // on the CPU: named as for data parallelism
  cases.push_back({f, "--cpu_offload keeps FSDP's shards"});
  f.device = "cuda";
  cases.push_back({f,
                   "--cpu_offload is an FSDP option, and one process without --strategy trains "
                   "without FSDP; add --strategy=full_shard (it runs with one rank too)"});
  f = Flags("threads", "", 1);
  f.forward_prefetch = true;
  cases.push_back({f, "--forward_prefetch is an FSDP option"});
  f = Flags("threads", "", 0);
  f.prefetch_units = 2;
  cases.push_back({f, "--prefetch_units=2 is an FSDP option"});
  f = Flags("threads", "", 0);
  f.keep_last_unit = true;
  cases.push_back({f, "--keep_last_unit is an FSDP option"});
  f = Flags("threads", "", 0);
  f.bucket_cap_mb = 5;
  f.max_inflight_buckets = 3;
  cases.push_back({f,
                   "--bucket_cap_mb=5 --max_inflight_buckets=3: data parallelism's, and one "
                   "process without --strategy or --world_size trains without it; add --strategy"});
  f = Flags("threads", "", 1);
  f.auto_wrap = "none";
  cases.push_back({f, "--auto_wrap=none: data parallelism's"});
  ExpectRefused(cases,
                [&](const DataParallelFlags& f) { return CheckOneProcessFlags(f, blocks); });
}

}  // namespace
}  // namespace train
