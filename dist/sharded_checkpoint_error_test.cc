// Sharded checkpoints that do not load or save, on the threads engine with
// the tiny minGPT of sharded_checkpoint_testing.h: a missing folder or index,
// missing, truncated, corrupted or foreign shard files, a model or optimizer
// that differs from the checkpoint, unfreezing a parameter saved without
// state, a save failing on one rank. Each error names the problem, every rank
// returns the same one, and nothing changes: the ranks' shards and optimizer
// state stay bitwise as they were, the previous checkpoint stays in place.
#include "dist/sharded_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "dist/sharded_checkpoint_testing.h"
#include "dist/thread_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dist {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
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
using checkpoint_testing::TestDir;
using checkpoint_testing::Tiny;

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

Segment AdamW() {
  Segment seg;
  seg.opt = Opt::kAdamW;
  return seg;
}

// Loads dirs[rank] at world 2 into a model trained one step (so there is
// state to lose); each rank's load must fail and leave its shards and
// optimizer state bitwise unchanged. The ranks' statuses.
std::vector<absl::Status> FailingLoads(const std::vector<std::string>& dirs,
                                       Segment seg = AdamW()) {
  seg.world = 2;
  std::vector<absl::Status> got(2);
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    m.TrainStep(seg, pg, 0);
    const NamedTensors before = m.Snapshot();
    got[rank] = m.Load(dirs[rank], pg).status();
    EXPECT_FALSE(got[rank].ok()) << "rank " << rank;
    ExpectBitwiseEqual(m.Snapshot(), before, "rank " + std::to_string(rank));
    // The world is still usable: the ranks agree on what happened.
    EXPECT_TRUE(pg.BarrierSync().ok());
  });
  EXPECT_TRUE(s.ok()) << s;
  return got;
}

// Every rank must fail loading `dir` with the same message containing every
// needle (FailingLoads).
void ExpectLoadFails(const std::string& dir, const std::vector<std::string>& needles,
                     Segment seg = AdamW()) {
  const std::vector<absl::Status> got = FailingLoads({dir, dir}, seg);
  const std::vector<std::string> messages = {std::string(got[0].message()),
                                             std::string(got[1].message())};
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

  // A digit of the optimizer's step changed: still valid JSON and records,
  // refused by index.json's own checksum.
  const std::string changed = SaveBase(root + "/changed");
  std::string text;
  {
    std::ifstream in(changed + "/index.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = text.find("\"has_state\": true, \"step\": ");
  ASSERT_NE(at, std::string::npos) << text;
  const size_t digit = at + std::string("\"has_state\": true, \"step\": ").size();
  text[digit] = text[digit] == '9' ? '8' : '9';
  std::ofstream(changed + "/index.json", std::ios::trunc) << text;
  ExpectLoadFails(changed,
                  {"index.json' is invalid", "its text does not match its checksum"});
}

// Ranks given different folders (two checkpoints of the same model) all
// refuse, naming each rank's checkpoint id, before anything is loaded.
TEST(ShardedCheckpointErrorTest, RanksGivenDifferentCheckpointsAllRefuse) {
  const std::string root = TestDir("err_differ");
  for (const absl::Status& g : FailingLoads({SaveBase(root + "/a"), SaveBase(root + "/b")})) {
    EXPECT_EQ(g.code(), absl::StatusCode::kFailedPrecondition) << g;
    EXPECT_THAT(std::string(g.message()),
                HasSubstr("the ranks read different checkpoints (checkpoint ids: rank 0 "));
    EXPECT_THAT(std::string(g.message()), HasSubstr("nothing was loaded"));
  }
}

// A ZeRO-1 save or load through a group whose ranks are in another order than
// the one the model shards over fails on the ranks whose slice moved (1 and
// 2), and on the others with them instead of their waiting in the save's
// first exchange for ranks that returned.
TEST(ShardedCheckpointErrorTest, AGroupInAnotherRankOrderFailsEveryRank) {
  Segment seg;
  seg.world = 4;
  seg.engine = Engine::kZero1;
  seg.opt = Opt::kAdamW;
  const std::string dir = TestDir("err_order") + "/ck";
  std::vector<absl::Status> saved(4), loaded(4);
  absl::Status s = RunRanks(4, [&](int rank, ProcessGroup& pg) {
    RankModel m(seg, pg);
    m.TrainStep(seg, pg, 0);
    const int key[] = {0, 2, 1, 3};
    absl::StatusOr<std::unique_ptr<ProcessGroup>> swapped = pg.Split(0, key[rank]);
    ASSERT_TRUE(swapped.ok()) << swapped.status();
    saved[rank] = SaveSharded(dir, *m.zero, **swapped, {});
    loaded[rank] = LoadSharded(dir, *m.zero, **swapped).status();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 4; ++r) {
    for (const absl::Status& g : {saved[r], loaded[r]}) {
      EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument) << "rank " << r << ": " << g;
      EXPECT_THAT(std::string(g.message()), HasSubstr("is not the one this Zero1 shards over"));
      EXPECT_THAT(std::string(g.message()), HasSubstr("rank 1 of 4: the process group"));
      EXPECT_THAT(std::string(g.message()), HasSubstr("rank 2 of 4: the process group"));
    }
  }
  EXPECT_FALSE(fs::exists(dir));
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

  // Two shard files of this checkpoint swapped (renamed into each other's place).
  dir = SaveBase(root + "/swapped");
  fs::rename(dir + "/shard_0_of_2.safetensors", dir + "/tmp");
  fs::rename(dir + "/shard_1_of_2.safetensors", dir + "/shard_0_of_2.safetensors");
  fs::rename(dir + "/tmp", dir + "/shard_1_of_2.safetensors");
  ExpectLoadFails(dir, {"shard_0_of_2.safetensors' holds shard 1/2 of this checkpoint (its "
                        "fsdp.shard) where index.json lists shard 0/2: shard files renamed, "
                        "swapped"});
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
                        "the optimizer is sgd (momentum_buffer)",
                        "or take the weights alone with --init_from"},
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
