// The sharded checkpoint tests' tiny model, training stretches and
// comparisons (sharded_checkpoint_testing.h).
#include "dist/sharded_checkpoint_testing.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/testing.h"

namespace dist {
namespace checkpoint_testing {

namespace fs = std::filesystem;
using tensor::Tensor;
using testing::RandomIds;  // dist/fsdp_testing.h
using testing::RankMean;   // dist/fsdp_testing.h

mingpt::GptConfig Tiny(int n_layer, int64_t vocab) {
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

Tensor StepIdx(const mingpt::GptConfig& c, int step) {
  return RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 100 + 2 * step);
}
Tensor StepTgt(const mingpt::GptConfig& c, int step) {
  return RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 101 + 2 * step);
}

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

WrapPolicy Blocks() { return WrapPolicy::Transformer({"Block"}); }

RankModel::RankModel(const Segment& seg, ProcessGroup& pg, uint64_t seed) {
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

double RankModel::TrainStep(const Segment& seg, ProcessGroup& pg, int step) {
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

absl::StatusOr<std::map<std::string, std::string>> RankModel::Load(const std::string& dir,
                                                                   ProcessGroup& pg,
                                                                   ShardedLoadOptions options) {
  return fsdp ? LoadSharded(dir, *fsdp, *fsdp_opt, pg, options) : LoadSharded(dir, *zero, pg, options);
}
absl::Status RankModel::Save(const std::string& dir, ProcessGroup& pg,
                             const std::map<std::string, std::string>& extra) {
  return fsdp ? SaveSharded(dir, *fsdp, *fsdp_opt, pg, extra) : SaveSharded(dir, *zero, pg, extra);
}

NamedTensors RankModel::FullParams(ProcessGroup& pg) {
  if (fsdp) return fsdp->FullStateDict();
  NamedTensors out;
  if (pg.rank() == 0) {
    for (auto& [n, p] : gpt->NamedParameters()) out.emplace_back(n, p->value.Clone());
  }
  return out;
}

NamedTensors RankModel::Snapshot() {
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

}  // namespace checkpoint_testing
}  // namespace dist
