// ForEachWholeParameter reads a sharded checkpoint back whole on one process:
// FSDP's (world 2, auto-wrap by Block) values equal FullStateDict() bit for
// bit; ZeRO-1's (world 2) optimizer buffers, laid end to end in registration
// order, equal the ranks' flat optimizer shards bit for bit; a corrupted or
// missing shard file is an error naming it. ShardedCheckpointInitSources read
// ranges of the same values.
#include "dist/sharded_checkpoint_offline.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/sharded_checkpoint.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "tensor/safetensors.h"

namespace dist {
namespace {

namespace fs = std::filesystem;
using tensor::Tensor;
using ::testing::HasSubstr;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

constexpr int kWorld = 2;
constexpr int kSteps = 2;
constexpr int64_t kBatchPerRank = 2;

std::unique_ptr<optim::Optimizer> AdamW() {
  optim::AdamWOptions a;
  a.lr = 1e-2;
  a.weight_decay = 0.1;
  return optim::AdamW::Create(a).value();
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/sharded_checkpoint_offline_test/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir + "/ck";
}

// (B, T) ids of this rank for `step`.
Tensor Batch(const mingpt::GptConfig& c, ProcessGroup& pg, int step, int salt) {
  return testing::RandomIds(kBatchPerRank, c.block_size, c.vocab_size,
                            1000 * salt + 10 * step + pg.rank());
}

// Flips one bit of the byte at `offset` from `whence` in `path`.
void FlipByte(const std::string& path, std::streamoff offset, std::ios::seekdir whence) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset, whence);
  char b = 0;
  f.read(&b, 1);
  b ^= 0x20;
  f.seekp(offset, whence);
  f.write(&b, 1);
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.Contiguous().raw_data(), b.Contiguous().raw_data(), a.nbytes()) == 0;
}

// Trains FSDP for kSteps, saves to `dir`, returns rank 0's FullStateDict.
NamedTensors SaveFsdp(const std::string& dir) {
  NamedTensors full;
  std::mutex mu;
  absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
    const mingpt::GptConfig c = testing::Tiny();
    mingpt::GPT gpt(c);
    FsdpOptions o;
    o.policy = WrapPolicy::Transformer({"Block"});
    o.seed = 5;
    std::unique_ptr<FullyShardedModel> fsdp = FullyShard(gpt, pg, o);
    std::unique_ptr<optim::Optimizer> opt = AdamW();
    for (int step = 0; step < kSteps; ++step) {
      fsdp->ZeroGrad();
      gpt.ForwardBackward(Batch(c, pg, step, 1), Batch(c, pg, step, 2));
      opt->Step(fsdp->ParamRefs());
    }
    ASSERT_TRUE(SaveSharded(dir, *fsdp, *opt, pg, {{"step", "2"}}).ok());
    NamedTensors mine = fsdp->FullStateDict();
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [n, t] : mine) full.emplace_back(n, t.Clone());
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  return full;
}

TEST(ShardedCheckpointOfflineTest, FsdpValuesEqualTheFullStateDict) {
  const std::string dir = TestDir("fsdp");
  const NamedTensors want = SaveFsdp(dir);
  ASSERT_FALSE(want.empty());
  NamedTensors got;
  absl::Status s =
      ForEachWholeParameter(dir, /*with_optimizer_state=*/true, [&](const WholeParameter& p) {
        EXPECT_TRUE(p.has_state) << p.name;
        EXPECT_EQ(p.step, kSteps) << p.name;
        EXPECT_EQ(p.buffers.size(), 2u) << p.name;
        for (const Tensor& b : p.buffers) {
          EXPECT_EQ(b.shape(), p.value.shape()) << p.name;
        }
        got.emplace_back(p.name, p.value);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  // index.json lists FSDP's parameters unit by unit (the root unit first).
  ASSERT_EQ(got.size(), want.size());
  std::map<std::string, Tensor> by_name(got.begin(), got.end());
  for (const auto& [name, value] : want) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_EQ(by_name[name].shape(), value.shape()) << name;
    EXPECT_TRUE(BitwiseEqual(by_name[name], value)) << name;
  }

  // Without the optimizer state: the same values, no buffers.
  int seen = 0;
  s = ForEachWholeParameter(dir, /*with_optimizer_state=*/false, [&](const WholeParameter& p) {
    EXPECT_FALSE(p.has_state);
    EXPECT_TRUE(p.buffers.empty());
    EXPECT_TRUE(BitwiseEqual(p.value, by_name[p.name])) << p.name;
    ++seen;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, static_cast<int>(want.size()));

  // The callback's error stops the walk and comes back.
  seen = 0;
  s = ForEachWholeParameter(dir, false, [&](const WholeParameter&) {
    ++seen;
    return absl::CancelledError("enough");
  });
  EXPECT_EQ(s, absl::CancelledError("enough"));
  EXPECT_EQ(seen, 1);
}

TEST(ShardedCheckpointOfflineTest, Zero1BuffersEqualTheRanksFlatOptimizerShards) {
  const std::string dir = TestDir("zero1");
  // Rank r's flat buffers ("zero1.bucket0.exp_avg", ...; one bucket), in rank order.
  std::vector<NamedTensors> shards(kWorld);
  std::vector<std::string> registration;
  absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
    const mingpt::GptConfig c = testing::Tiny();
    mingpt::GPT gpt(c);
    gpt.Materialize(5);
    Zero1 zero(gpt, pg, AdamW());
    ASSERT_EQ(zero.num_buckets(), 1);
    for (int step = 0; step < kSteps; ++step) {
      gpt.ForwardBackward(Batch(c, pg, step, 1), Batch(c, pg, step, 2));
      ASSERT_TRUE(zero.Step().ok());
      zero.ZeroGrad();
    }
    ASSERT_TRUE(SaveSharded(dir, zero, pg, {{"step", "2"}}).ok());
    NamedTensors mine;
    for (auto& [n, t] : zero.optimizer().StateTensors()) mine.emplace_back(n, t.Clone());
    shards[rank] = std::move(mine);
    if (rank == 0) {
      for (auto& [n, p] : gpt.NamedParameters()) registration.push_back(n);
    }
  });
  ASSERT_TRUE(s.ok()) << s;

  std::map<std::string, WholeParameter> read;
  s = ForEachWholeParameter(dir, true, [&](const WholeParameter& p) {
    EXPECT_TRUE(p.has_state && p.step == kSteps) << p.name;
    read[p.name] = p;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(read.size(), registration.size());
  // The buffers end to end in registration order, as ZeRO-1 lays out its flat buffer.
  std::vector<std::vector<float>> ordered(2);
  for (const std::string& n : registration) {
    ASSERT_EQ(read.count(n), 1u) << n;
    for (size_t k = 0; k < 2; ++k) {
      const Tensor& b = read[n].buffers[k];
      ordered[k].insert(ordered[k].end(), b.data<float>(), b.data<float>() + b.numel());
    }
  }
  const char* keys[2] = {"zero1.bucket0.exp_avg", "zero1.bucket0.exp_avg_sq"};
  for (size_t k = 0; k < 2; ++k) {
    std::vector<float> flat;
    for (const NamedTensors& rank : shards) {
      for (const auto& [n, t] : rank) {
        if (n != keys[k]) continue;
        const float* d = t.data<float>();
        flat.insert(flat.end(), d, d + t.numel());
      }
    }
    ASSERT_GE(flat.size(), ordered[k].size()) << keys[k];
    for (size_t i = ordered[k].size(); i < flat.size(); ++i) EXPECT_EQ(flat[i], 0.0f) << "padding";
    flat.resize(ordered[k].size());
    EXPECT_EQ(0, std::memcmp(flat.data(), ordered[k].data(), flat.size() * sizeof(float)))
        << keys[k];
  }
}

std::vector<WholeParameter> ReadAll(const std::string& dir) {
  std::vector<WholeParameter> all;
  absl::Status s = ForEachWholeParameter(dir, true, [&](const WholeParameter& p) {
    all.push_back(p);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return all;
}

// Whole parameters written back as a one-file checkpoint read back the same,
// and FSDP at world 2 loads it into the parameters it was saved from.
TEST(ShardedCheckpointOfflineTest, WrittenWholeParametersReadBackAndLoadIntoFsdp) {
  const std::string dir = TestDir("whole_src");
  const NamedTensors want = SaveFsdp(dir);
  const std::vector<WholeParameter> src = ReadAll(dir);
  const std::string out = TestDir("whole_out");
  ASSERT_TRUE(
      WriteWholeParameters(out, src, "adamw", {"exp_avg", "exp_avg_sq"}, {{"step", "2"}}).ok());
  EXPECT_TRUE(fs::exists(out + "/shard_0_of_1.safetensors"));
  absl::StatusOr<ShardedCheckpointInfo> info = ReadShardedCheckpointInfo(out);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->writer, "converted");
  EXPECT_EQ(info->world_size, 1);
  EXPECT_EQ(info->optimizer_step, kSteps);
  const std::vector<WholeParameter> back = ReadAll(out);
  ASSERT_EQ(back.size(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(back[i].name, src[i].name);
    EXPECT_TRUE(BitwiseEqual(back[i].value, src[i].value)) << src[i].name;
    EXPECT_EQ(back[i].step, src[i].step);
    ASSERT_EQ(back[i].buffers.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_TRUE(BitwiseEqual(back[i].buffers[k], src[i].buffers[k])) << src[i].name;
    }
  }
  std::mutex mu;
  NamedTensors loaded;
  absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(testing::Tiny());
    FsdpOptions o;
    o.policy = WrapPolicy::None();  // another wrap policy than the save's
    std::unique_ptr<FullyShardedModel> fsdp = FullyShard(gpt, pg, o);
    std::unique_ptr<optim::Optimizer> opt = AdamW();
    absl::StatusOr<std::map<std::string, std::string>> extra = LoadSharded(out, *fsdp, *opt, pg);
    ASSERT_TRUE(extra.ok()) << extra.status();
    EXPECT_EQ(extra->at("step"), "2");
    NamedTensors mine = fsdp->FullStateDict();
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [n, t] : mine) loaded.emplace_back(n, t.Clone());
    }
  });
  ASSERT_TRUE(s.ok()) << s;
  std::map<std::string, Tensor> by_name(loaded.begin(), loaded.end());
  ASSERT_EQ(by_name.size(), want.size());
  for (const auto& [name, value] : want) {
    EXPECT_TRUE(BitwiseEqual(by_name[name], value)) << name;
  }
}

// A one-process or DDP checkpoint in which the optimizer skipped a
// parameter in some steps (no backward reached it: no state, or fewer steps
// than the others) cannot form one flat parameter's state (one step count):
// FSDP's load refuses it, naming both parameters, the cause and the way out
// (the weights alone), which loads.
TEST(ShardedCheckpointOfflineTest, ParametersSkippedInSomeStepsAreRefusedInOneFlatParameter) {
  const std::string dir = TestDir("skipped_src");
  SaveFsdp(dir);
  const std::vector<WholeParameter> src = ReadAll(dir);
  ASSERT_GE(src.size(), 2u);
  for (bool no_state : {true, false}) {
    SCOPED_TRACE(no_state ? "never stepped" : "stepped fewer times");
    std::vector<WholeParameter> skipped = src;
    WholeParameter& last = skipped.back();
    if (no_state) {
      last.has_state = false;
      last.step = 0;
      last.buffers.clear();
    } else {
      last.step = kSteps - 1;
    }
    const std::string out = TestDir(no_state ? "skipped_none" : "skipped_fewer");
    ASSERT_TRUE(WriteWholeParameters(out, skipped, "adamw", {"exp_avg", "exp_avg_sq"}, {}).ok());
    absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(testing::Tiny());
      FsdpOptions o;
      o.policy = WrapPolicy::None();  // one flat parameter holds every parameter
      std::unique_ptr<FullyShardedModel> fsdp = FullyShard(gpt, pg, o);
      std::unique_ptr<optim::Optimizer> opt = AdamW();
      absl::StatusOr<std::map<std::string, std::string>> extra = LoadSharded(out, *fsdp, *opt, pg);
      ASSERT_FALSE(extra.ok());
      const std::string msg(extra.status().message());
      EXPECT_THAT(msg, HasSubstr("'" + last.name + "'"));
      EXPECT_THAT(msg, HasSubstr("'" + src.front().name + "'"));
      EXPECT_THAT(msg, HasSubstr(no_state ? "has none" : "were stepped a different number"));
      EXPECT_THAT(msg, HasSubstr(no_state ? "no backward reached" : "did not reach"));
      EXPECT_THAT(msg, HasSubstr("load_optimizer_state = false"));
      ShardedLoadOptions weights_only;
      weights_only.load_optimizer_state = false;
      EXPECT_TRUE(LoadSharded(out, *fsdp, *opt, pg, weights_only).ok());
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  // A whole unit never stepped (a block no backward reached), its flat
  // parameter with no state beside others with state: refused naming both
  // and the cause.
  std::vector<WholeParameter> skipped = src;
  int without = 0;
  for (WholeParameter& p : skipped) {
    if (p.name.rfind("transformer.h.1.", 0) != 0) continue;
    p.has_state = false;
    p.step = 0;
    p.buffers.clear();
    ++without;
  }
  ASSERT_GT(without, 0);
  const std::string out = TestDir("skipped_unit");
  ASSERT_TRUE(WriteWholeParameters(out, skipped, "adamw", {"exp_avg", "exp_avg_sq"}, {}).ok());
  absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(testing::Tiny());
    FsdpOptions o;
    o.policy = WrapPolicy::Transformer({"Block"});  // block 1 is a unit of its own
    std::unique_ptr<FullyShardedModel> fsdp = FullyShard(gpt, pg, o);
    std::unique_ptr<optim::Optimizer> opt = AdamW();
    absl::StatusOr<std::map<std::string, std::string>> extra = LoadSharded(out, *fsdp, *opt, pg);
    ASSERT_FALSE(extra.ok());
    const std::string msg(extra.status().message());
    EXPECT_THAT(msg, HasSubstr("optimizer state for some flat parameters only ('"));
    EXPECT_THAT(msg, HasSubstr("transformer.h.1"));
    EXPECT_THAT(msg, HasSubstr("no backward reached them under DDP or in one process"));
    EXPECT_THAT(msg, HasSubstr("load_optimizer_state = false"));
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(ShardedCheckpointOfflineTest, WriteWholeParametersRefusesBadInput) {
  WholeParameter p;
  p.name = "w";
  p.value = Tensor::Zeros({2, 3});
  const std::string dir = TestDir("whole_bad");
  WholeParameter half = p;
  half.value = p.value.To(tensor::Dtype::kBF16);
  absl::Status s = WriteWholeParameters(dir, {half}, "sgd", {"momentum_buffer"}, {});
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("parameter 'w' must be f32 on the CPU; got bf16"));
  WholeParameter state = p;
  state.has_state = true;
  state.step = 1;
  s = WriteWholeParameters(dir, {state}, "sgd", {"momentum_buffer"}, {});
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'w' has 0 optimizer buffers; the optimizer has 1"));
  state.buffers = {Tensor::Zeros({3, 2})};
  s = WriteWholeParameters(dir, {state}, "sgd", {"momentum_buffer"}, {});
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("optimizer momentum_buffer of 'w' must be f32 (2,3)"));
  s = WriteWholeParameters(dir, {p, p}, "sgd", {"momentum_buffer"}, {});
  EXPECT_THAT(std::string(s.message()), HasSubstr("listed twice"));
  EXPECT_FALSE(fs::exists(dir)) << "nothing written on errors";
  // A folder holding something else is not replaced.
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "mine";
  s = WriteWholeParameters(dir, {p}, "sgd", {"momentum_buffer"}, {});
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
  fs::remove_all(dir);
  ASSERT_TRUE(WriteWholeParameters(dir, {p}, "sgd", {"momentum_buffer"}, {}).ok());
  EXPECT_EQ(ReadAll(dir).size(), 1u);
}

// A zero-element parameter (a (0, 4) table, as SaveSharded writes one: no
// slices) is written, with its state, and reads back with its shape.
TEST(ShardedCheckpointOfflineTest, WriteWholeParametersTakesZeroElementParameters) {
  WholeParameter empty;
  empty.name = "empty";
  empty.value = Tensor::Zeros({0, 4});
  empty.has_state = true;
  empty.step = 3;
  empty.buffers = {Tensor::Zeros({0, 4})};
  WholeParameter w = empty;
  w.name = "w";
  w.value = Tensor::Full({2, 3}, 1.5);
  w.buffers = {Tensor::Full({2, 3}, 0.25)};
  const std::string dir = TestDir("whole_empty");
  absl::Status s = WriteWholeParameters(dir, {empty, w}, "sgd", {"momentum_buffer"}, {});
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<WholeParameter> back = ReadAll(dir);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].name, "empty");
  EXPECT_EQ(back[0].value.shape(), tensor::Shape({0, 4}));
  EXPECT_EQ(back[0].step, 3);
  ASSERT_EQ(back[0].buffers.size(), 1u);
  EXPECT_EQ(back[0].buffers[0].shape(), tensor::Shape({0, 4}));
  EXPECT_TRUE(BitwiseEqual(back[1].value, w.value));
  ASSERT_EQ(back[1].buffers.size(), 1u);
  EXPECT_TRUE(BitwiseEqual(back[1].buffers[0], w.buffers[0]));
}

// ShardedCheckpointInitSources read any range of a parameter as the whole
// read holds it (ranges crossing the ranks' stored slices, bf16 outputs
// rounded from them); FSDP at world 2 initialized from them (another wrap
// policy than the save's) holds the saved values; a shard corrupted after
// opening fails the read, naming the file.
TEST(ShardedCheckpointOfflineTest, InitSourcesReadRangesOfTheSavedValues) {
  const std::string dir = TestDir("sources");
  const NamedTensors want = SaveFsdp(dir);
  absl::StatusOr<nn::NamedInitSources> sources = ShardedCheckpointInitSources(dir);
  ASSERT_TRUE(sources.ok()) << sources.status();
  const std::vector<WholeParameter> whole = ReadAll(dir);
  ASSERT_EQ(sources->size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const auto& [name, source] = (*sources)[i];
    EXPECT_EQ(name, whole[i].name);
    ASSERT_EQ(source->shape(), whole[i].value.shape()) << name;
    const Tensor flat = whole[i].value.Reshape({whole[i].value.numel()});
    const int64_t numel = flat.numel();
    for (int64_t parts : {1, 2, 3, 7}) {
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t begin = numel * p / parts, end = numel * (p + 1) / parts;
        Tensor out = Tensor::Empty({end - begin});
        source->Read(begin, out);
        EXPECT_TRUE(BitwiseEqual(out, flat.Narrow(0, begin, end - begin)))
            << name << " [" << begin << ", " << end << ")";
      }
    }
    Tensor bf16 = Tensor::Empty(source->shape(), tensor::Dtype::kBF16);
    source->Read(0, bf16);
    EXPECT_TRUE(BitwiseEqual(bf16, whole[i].value.To(tensor::Dtype::kBF16))) << name;
  }
  std::mutex mu;
  NamedTensors loaded;
  absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(testing::Tiny());
    ASSERT_TRUE(nn::InitFromSources(gpt, *sources).ok());
    FsdpOptions o;
    o.policy = WrapPolicy::None();
    std::unique_ptr<FullyShardedModel> fsdp = FullyShard(gpt, pg, o);
    NamedTensors mine = fsdp->FullStateDict();
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      loaded = std::move(mine);
    }
  });
  ASSERT_TRUE(s.ok()) << s;
  std::map<std::string, Tensor> by_name(loaded.begin(), loaded.end());
  ASSERT_EQ(by_name.size(), want.size());
  for (const auto& [name, value] : want) {
    EXPECT_TRUE(BitwiseEqual(by_name.at(name), value)) << name;
  }
  {  // a byte of the first stored parameter value (not optimizer state) of rank 1's file
    const std::string shard = dir + "/shard_1_of_2.safetensors";
    absl::StatusOr<tensor::SafetensorsHeader> header = tensor::ReadSafetensorsHeader(shard);
    ASSERT_TRUE(header.ok()) << header.status();
    int64_t at = -1;
    for (const tensor::SafetensorsEntry& e : header->entries) {
      if (e.name.find("exp_avg") == std::string::npos && e.end > e.begin) {
        at = header->data_start + e.begin;
        break;
      }
    }
    ASSERT_GE(at, 0);
    FlipByte(shard, at, std::ios::beg);
  }
  absl::StatusOr<nn::NamedInitSources> fresh = ShardedCheckpointInitSources(dir);
  ASSERT_TRUE(fresh.ok()) << "opening reads the index and the headers, not the data";
  bool failed = false;
  for (const auto& [name, source] : *fresh) {
    Tensor out = Tensor::Empty(source->shape());
    try {
      source->Read(0, out);
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), HasSubstr("shard_1_of_2.safetensors' is corrupted"));
      failed = true;
    }
  }
  EXPECT_TRUE(failed);
  EXPECT_FALSE(ShardedCheckpointInitSources(dir + "/nope").ok());
  fs::remove(dir + "/shard_1_of_2.safetensors");  // named when opened, before any read
  absl::StatusOr<nn::NamedInitSources> missing = ShardedCheckpointInitSources(dir);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("shard_1_of_2.safetensors' is missing"));
}

// Reads check every checksum block they touch, whether the block lies inside
// the range (read straight into the output) or is cut by it (read through a
// one-block buffer): with 5-element blocks and one flipped byte in element 7
// of a stored slice (block 1), every range that touches elements 5-9 fails
// and every other range reads the saved values.
TEST(ShardedCheckpointOfflineTest, RangeReadsCheckEveryBlockTheyTouch) {
  const std::string dir = TestDir("blocks");
  internal::SetCrcBlockElementsForTesting(5);
  SaveFsdp(dir);
  internal::SetCrcBlockElementsForTesting(0);
  const std::vector<WholeParameter> whole = ReadAll(dir);
  // The first stored value slice of rank 1's file with at least 20 elements.
  const std::string shard = dir + "/shard_1_of_2.safetensors";
  absl::StatusOr<tensor::SafetensorsHeader> header = tensor::ReadSafetensorsHeader(shard);
  ASSERT_TRUE(header.ok()) << header.status();
  std::string param;
  int64_t slice_begin = -1;
  for (const tensor::SafetensorsEntry& e : header->entries) {
    const size_t at = e.name.rfind('@');
    if (e.name.rfind("model/", 0) != 0 || (e.end - e.begin) / 4 < 20) continue;
    param = e.name.substr(6, at - 6);
    slice_begin = std::stoll(e.name.substr(at + 1));
    FlipByte(shard, header->data_start + e.begin + 7 * 4 + 1, std::ios::beg);
    break;
  }
  ASSERT_GE(slice_begin, 0);
  absl::StatusOr<nn::NamedInitSources> sources = ShardedCheckpointInitSources(dir);
  ASSERT_TRUE(sources.ok()) << sources.status();
  std::shared_ptr<const nn::InitSource> source;
  Tensor saved;
  for (size_t i = 0; i < whole.size(); ++i) {
    if ((*sources)[i].first != param) continue;
    source = (*sources)[i].second;
    saved = whole[i].value;  // ReadAll read before the flip
  }
  ASSERT_NE(source, nullptr) << param;
  const Tensor flat = saved.Reshape({saved.numel()});
  // [lo, hi) within the slice; whether it touches block 1 (elements 5-9).
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 5},  {2, 4}, {10, 20}, {11, 13}, {10, 15},  // clear of block 1
      {5, 10}, {6, 8}, {3, 6},   {9, 12},  {0, 20},  {4, 11}};
  for (const auto& [lo, hi] : ranges) {
    const bool touches = lo < 10 && hi > 5;
    Tensor out = Tensor::Empty({hi - lo});
    try {
      source->Read(slice_begin + lo, out);
      EXPECT_FALSE(touches) << "[" << lo << ", " << hi << ") read the flipped byte unchecked";
      EXPECT_TRUE(BitwiseEqual(out, flat.Narrow(0, slice_begin + lo, hi - lo)))
          << "[" << lo << ", " << hi << ")";
    } catch (const std::exception& e) {
      EXPECT_TRUE(touches) << "[" << lo << ", " << hi << "): " << e.what();
      EXPECT_THAT(e.what(), HasSubstr("elements [5, 10) have checksum"));
    }
  }
}

TEST(ShardedCheckpointOfflineTest, CorruptedOrMissingShardFilesAreNamed) {
  const std::string dir = TestDir("errors");
  SaveFsdp(dir);
  auto walk = [&] {
    return ForEachWholeParameter(dir, true, [](const WholeParameter&) { return absl::OkStatus(); });
  };
  ASSERT_TRUE(walk().ok());
  const std::string shard = dir + "/shard_1_of_2.safetensors";
  FlipByte(shard, -9, std::ios::end);  // a byte inside the last tensor's data
  absl::Status s = walk();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard_1_of_2.safetensors' is corrupted"));
  fs::remove(shard);
  s = walk();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard_1_of_2.safetensors' is missing"));
  s = ForEachWholeParameter(dir + "/nope", true,
                            [](const WholeParameter&) { return absl::OkStatus(); });
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace dist
