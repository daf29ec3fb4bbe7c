// Sharded checkpoints on the threads engine with a tiny minGPT (2 blocks,
// n_embd 8, vocab 11; sharded_checkpoint_testing.h), SGD with momentum and
// AdamW:
//   - save at world 4 after 3 steps, load at world 2 (FULL_SHARD / SHARD_GRAD_OP
//     / NO_SHARD, other wrap policies), continue 3 steps on the same global
//     batches: the losses and final parameters equal the uninterrupted 6-step
//     world-4 run;
//   - a round trip at the same world size is bitwise (shards, optimizer state,
//     and the losses that follow);
//   - world 3 (uneven padding) -> 1 and 1 -> 3; ZeRO-1 4 -> 2; ZeRO-1 <-> FSDP;
//   - a checkpoint saved before the first step; multi-block checksums.
// The errors: sharded_checkpoint_error_test.cc.
// Tolerance against an uninterrupted run at another world size (fp32):
// |got - want| <= 1e-5 + 1e-5 |want| for every loss and parameter element (the
// ranks sum their parts of the batch in another order, so results are not
// bitwise); at the same world size and layout they are bitwise.
#include "dist/sharded_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "dist/sharded_checkpoint_testing.h"
#include "dist/thread_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/testing.h"

namespace dist {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using tensor::Tensor;
using checkpoint_testing::Blocks;
using checkpoint_testing::Engine;
using checkpoint_testing::ExpectBitwiseEqual;
using checkpoint_testing::ExpectContinues;
using checkpoint_testing::Listing;
using checkpoint_testing::NamedTensors;
using checkpoint_testing::Opt;
using checkpoint_testing::RankModel;
using checkpoint_testing::RunSegment;
using checkpoint_testing::Segment;
using checkpoint_testing::SegmentResult;
using checkpoint_testing::StepIdx;
using checkpoint_testing::StepTgt;
using checkpoint_testing::TestDir;
using checkpoint_testing::Tiny;
using checkpoint_testing::kSeed;

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

// A ZeRO-1 parameter frozen when wrapped and unfrozen before a save (for the
// next phase of training) was never stepped: it is saved without optimizer
// state, as wrapped, not with the zero state its current flag would claim.
TEST(ShardedCheckpointTest, Zero1SavesTheFrozenFlagsItWasWrappedWith) {
  const std::string dir = TestDir("unfrozen") + "/ck";
  Segment base;
  base.world = 2;
  base.engine = Engine::kZero1;
  base.opt = Opt::kAdamW;
  base.clip = false;
  base.freeze = {"transformer.wte"};
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(base, pg);
    m.TrainStep(base, pg, 0);
    for (auto& [name, p] : m.gpt->NamedParameters()) p->requires_grad = true;
    ASSERT_TRUE(m.Save(dir, pg, {}).ok());
  });
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->param_has_state.size(), info->params.size());
  int stateless = 0;
  for (size_t i = 0; i < info->params.size(); ++i) {
    const bool wte = info->params[i].first == "transformer.wte.weight";
    EXPECT_EQ(info->param_has_state[i], !wte) << info->params[i].first;
    stateless += info->param_has_state[i] ? 0 : 1;
  }
  EXPECT_EQ(stateless, 1);
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

// A load while Unshard() or UnshardRoot() holds units (generation between
// checkpoints): the held values were the old shards'; the next forward
// computes with the loaded ones, as a fresh model that loaded them does.
TEST(ShardedCheckpointTest, LoadingWhileUnitsAreHeldUsesTheLoadedValues) {
  const std::string dir = TestDir("held") + "/ck";
  Segment base;
  base.world = 2;
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel saved(base, pg, /*seed=*/kSeed + 1);
    saved.TrainStep(base, pg, 0);
    ASSERT_TRUE(saved.Save(dir, pg, {}).ok());
    RankModel fresh(base, pg);
    ASSERT_TRUE(fresh.Load(dir, pg).ok());
    const tensor::Tensor idx = StepIdx(base.config, 1), tgt = StepTgt(base.config, 1);
    const double want = fresh.gpt->Loss(idx, tgt);
    for (bool root_only : {false, true}) {
      SCOPED_TRACE(root_only ? "UnshardRoot" : "Unshard");
      RankModel held(base, pg);
      root_only ? held.fsdp->UnshardRoot() : held.fsdp->Unshard();
      const double before = held.gpt->Loss(idx, tgt);
      ASSERT_TRUE(held.Load(dir, pg).ok());
      EXPECT_NE(held.gpt->Loss(idx, tgt), before);
      EXPECT_EQ(held.gpt->Loss(idx, tgt), want) << "rank " << rank;
    }
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

}  // namespace
}  // namespace dist
