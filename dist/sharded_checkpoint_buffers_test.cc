// Module buffers in sharded checkpoints, on the threads engine with a tiny
// Linear(4, 6) -> BatchNorm1d(6) -> Linear(6, 3) trained a few steps (each
// rank on its own batches, so each rank's running statistics differ):
//   - saved by FSDP FULL_SHARD at world 2, loaded by FSDP at world 3 and by
//     ZeRO-1 at world 2: every rank's buffers equal rank 0's saved ones,
//     bitwise, dtypes included (num_batches_tracked is i64); the index lists
//     them (ReadShardedCheckpointInfo); ZeRO-1 saves them too;
//   - refused loads (a checkpoint without buffers, a buffer of another shape
//     or dtype, one the model lacks, a corrupted, truncated or missing
//     buffers file): the same error on every rank naming the buffer or file,
//     and nothing changed.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/fsdp.h"
#include "dist/sharded_checkpoint.h"
#include "dist/sharded_checkpoint_offline.h"
#include "dist/sharded_checkpoint_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/linear.h"
#include "optim/sgd.h"
#include "tensor/testing.h"

namespace dist {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using checkpoint_testing::ExpectBitwiseEqual;
using checkpoint_testing::NamedTensors;
using checkpoint_testing::TestDir;
using tensor::Tensor;

std::unique_ptr<nn::Sequential> Net() {
  auto seq = std::make_unique<nn::Sequential>();
  seq->Append(std::make_unique<nn::Linear>(4, 6));
  seq->Append(std::make_unique<nn::BatchNorm1d>(6));
  seq->Append(std::make_unique<nn::Linear>(6, 3));
  return seq;
}

std::unique_ptr<optim::Optimizer> Sgd() {
  optim::SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return optim::SGD::Create(o).value();
}

// A net under FSDP (FULL_SHARD, one unit) or ZeRO-1 on one rank.
struct BnRank {
  std::unique_ptr<nn::Sequential> net = Net();
  std::unique_ptr<FullyShardedModel> fsdp;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<Zero1> zero;

  BnRank(bool use_fsdp, ProcessGroup& pg, uint64_t seed) {
    if (use_fsdp) {
      FsdpOptions o;
      o.strategy = ShardingStrategy::kFullShard;
      o.seed = seed;
      fsdp = FullyShard(*net, pg, o);
      opt = Sgd();
    } else {
      net->Materialize(seed);
      zero = std::make_unique<Zero1>(*net, pg, Sgd());
    }
  }

  // One step on this rank's own batch (loss 0.5 |y|^2): the running
  // statistics move by this rank's batch statistics.
  void TrainStep(ProcessGroup& pg, int step) {
    const Tensor x = tensor::testing::RandomTensor({5, 4}, 100 + 10 * step + pg.rank(), -2, 3);
    nn::Context ctx;
    if (fsdp) fsdp->ZeroGrad();
    const Tensor y = net->Run(x, ctx);
    net->RunBackward(y, ctx);
    if (fsdp) {
      opt->Step(fsdp->ParamRefs());
    } else {
      ASSERT_TRUE(zero->Step().ok());
      zero->ZeroGrad();
    }
  }

  absl::Status Save(const std::string& dir, ProcessGroup& pg) {
    return fsdp ? SaveSharded(dir, *fsdp, *opt, pg, {{"step", "3"}})
                : SaveSharded(dir, *zero, pg, {{"step", "3"}});
  }
  absl::StatusOr<std::map<std::string, std::string>> Load(
      const std::string& dir, ProcessGroup& pg, const ShardedLoadOptions& options = {}) {
    return fsdp ? LoadSharded(dir, *fsdp, *opt, pg, options)
                : LoadSharded(dir, *zero, pg, options);
  }

  NamedTensors Buffers() {
    NamedTensors out;
    for (auto& [name, b] : net->NamedBuffers()) out.emplace_back(name, b->Clone());
    return out;
  }
  // Buffers, shards or master slices, optimizer state: what a load may change.
  NamedTensors Snapshot() {
    NamedTensors out = Buffers();
    if (fsdp) {
      for (int u = 0; u < fsdp->num_units(); ++u) {
        out.emplace_back("shard", fsdp->flat_param(u).shard().Clone());
      }
    } else {
      for (int b = 0; b < zero->num_buckets(); ++b) {
        out.emplace_back("master", zero->master_shard(b).Clone());
      }
    }
    optim::Optimizer& o = fsdp ? *opt : zero->optimizer();
    for (auto& [n, t] : o.StateTensors()) out.emplace_back("opt:" + n, t.Clone());
    return out;
  }
};

// Trains a world-`world` net 3 steps and saves it to `dir`; rank 0's buffers
// as saved.
NamedTensors TrainAndSave(const std::string& dir, bool use_fsdp, int world = 2) {
  std::vector<NamedTensors> buffers(world);
  std::mutex mu;
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    BnRank r(use_fsdp, pg, 7);
    for (int step = 0; step < 3; ++step) r.TrainStep(pg, step);
    NamedTensors mine = r.Buffers();  // copies
    const absl::Status saved = r.Save(dir, pg);
    std::lock_guard<std::mutex> lock(mu);
    buffers[rank] = std::move(mine);
    ASSERT_TRUE(saved.ok()) << saved;
  });
  EXPECT_TRUE(s.ok()) << s;
  for (int r = 0; r < world; ++r) {
    if (buffers[r].empty()) {
      ADD_FAILURE() << "rank " << r << " has no buffers";
      return {};
    }
  }
  // The ranks' statistics differ: which ones were saved is a real question.
  for (int r = 1; r < world; ++r) {
    EXPECT_FALSE(tensor::testing::AllClose(buffers[r][0].second, buffers[0][0].second, 0, 0));
  }
  return buffers[0];
}

// Loads `dir` at `world` (FSDP or ZeRO-1, from another seed): every rank's
// buffers must equal `want`.
void ExpectLoadsBuffers(const std::string& dir, bool use_fsdp, int world,
                        const NamedTensors& want) {
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    BnRank r(use_fsdp, pg, 99);
    r.TrainStep(pg, 5);  // statistics of its own, to be replaced
    absl::StatusOr<std::map<std::string, std::string>> extra = r.Load(dir, pg);
    ASSERT_TRUE(extra.ok()) << extra.status();
    ExpectBitwiseEqual(r.Buffers(), want, "rank " + std::to_string(rank));
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ShardedCheckpointBuffersTest, FsdpWorld2LoadsAtWorld3AndIntoZero1) {
  const std::string dir = TestDir("buffers_fsdp") + "/ck";
  const NamedTensors saved = TrainAndSave(dir, /*use_fsdp=*/true);
  ASSERT_EQ(saved.size(), 3u);
  EXPECT_EQ(saved[0].first, "1.running_mean");
  EXPECT_EQ(saved[2].first, "1.num_batches_tracked");
  EXPECT_EQ(saved[2].second.dtype(), tensor::Dtype::kI64);
  EXPECT_EQ(saved[2].second.data<int64_t>()[0], 3);
  EXPECT_TRUE(fs::exists(dir + "/buffers.safetensors"));

  absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(dir);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->format_version, 2);
  ASSERT_EQ(info->buffers.size(), 3u);
  EXPECT_EQ(info->buffers[1].name, "1.running_var");
  EXPECT_EQ(info->buffers[1].shape, tensor::Shape({6}));
  EXPECT_EQ(info->buffers[1].dtype, tensor::Dtype::kF32);
  EXPECT_EQ(info->buffers[2].shape, saved[2].second.shape());
  EXPECT_EQ(info->buffers[2].dtype, tensor::Dtype::kI64);

  ExpectLoadsBuffers(dir, /*use_fsdp=*/true, 3, saved);
  ExpectLoadsBuffers(dir, /*use_fsdp=*/false, 2, saved);
  absl::StatusOr<tensor::NamedTensors> offline = ReadShardedBuffers(dir);
  ASSERT_TRUE(offline.ok()) << offline.status();
  ExpectBitwiseEqual(*offline, saved, "ReadShardedBuffers");
}

TEST(ShardedCheckpointBuffersTest, Zero1SavesBuffersFsdpLoadsThem) {
  const std::string dir = TestDir("buffers_zero1") + "/ck";
  const NamedTensors saved = TrainAndSave(dir, /*use_fsdp=*/false, 3);
  ASSERT_EQ(saved.size(), 3u);
  ExpectLoadsBuffers(dir, /*use_fsdp=*/true, 2, saved);
}

// Every rank's load of `dir` (FSDP at world 2) fails with the same message
// holding every needle, and changes nothing.
void ExpectLoadFails(const std::string& dir, const std::vector<std::string>& needles) {
  std::vector<std::string> messages(2);
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    BnRank r(/*use_fsdp=*/true, pg, 99);
    r.TrainStep(pg, 5);
    const NamedTensors before = r.Snapshot();
    absl::StatusOr<std::map<std::string, std::string>> extra = r.Load(dir, pg);
    ASSERT_FALSE(extra.ok());
    messages[rank] = std::string(extra.status().message());
    ExpectBitwiseEqual(r.Snapshot(), before, "rank " + std::to_string(rank));
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(messages[0], messages[1]);
  for (const std::string& n : needles) EXPECT_THAT(messages[0], HasSubstr(n));
  std::printf("error: %s\n", messages[0].c_str());
}

// The net's parameters (as saved at world 1 by WriteWholeParameters) with
// `buffers`.
std::string WriteNet(const std::string& dir, const tensor::NamedTensors& buffers) {
  auto net = Net();
  net->Materialize(3);
  std::vector<WholeParameter> params;
  for (auto& [name, p] : net->NamedParameters()) params.push_back({name, p->value});
  EXPECT_TRUE(WriteWholeParameters(dir, params, "sgd", {"momentum_buffer"}, {}, buffers).ok());
  return dir;
}

tensor::NamedTensors NetBuffers() {
  return {{"1.running_mean", Tensor::Zeros({6})},
          {"1.running_var", Tensor::Zeros({6})},
          {"1.num_batches_tracked", Tensor::Zeros({}, tensor::Dtype::kI64)}};
}

TEST(ShardedCheckpointBuffersTest, RefusedLoadsNameTheBufferAndChangeNothing) {
  const std::string root = TestDir("buffers_refused");
  // A checkpoint without buffers (as before buffers were saved).
  std::string dir = WriteNet(root + "/none", {});
  ExpectLoadFails(dir, {"load_sharded", "all 2 ranks",
                        "buffers of the model missing from the checkpoint: 1.running_mean, "
                        "1.running_var, 1.num_batches_tracked",
                        "holds no buffers",
                        "keep_buffers_missing_from_checkpoint keeps the model's"});
  // ... which loads with keep_buffers_missing_from_checkpoint: the model's
  // buffers stay, the parameters are the checkpoint's.
  absl::Status kept = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    BnRank r(/*use_fsdp=*/true, pg, 99);
    r.TrainStep(pg, 5);
    const NamedTensors before = r.Buffers();
    ShardedLoadOptions options;
    options.keep_buffers_missing_from_checkpoint = true;
    absl::StatusOr<std::map<std::string, std::string>> extra = r.Load(dir, pg, options);
    ASSERT_TRUE(extra.ok()) << extra.status();
    ExpectBitwiseEqual(r.Buffers(), before, "rank " + std::to_string(rank));
  });
  EXPECT_TRUE(kept.ok()) << kept;
  // Another shape; another dtype.
  tensor::NamedTensors b = NetBuffers();
  b[0].second = Tensor::Zeros({7});
  ExpectLoadFails(WriteNet(root + "/shape", b),
                  {"buffer shape or dtype mismatch: '1.running_mean' is f32 (7) in the "
                   "checkpoint but f32 (6) in the model"});
  b = NetBuffers();
  b[2].second = Tensor::Zeros({});
  ExpectLoadFails(WriteNet(root + "/dtype", b), {"'1.num_batches_tracked' is f32"});
  // One the model lacks.
  b = NetBuffers();
  b.emplace_back("1.extra", Tensor::Zeros({2}));
  ExpectLoadFails(WriteNet(root + "/extra", b),
                  {"buffers in the checkpoint that the model lacks: 1.extra"});
  // The file corrupted (its last byte is num_batches_tracked's), truncated, missing.
  dir = WriteNet(root + "/corrupt", NetBuffers());
  const std::string file = dir + "/buffers.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  ExpectLoadFails(dir, {"buffers.safetensors' is corrupted: buffer '1.num_batches_tracked'"});
  fs::resize_file(file, fs::file_size(file) - 8);
  ExpectLoadFails(dir, {"buffers.safetensors' has", "(truncated)"});
  fs::remove(file);
  ExpectLoadFails(dir, {"buffers file", "is missing"});
}

}  // namespace
}  // namespace dist
