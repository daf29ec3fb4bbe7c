// Sharded checkpoints on the threads engine with a tiny minGPT (2 blocks,
// n_embd 8, vocab 11), SGD with momentum and AdamW:
//   - save at world 4 after 3 steps, load at world 2 (FULL_SHARD / SHARD_GRAD_OP
//     / NO_SHARD, other wrap policies), continue 3 steps on the same global
//     batches: the losses and final parameters equal the uninterrupted 6-step
//     world-4 run;
//   - a round trip at the same world size is bitwise (shards, optimizer state,
//     and the losses that follow);
//   - world 3 (uneven padding) -> 1 and 1 -> 3; ZeRO-1 4 -> 2; ZeRO-1 <-> FSDP;
//   - a checkpoint saved before the first step; multi-block checksums;
//   - errors: each names the problem, every rank returns it, nothing changes.
// Tolerance against an uninterrupted run at another world size (fp32):
// |got - want| <= 1e-5 + 1e-5 |want| for every loss and parameter element (the
// ranks sum their parts of the batch in another order, so results are not
// bitwise); at the same world size and layout they are bitwise.
#include "dist/sharded_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gmock/gmock.h"
#include "dist/fsdp_testing.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/testing.h"

namespace dist {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using tensor::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

constexpr uint64_t kSeed = 1234;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4
constexpr double kClip = 0.5;
constexpr double kTol = 1e-5;

mingpt::GptConfig Tiny(int n_layer = 2, int64_t vocab = 11) {
  mingpt::GptConfig c;
  c.name = "tiny";
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = vocab;
  c.block_size = 6;
  c.dropout = 0.0f;
  return c;
}

using testing::RandomIds;  // dist/fsdp_testing.h

// The global batch of step s: every run, interrupted or not, sees the same.
Tensor StepIdx(const mingpt::GptConfig& c, int step) {
  return RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 100 + 2 * step);
}
Tensor StepTgt(const mingpt::GptConfig& c, int step) {
  return RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 101 + 2 * step);
}

enum class Opt { kSgd, kAdamW };

std::unique_ptr<optim::Optimizer> MakeOpt(Opt o) {
  if (o == Opt::kSgd) {
    optim::SgdOptions s;
    s.lr = 0.1;
    s.momentum = 0.9;
    s.weight_decay = 0.1;
    return optim::SGD::Create(s).value();
  }
  optim::AdamWOptions a;
  a.lr = 1e-2;
  a.weight_decay = 0.1;
  return optim::AdamW::Create(a).value();
}

enum class Engine { kFsdp, kZero1 };

WrapPolicy Blocks() { return WrapPolicy::Transformer({"Block"}); }

// One stretch of training: [first_step, last_step), optionally loading a
// checkpoint before and saving one after.
struct Segment {
  int world = 1;
  Engine engine = Engine::kFsdp;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  WrapPolicy policy = Blocks();
  Opt opt = Opt::kSgd;
  bool clip = true;  // FSDP only (global-norm clipping; ZeRO-1 has none)
  double zero1_bucket_cap_mb = 25;  // ZeRO-1 only
  int first_step = 0;
  int last_step = 0;
  std::string load_dir;
  std::string save_dir;
  mingpt::GptConfig config = Tiny();
  std::vector<std::string> freeze;  // nn::FreezeParameters patterns, before wrapping
};

struct SegmentResult {
  std::vector<double> losses;
  NamedTensors params;  // the full parameters at the end
  std::map<std::string, std::string> extra;  // what the load returned
};

using testing::RankMean;  // dist/fsdp_testing.h

// A model on one rank: FSDP or ZeRO-1 over a fresh tiny GPT.
struct RankModel {
  std::unique_ptr<mingpt::GPT> gpt;
  std::unique_ptr<FullyShardedModel> fsdp;
  std::unique_ptr<optim::Optimizer> fsdp_opt;
  std::unique_ptr<Zero1> zero;

  RankModel(const Segment& seg, ProcessGroup& pg, uint64_t seed = kSeed) {
    gpt = std::make_unique<mingpt::GPT>(seg.config);
    if (!seg.freeze.empty()) {
      EXPECT_TRUE(nn::FreezeParameters(*gpt, seg.freeze).ok());
    }
    if (seg.engine == Engine::kFsdp) {
      FsdpOptions o;
      o.strategy = seg.strategy;
      o.policy = seg.policy;
      o.seed = seed;
      fsdp = FullyShard(*gpt, pg, o);
      fsdp_opt = MakeOpt(seg.opt);
    } else {
      gpt->Materialize(seed);
      Zero1Options o;
      o.bucket_cap_mb = seg.zero1_bucket_cap_mb;
      zero = std::make_unique<Zero1>(*gpt, pg, MakeOpt(seg.opt), o);
    }
  }
  optim::Optimizer& opt() { return fsdp ? *fsdp_opt : zero->optimizer(); }

  double TrainStep(const Segment& seg, ProcessGroup& pg, int step) {
    const int64_t B = kGlobalBatch / pg.size();
    const Tensor idx = StepIdx(seg.config, step).Narrow(0, pg.rank() * B, B).Contiguous();
    const Tensor tgt = StepTgt(seg.config, step).Narrow(0, pg.rank() * B, B).Contiguous();
    double loss = 0;
    if (fsdp) {
      fsdp->ZeroGrad();
      loss = RankMean(pg, gpt->ForwardBackward(idx, tgt));
      if (seg.clip) fsdp->ClipGradNorm(kClip);
      fsdp_opt->Step(fsdp->ParamRefs());
    } else {
      loss = RankMean(pg, gpt->ForwardBackward(idx, tgt));
      EXPECT_TRUE(zero->Step().ok());
      zero->ZeroGrad();
    }
    return loss;
  }

  absl::StatusOr<std::map<std::string, std::string>> Load(const std::string& dir, ProcessGroup& pg,
                                                          ShardedLoadOptions options = {}) {
    return fsdp ? LoadSharded(dir, *fsdp, *fsdp_opt, pg, options) : LoadSharded(dir, *zero, pg, options);
  }
  absl::Status Save(const std::string& dir, ProcessGroup& pg,
                    const std::map<std::string, std::string>& extra) {
    return fsdp ? SaveSharded(dir, *fsdp, *fsdp_opt, pg, extra) : SaveSharded(dir, *zero, pg, extra);
  }

  // Full parameters on rank 0 (empty elsewhere), registration order.
  NamedTensors FullParams(ProcessGroup& pg) {
    if (fsdp) return fsdp->FullStateDict();
    NamedTensors out;
    if (pg.rank() == 0) {
      for (auto& [n, p] : gpt->NamedParameters()) out.emplace_back(n, p->value.Clone());
    }
    return out;
  }

  // This rank's shards (copies) and optimizer state (copies).
  NamedTensors Snapshot() {
    NamedTensors out;
    if (fsdp) {
      for (int u = 0; u < fsdp->num_units(); ++u) {
        out.emplace_back("shard:" + fsdp->param_ref_name(u), fsdp->flat_param(u).shard().Clone());
      }
    } else {
      for (int b = 0; b < zero->num_buckets(); ++b) {
        out.emplace_back("master" + std::to_string(b), zero->master_shard(b).Clone());
      }
      for (auto& [n, p] : gpt->NamedParameters()) out.emplace_back("value:" + n, p->value.Clone());
    }
    for (auto& [n, t] : opt().StateTensors()) out.emplace_back("opt:" + n, t.Clone());
    return out;
  }
};

void ExpectBitwiseEqual(const NamedTensors& a, const NamedTensors& b, const std::string& where) {
  ASSERT_EQ(a.size(), b.size()) << where;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << where;
    ASSERT_EQ(a[i].second.dtype(), b[i].second.dtype()) << where << " " << a[i].first;
    ASSERT_EQ(a[i].second.numel(), b[i].second.numel()) << where << " " << a[i].first;
    EXPECT_EQ(0, std::memcmp(a[i].second.raw_data(), b[i].second.raw_data(), a[i].second.nbytes()))
        << where << " " << a[i].first;
  }
}

SegmentResult RunSegment(const Segment& seg) {
  SegmentResult result;
  std::mutex mu;
  ThreadWorld world(seg.world);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    SegmentResult mine;
    if (!seg.load_dir.empty()) {
      absl::StatusOr<std::map<std::string, std::string>> extra = m.Load(seg.load_dir, pg);
      ASSERT_TRUE(extra.ok()) << extra.status();
      mine.extra = *extra;
      EXPECT_EQ(mine.extra["step"], std::to_string(seg.first_step));
    }
    for (int step = seg.first_step; step < seg.last_step; ++step) {
      mine.losses.push_back(m.TrainStep(seg, pg, step));
    }
    if (!seg.save_dir.empty()) {
      absl::Status saved = m.Save(seg.save_dir, pg,
                                  {{"step", std::to_string(seg.last_step)}, {"note", "a \"quoted\"\n value"}});
      ASSERT_TRUE(saved.ok()) << saved;
    }
    mine.params = m.FullParams(pg);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(mine);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  for (auto& [n, t] : result.params) t = t.Clone();  // off the rank's ledger
  return result;
}

// `first` then `second` against the uninterrupted `want`.
void ExpectContinues(const SegmentResult& first, const SegmentResult& second,
                     const SegmentResult& want) {
  std::vector<double> got = first.losses;
  got.insert(got.end(), second.losses.begin(), second.losses.end());
  ASSERT_EQ(got.size(), want.losses.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want.losses[i], kTol + kTol * std::abs(want.losses[i])) << "step " << i;
  }
  ASSERT_EQ(second.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_EQ(second.params[i].first, want.params[i].first);
    EXPECT_TRUE(tensor::testing::AllClose(second.params[i].second, want.params[i].second, kTol, kTol))
        << want.params[i].first;
  }
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp != nullptr ? tmp : "/tmp") + "/sharded_checkpoint_test";
  const std::string dir = base + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// ---- Resharding: world 4 -> 2 and other layouts ----

struct Target {
  const char* name;
  ShardingStrategy strategy;
  WrapPolicy policy;
};

std::vector<Target> Targets() {
  return {{"FULL_SHARD_blocks", ShardingStrategy::kFullShard, Blocks()},
          {"FULL_SHARD_none", ShardingStrategy::kFullShard, WrapPolicy::None()},
          {"FULL_SHARD_nested", ShardingStrategy::kFullShard, WrapPolicy::SizeBased(300)},
          {"SHARD_GRAD_OP_blocks", ShardingStrategy::kShardGradOp, Blocks()},
          {"NO_SHARD_blocks", ShardingStrategy::kNoShard, Blocks()}};
}

using ReshardParam = std::tuple<Opt, int>;  // optimizer, index into Targets()

class ReshardTest : public ::testing::TestWithParam<ReshardParam> {};

TEST_P(ReshardTest, SaveAtWorld4LoadAtWorld2ContinuesLikeTheUninterruptedRun) {
  const auto [opt, target_index] = GetParam();
  const Target target = Targets()[target_index];
  const std::string dir = TestDir(std::string("reshard_") + target.name + (opt == Opt::kSgd ? "_sgd" : "_adamw")) + "/ck";
  Segment base;
  base.world = 4;
  base.opt = opt;
  base.last_step = 6;
  const SegmentResult want = RunSegment(base);
  ASSERT_GT(want.losses.front() - want.losses.back(), 1e-2);  // the run moves

  Segment first = base;
  first.last_step = 3;
  first.save_dir = dir;
  const SegmentResult a = RunSegment(first);

  Segment second = base;
  second.world = 2;
  second.strategy = target.strategy;
  second.policy = target.policy;
  second.first_step = 3;
  second.load_dir = dir;
  const SegmentResult b = RunSegment(second);
  EXPECT_EQ(b.extra.at("note"), "a \"quoted\"\n value");
  ExpectContinues(a, b, want);
}

INSTANTIATE_TEST_SUITE_P(
    All, ReshardTest, ::testing::Combine(::testing::Values(Opt::kSgd, Opt::kAdamW), ::testing::Range(0, 5)),
    [](const ::testing::TestParamInfo<ReshardParam>& info) {
      return std::string(std::get<0>(info.param) == Opt::kSgd ? "sgd_" : "adamw_") +
             Targets()[std::get<1>(info.param)].name;
    });

// World 3 pads its flat parameters (a block's 872 elements do not divide by 3).
TEST(ShardedCheckpointTest, World3ToWorld1AndWorld1ToWorld3) {
  const std::string dir = TestDir("world3_1");
  for (auto [from, to] : {std::pair<int, int>{3, 1}, std::pair<int, int>{1, 3}}) {
    SCOPED_TRACE(::testing::Message() << from << " -> " << to);
    Segment base;
    base.world = from;
    base.opt = Opt::kAdamW;
    base.last_step = 6;
    const SegmentResult want = RunSegment(base);
    Segment first = base;
    first.last_step = 3;
    first.save_dir = dir + "/from" + std::to_string(from);
    const SegmentResult a = RunSegment(first);
    Segment second = base;
    second.world = to;
    second.first_step = 3;
    second.load_dir = first.save_dir;
    ExpectContinues(a, RunSegment(second), want);
  }
}

// ---- Same world size: bitwise ----

class RoundTripTest : public ::testing::TestWithParam<std::tuple<Engine, Opt, int>> {};

TEST_P(RoundTripTest, SameWorldSizeIsBitwise) {
  const auto [engine, opt, world] = GetParam();
  const std::string dir = TestDir("roundtrip") + "/ck";
  Segment seg;
  seg.world = world;
  seg.engine = engine;
  seg.opt = opt;
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    RankModel a(seg, pg);
    for (int step = 0; step < 3; ++step) a.TrainStep(seg, pg, step);
    ASSERT_TRUE(a.Save(dir, pg, {{"step", "3"}}).ok());
    // Other initial weights: the load must overwrite every element.
    RankModel b(seg, pg, /*seed=*/99);
    auto extra = b.Load(dir, pg);
    ASSERT_TRUE(extra.ok()) << extra.status();
    ExpectBitwiseEqual(b.Snapshot(), a.Snapshot(), "after load, rank " + std::to_string(rank));
    for (int step = 3; step < 5; ++step) {
      const double la = a.TrainStep(seg, pg, step);
      const double lb = b.TrainStep(seg, pg, step);
      EXPECT_EQ(la, lb) << "step " << step;
    }
    ExpectBitwiseEqual(b.Snapshot(), a.Snapshot(), "after 2 more steps, rank " + std::to_string(rank));
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(
    All, RoundTripTest,
    ::testing::Combine(::testing::Values(Engine::kFsdp, Engine::kZero1),
                       ::testing::Values(Opt::kSgd, Opt::kAdamW), ::testing::Values(1, 3)),
    [](const ::testing::TestParamInfo<std::tuple<Engine, Opt, int>>& info) {
      return std::string(std::get<0>(info.param) == Engine::kFsdp ? "fsdp_" : "zero1_") +
             (std::get<1>(info.param) == Opt::kSgd ? "sgd_" : "adamw_") + "world" +
             std::to_string(std::get<2>(info.param));
    });

// ---- ZeRO-1 ----

// Saved with many buckets (each slice its own optimizer ref), resumed with
// other buckets at another world size.
TEST(ShardedCheckpointTest, Zero1World4ToWorld2) {
  const std::string dir = TestDir("zero1_4_2") + "/ck";
  Segment base;
  base.world = 4;
  base.engine = Engine::kZero1;
  base.opt = Opt::kAdamW;
  base.last_step = 6;
  const SegmentResult want = RunSegment(base);
  Segment first = base;
  first.last_step = 3;
  first.save_dir = dir;
  first.zero1_bucket_cap_mb = 0.002;
  const SegmentResult a = RunSegment(first);
  Segment second = base;
  second.world = 2;
  second.first_step = 3;
  second.load_dir = dir;
  second.zero1_bucket_cap_mb = 0.005;
  ExpectContinues(a, RunSegment(second), want);
}

// The format is per parameter: ZeRO-1 and FSDP read each other's checkpoints.
// No clipping (ZeRO-1 has none); both engines match one process within kTol,
// so each continuation is compared with the uninterrupted run of the engine
// that saved.
TEST(ShardedCheckpointTest, Zero1AndFsdpLoadEachOthersCheckpoints) {
  const std::string dir = TestDir("interop");
  for (Opt opt : {Opt::kSgd, Opt::kAdamW}) {
    SCOPED_TRACE(opt == Opt::kSgd ? "sgd" : "adamw");
    // ZeRO-1 world 4 -> FSDP world 2 (FULL_SHARD, blocks).
    Segment zbase;
    zbase.world = 4;
    zbase.engine = Engine::kZero1;
    zbase.opt = opt;
    zbase.last_step = 6;
    const SegmentResult zwant = RunSegment(zbase);
    Segment z1 = zbase;
    z1.last_step = 3;
    z1.save_dir = dir + "/zero1";
    const SegmentResult za = RunSegment(z1);
    Segment f2;
    f2.world = 2;
    f2.opt = opt;
    f2.clip = false;
    f2.first_step = 3;
    f2.last_step = 6;
    f2.load_dir = z1.save_dir;
    ExpectContinues(za, RunSegment(f2), zwant);

    // FSDP world 4 (SHARD_GRAD_OP, no wrap) -> ZeRO-1 world 3.
    Segment fbase;
    fbase.world = 4;
    fbase.strategy = ShardingStrategy::kShardGradOp;
    fbase.policy = WrapPolicy::None();
    fbase.opt = opt;
    fbase.clip = false;
    fbase.last_step = 6;
    const SegmentResult fwant = RunSegment(fbase);
    Segment f1 = fbase;
    f1.last_step = 3;
    f1.save_dir = dir + "/fsdp";
    const SegmentResult fa = RunSegment(f1);
    Segment z2 = zbase;
    z2.world = 3;
    z2.first_step = 3;
    z2.load_dir = f1.save_dir;
    ExpectContinues(fa, RunSegment(z2), fwant);
  }
}

// Frozen parameters (a Block whose FSDP unit is all frozen and has no
// optimizer state, and the token embedding beside trainable parameters in
// the root unit, whose state stays zero) reshard across world sizes, wrap
// policies and engines: FSDP blocks world 4 -> FSDP one unit world 2, and ->
// ZeRO-1 world 3 (which keeps zero state for them), and ZeRO-1 world 4 ->
// FSDP blocks world 2. Each continues like the uninterrupted run, whose
// frozen parameters end as they began.
TEST(ShardedCheckpointTest, FrozenParametersReshardAcrossWrapsAndEngines) {
  const std::string dir = TestDir("frozen");
  Segment base;
  base.world = 4;
  base.opt = Opt::kAdamW;
  base.clip = false;  // as ZeRO-1
  base.freeze = {"transformer.h.0", "transformer.wte"};
  base.last_step = 6;
  Segment initial = base;
  initial.last_step = 0;
  const SegmentResult start = RunSegment(initial);
  const SegmentResult want = RunSegment(base);
  ASSERT_GT(want.losses.front() - want.losses.back(), 1e-3);  // the run moves
  ASSERT_EQ(want.params.size(), start.params.size());
  int frozen = 0, moved = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    const std::string& n = want.params[i].first;
    const bool is_frozen = absl::StartsWith(n, "transformer.h.0.") || n == "transformer.wte.weight";
    const bool same =
        tensor::testing::AllClose(want.params[i].second, start.params[i].second, 0, 0);
    if (is_frozen) {
      EXPECT_TRUE(same) << n;
      ++frozen;
    } else {
      moved += same ? 0 : 1;
    }
  }
  EXPECT_EQ(frozen, 13);  // wte and a Block's 12 tensors
  EXPECT_GT(moved, 0);

  Segment first = base;
  first.last_step = 3;
  first.save_dir = dir + "/fsdp";
  const SegmentResult a = RunSegment(first);
  Segment one_unit = base;
  one_unit.world = 2;
  one_unit.policy = WrapPolicy::None();
  one_unit.first_step = 3;
  one_unit.load_dir = first.save_dir;
  ExpectContinues(a, RunSegment(one_unit), want);
  Segment zero1 = one_unit;
  zero1.engine = Engine::kZero1;
  zero1.world = 3;
  ExpectContinues(a, RunSegment(zero1), want);

  Segment z_first = base;
  z_first.engine = Engine::kZero1;
  z_first.last_step = 3;
  z_first.save_dir = dir + "/zero1";
  const SegmentResult za = RunSegment(z_first);
  Segment blocks = base;
  blocks.world = 2;
  blocks.first_step = 3;
  blocks.load_dir = z_first.save_dir;
  ExpectContinues(za, RunSegment(blocks), want);
}

// ---- Layout, info, overwrite ----

TEST(ShardedCheckpointTest, FolderHoldsOneFilePerWriterAndAnIndex) {
  const std::string root = TestDir("layout");
  const std::string dir = root + "/ck";
  Segment seg;
  seg.world = 4;
  seg.opt = Opt::kAdamW;
  seg.last_step = 3;
  seg.save_dir = dir;
  RunSegment(seg);
  EXPECT_EQ(Listing(dir), (std::set<std::string>{"index.json", "shard_0_of_4.safetensors",
                                                 "shard_1_of_4.safetensors", "shard_2_of_4.safetensors",
                                                 "shard_3_of_4.safetensors"}));
  EXPECT_EQ(Listing(root), (std::set<std::string>{"ck"}));  // no temporary folders left
  absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->format_version, 1);
  EXPECT_EQ(info->writer, "fsdp");
  EXPECT_EQ(info->strategy, "FULL_SHARD");
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->num_files, 4);
  EXPECT_EQ(info->units, (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1"}));
  EXPECT_EQ(info->optimizer, "adamw");
  EXPECT_EQ(info->optimizer_buffers, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_TRUE(info->has_optimizer_state);
  EXPECT_EQ(info->optimizer_step, 3);
  EXPECT_EQ(info->extra.at("step"), "3");
  // Every parameter, with its Hugging Face name and shape.
  mingpt::GPT gpt(Tiny());
  std::map<std::string, tensor::Shape> want;
  for (auto& [n, p] : gpt.NamedParameters()) want[n] = p->shape;
  std::map<std::string, tensor::Shape> got(info->params.begin(), info->params.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.at("transformer.h.0.attn.c_attn.weight"), (tensor::Shape{24, 8}));

  // Saving again into the same folder replaces the checkpoint.
  seg.last_step = 4;
  RunSegment(seg);
  info = ReadShardedCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->extra.at("step"), "4");
  EXPECT_EQ(info->optimizer_step, 4);
  EXPECT_EQ(Listing(root), (std::set<std::string>{"ck"}));

  // NO_SHARD: every rank holds everything; rank 0 alone writes.
  Segment ns;
  ns.world = 2;
  ns.strategy = ShardingStrategy::kNoShard;
  ns.last_step = 1;
  ns.save_dir = root + "/no_shard";
  RunSegment(ns);
  EXPECT_EQ(Listing(ns.save_dir), (std::set<std::string>{"index.json", "shard_0_of_1.safetensors"}));
}

// Saved before the first step: no optimizer state; loading it clears the state.
TEST(ShardedCheckpointTest, CheckpointBeforeTheFirstStepHasNoOptimizerState) {
  const std::string dir = TestDir("step0") + "/ck";
  Segment base;
  base.world = 4;
  base.opt = Opt::kAdamW;
  base.last_step = 3;
  const SegmentResult want = RunSegment(base);
  Segment first = base;
  first.world = 2;
  first.last_step = 0;
  first.save_dir = dir;
  const SegmentResult a = RunSegment(first);
  absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->has_optimizer_state);
  EXPECT_EQ(info->optimizer_step, -1);
  Segment second = base;
  second.load_dir = dir;
  ExpectContinues(a, RunSegment(second), want);
  // An optimizer that has state loses it.
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(base, pg);
    m.TrainStep(base, pg, 0);
    ASSERT_GT(m.opt().StateBytes(), 0);
    ASSERT_TRUE(m.Load(dir, pg).ok());
    EXPECT_EQ(m.opt().StateBytes(), 0);
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Checksums per block of a slice: with 5-element blocks every slice has many
// blocks and loads read partial slices (4 -> 3 shards).
TEST(ShardedCheckpointTest, MultiBlockChecksumsLoadPartialSlices) {
  const std::string dir = TestDir("blocks") + "/ck";
  internal::SetCrcBlockElementsForTesting(5);
  Segment base;
  base.world = 4;
  base.opt = Opt::kAdamW;
  base.last_step = 4;
  const SegmentResult want = RunSegment(base);
  Segment first = base;
  first.last_step = 2;
  first.save_dir = dir;
  const SegmentResult a = RunSegment(first);
  internal::SetCrcBlockElementsForTesting(0);
  Segment second = base;
  second.world = 3;
  second.first_step = 2;
  second.load_dir = dir;
  ExpectContinues(a, RunSegment(second), want);
}

// ---- Errors ----

// A world-2 AdamW checkpoint (FULL_SHARD, blocks) after one step.
std::string SaveBase(const std::string& dir, Opt opt = Opt::kAdamW, int last_step = 1) {
  Segment seg;
  seg.world = 2;
  seg.opt = opt;
  seg.last_step = last_step;
  seg.save_dir = dir;
  RunSegment(seg);
  return dir;
}

// Loads `dir` at world 2 into a model trained one step (so there is state to
// lose). Every rank must fail with the same message containing every needle,
// and leave its shards and optimizer state bitwise unchanged.
Segment AdamW() {
  Segment seg;
  seg.opt = Opt::kAdamW;
  return seg;
}

void ExpectLoadFails(const std::string& dir, const std::vector<std::string>& needles,
                     Segment seg = AdamW()) {
  seg.world = 2;
  std::vector<std::string> messages(2);
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    m.TrainStep(seg, pg, 0);
    const NamedTensors before = m.Snapshot();
    auto loaded = m.Load(dir, pg);
    ASSERT_FALSE(loaded.ok());
    messages[rank] = std::string(loaded.status().message());
    ExpectBitwiseEqual(m.Snapshot(), before, "rank " + std::to_string(rank));
    // The world is still usable: the ranks agree on what happened.
    EXPECT_TRUE(pg.BarrierSync().ok());
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(messages[0], messages[1]);
  for (const std::string& n : needles) EXPECT_THAT(messages[0], HasSubstr(n));
  std::printf("error: %s\n", messages[0].c_str());
}

void Truncate(const std::string& path, int64_t size) { fs::resize_file(path, size); }

void FlipByte(const std::string& path, int64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(-from_end, std::ios::end);
  f.write(&c, 1);
}

TEST(ShardedCheckpointErrorTest, MissingFolderOrIndex) {
  const std::string root = TestDir("err_index");
  ExpectLoadFails(root + "/nope", {"load_sharded '" + root + "/nope'", "all 2 ranks", "does not exist"});
  const std::string dir = SaveBase(root + "/ck");
  fs::remove(dir + "/index.json");  // as a world that died before rank 0 wrote it
  ExpectLoadFails(dir, {"index.json' is missing", "did not finish"});
  std::ofstream(dir + "/index.json") << "{\"format\": ";
  ExpectLoadFails(dir, {"index.json' is invalid", "bad JSON"});
}

TEST(ShardedCheckpointErrorTest, MissingTruncatedCorruptedOrForeignShardFiles) {
  const std::string root = TestDir("err_files");
  // Rank 1 alone reads shard 1 (same layout): the other rank still fails too.
  std::string dir = SaveBase(root + "/missing");
  fs::remove(dir + "/shard_1_of_2.safetensors");
  ExpectLoadFails(dir, {"rank 1 of 2", "shard_1_of_2.safetensors' is missing"});

  dir = SaveBase(root + "/truncated");
  Truncate(dir + "/shard_0_of_2.safetensors", fs::file_size(dir + "/shard_0_of_2.safetensors") / 2);
  ExpectLoadFails(dir, {"rank 0 of 2", "shard_0_of_2.safetensors' has", "truncated"});

  dir = SaveBase(root + "/corrupted");
  FlipByte(dir + "/shard_1_of_2.safetensors", 7);
  ExpectLoadFails(dir, {"rank 1 of 2", "shard_1_of_2.safetensors' is corrupted", "checksum"});

  // A shard file of another checkpoint (same shapes, another id).
  dir = SaveBase(root + "/mixed");
  const std::string other = SaveBase(root + "/other", Opt::kAdamW, 2);
  fs::copy_file(other + "/shard_0_of_2.safetensors", dir + "/shard_0_of_2.safetensors",
                fs::copy_options::overwrite_existing);
  // Sizes match (same layout), so the id check is what catches it.
  ExpectLoadFails(dir, {"shard_0_of_2.safetensors' belongs to another checkpoint"});
}

// A parameter frozen beside trainable ones (the token embedding in FSDP's
// root unit with lm_head; in ZeRO-1's one bucket) is saved without optimizer
// state. Unfreezing it is refused, naming it and the way (the weights alone),
// rather than loading zero moments at the flat buffer's step count, which
// would make AdamW's first updates of those elements about 3x lr. Kept
// frozen it resumes (FrozenParametersReshardAcrossWrapsAndEngines).
TEST(ShardedCheckpointErrorTest, UnfreezingAParameterFrozenBesideTrainableOnesIsRefused) {
  for (Engine engine : {Engine::kFsdp, Engine::kZero1}) {
    const bool fsdp = engine == Engine::kFsdp;
    SCOPED_TRACE(fsdp ? "FSDP" : "ZeRO-1");
    Segment seg = AdamW();
    seg.engine = engine;
    seg.world = 2;
    seg.clip = false;
    seg.freeze = {"transformer.wte"};
    seg.last_step = 2;
    seg.save_dir = TestDir(fsdp ? "unfreeze_fsdp" : "unfreeze_zero1") + "/ck";
    RunSegment(seg);
    absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(seg.save_dir);
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_EQ(info->params.size(), info->param_has_state.size());
    for (size_t i = 0; i < info->params.size(); ++i) {
      EXPECT_EQ(info->param_has_state[i], info->params[i].first != "transformer.wte.weight")
          << info->params[i].first;
    }
    Segment unfrozen = AdamW();
    unfrozen.engine = engine;
    unfrozen.clip = false;
    ExpectLoadFails(seg.save_dir,
                    {"'transformer.wte.weight' has none", "frozen when it was saved",
                     "load_optimizer_state = false"},
                    unfrozen);
  }
}

TEST(ShardedCheckpointErrorTest, ModelOrOptimizerDiffersFromTheCheckpoint) {
  const std::string dir = SaveBase(TestDir("err_model") + "/ck");
  Segment seg;
  seg.opt = Opt::kAdamW;
  seg.config = Tiny(/*n_layer=*/3);
  ExpectLoadFails(dir, {"missing from the checkpoint", "transformer.h.2.ln_1.weight"}, seg);
  seg.config = Tiny(/*n_layer=*/1);
  ExpectLoadFails(dir, {"in the checkpoint that the model lacks", "transformer.h.1.ln_1.weight"}, seg);
  seg.config = Tiny(2, /*vocab=*/12);
  ExpectLoadFails(dir, {"shape mismatch", "'transformer.wte.weight' is (11,8) in the checkpoint but (12,8)"},
                  seg);
  seg.config = Tiny();
  seg.opt = Opt::kSgd;
  ExpectLoadFails(dir, {"optimizer state is adamw (exp_avg, exp_avg_sq)",
                        "the optimizer is sgd (momentum_buffer)"},
                  seg);
  // ZeRO-1 reports the same, and its all-gather after loading never starts.
  seg.engine = Engine::kZero1;
  ExpectLoadFails(dir, {"the optimizer is sgd"}, seg);
  // The model alone loads into another optimizer kind.
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    ShardedLoadOptions options;
    options.load_optimizer_state = false;
    auto extra = m.Load(dir, pg, options);
    EXPECT_TRUE(extra.ok()) << extra.status();
    EXPECT_EQ(m.opt().StateBytes(), 0);
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A save that fails on one rank fails on every rank, and leaves the previous
// checkpoint (and nothing else) in place.
TEST(ShardedCheckpointErrorTest, FailedSaveKeepsThePreviousCheckpoint) {
  const std::string root = TestDir("err_save");
  const std::string dir = SaveBase(root + "/ck", Opt::kAdamW, 1);
  internal::SetShardWriteFaultForTesting([](int rank) {
    return rank == 1 ? absl::ResourceExhaustedError("No space left on device (injected)")
                     : absl::OkStatus();
  });
  Segment seg;
  seg.world = 2;
  seg.opt = Opt::kAdamW;
  std::vector<absl::Status> statuses(2);
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    m.TrainStep(seg, pg, 0);
    m.TrainStep(seg, pg, 1);
    statuses[rank] = m.Save(dir, pg, {{"step", "2"}});
  });
  internal::SetShardWriteFaultForTesting(nullptr);
  ASSERT_TRUE(s.ok()) << s;
  for (const absl::Status& st : statuses) {
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(st.message(), HasSubstr("rank 1 of 2: No space left on device (injected)"));
  }
  EXPECT_EQ(Listing(root), (std::set<std::string>{"ck"}));
  absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->extra.at("step"), "1");
  Segment load = seg;
  load.first_step = 1;
  load.last_step = 1;
  load.load_dir = dir;
  RunSegment(load);

  // A folder holding anything else is never replaced.
  const std::string other = root + "/mine";
  fs::create_directories(other);
  std::ofstream(other + "/notes.txt") << "keep me";
  s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    absl::Status saved = m.Save(other, pg, {});
    EXPECT_THAT(saved.message(), HasSubstr("refusing to replace '" + other + "': it holds 'notes.txt'"));
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Listing(other), (std::set<std::string>{"notes.txt"}));
  EXPECT_EQ(Listing(root), (std::set<std::string>{"ck", "mine"}));
}

}  // namespace
}  // namespace dist
