// DDP and ZeRO-1 over the threads engine against one process training the
// global batch: losses, parameters, bucket overlap, no_sync accumulation and
// the optimizer-state bytes in each rank's ledger.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "tensor/memory_ledger.h"

namespace dist {
namespace {

using tensor::Tensor;

// Every comparison with the single-process reference: absolute, on losses,
// parameters and gradients.
constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 7;
constexpr int64_t kGlobalRows = 12;  // divisible by 1, 2, 3, 4
constexpr int64_t kT = 6;
constexpr int kSteps = 5;

mingpt::GptConfig Tiny() {
  mingpt::GptConfig c;
  c.name = "tiny";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = 11;
  c.block_size = 6;
  c.dropout = 0.0f;
  return c;
}

struct Batch {
  std::vector<int64_t> idx, targets;  // (kGlobalRows, kT)
};

Batch RandomBatch(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> tok(0, 10);
  Batch b;
  for (int64_t i = 0; i < kGlobalRows * kT; ++i) {
    b.idx.push_back(tok(gen));
    b.targets.push_back(tok(gen));
  }
  return b;
}

// Rows [r B, (r+1) B) of the global batch, B = kGlobalRows / n (as LmLoader).
Tensor Rows(const std::vector<int64_t>& v, int r, int n) {
  const int64_t B = kGlobalRows / n;
  std::vector<int64_t> out(v.begin() + r * B * kT, v.begin() + (r + 1) * B * kT);
  return Tensor::FromData<int64_t>(out, {B, kT});
}

std::vector<float> FlatParams(nn::Module& m) {
  std::vector<float> out;
  for (auto& [name, p] : m.NamedParameters()) {
    auto v = p->value.ToVector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> FlatGrads(nn::Module& m) {
  std::vector<float> out;
  for (auto& [name, p] : m.NamedParameters()) {
    auto v = p->grad.ToVector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

enum class Opt { kSgd, kAdamW };

std::unique_ptr<optim::Optimizer> MakeOptimizer(Opt opt) {
  if (opt == Opt::kSgd) {
    optim::SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    return optim::SGD::Create(o).value();
  }
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return optim::AdamW::Create(o).value();
}

struct Trajectory {
  std::vector<double> losses;
  std::vector<float> params;
};

// One process, the whole global batch.
Trajectory Reference(Opt opt, const Batch& batch) {
  mingpt::GPT model(Tiny());
  model.Materialize(kSeed);
  auto optimizer = MakeOptimizer(opt);
  Trajectory t;
  for (int s = 0; s < kSteps; ++s) {
    t.losses.push_back(model.ForwardBackward(Rows(batch.idx, 0, 1), Rows(batch.targets, 0, 1)));
    optimizer->Step(optim::FromModule(model));
    model.ZeroGrad();
  }
  t.params = FlatParams(model);
  return t;
}

// Ranks other than 0 start from other weights: the broadcast must fix that.
uint64_t RankSeed(int rank) { return rank == 0 ? kSeed : 1000 + rank; }

double GlobalLoss(ProcessGroup& pg, double local) {
  Tensor t = Tensor::FromVector({static_cast<float>(local)}, {1});
  EXPECT_TRUE(pg.AllReduceSync(t, ReduceOp::kAvg).ok());
  return t.Item();
}

enum class Mode { kDdp, kZero1 };

struct RankResult {
  Trajectory t;
  int64_t optimizer_state_bytes = 0;
  int64_t shard_numel = 0;
  int num_buckets = 0;
};

std::vector<RankResult> Train(Mode mode, Opt opt, int n, const Batch& batch,
                              double bucket_cap_mb = 0.002) {
  std::vector<RankResult> results(n);
  absl::Status s = RunRanks(n, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT model(Tiny());
    model.Materialize(RankSeed(rank));
    const Tensor idx = Rows(batch.idx, rank, n), targets = Rows(batch.targets, rank, n);
    RankResult& r = results[rank];
    if (mode == Mode::kDdp) {
      DistributedDataParallel ddp(model, pg, DdpOptions{bucket_cap_mb});
      r.num_buckets = ddp.num_buckets();
      auto optimizer = MakeOptimizer(opt);
      for (int step = 0; step < kSteps; ++step) {
        r.t.losses.push_back(GlobalLoss(pg, model.ForwardBackward(idx, targets)));
        ASSERT_TRUE(ddp.FinishBackward().ok());
        optimizer->Step(optim::FromModule(model));
        ddp.ZeroGrad();
      }
      r.optimizer_state_bytes = optimizer->StateBytes();
      EXPECT_EQ(tensor::MemoryLedger::Current()
                    .Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kOptimizerState)
                    .current,
                r.optimizer_state_bytes);
    } else {
      Zero1 zero(model, pg, MakeOptimizer(opt));
      r.shard_numel = zero.shard_numel();
      for (int step = 0; step < kSteps; ++step) {
        r.t.losses.push_back(GlobalLoss(pg, model.ForwardBackward(idx, targets)));
        ASSERT_TRUE(zero.Step().ok());
        zero.ZeroGrad();
      }
      r.optimizer_state_bytes = tensor::MemoryLedger::Current()
                                    .Stats(tensor::Device::Cpu(),
                                           tensor::MemoryCategory::kOptimizerState)
                                    .current;
      EXPECT_EQ(r.optimizer_state_bytes, zero.optimizer().StateBytes());
    }
    r.t.params = FlatParams(model);
  });
  EXPECT_TRUE(s.ok()) << s;
  return results;
}

void ExpectMatchesReference(const std::vector<RankResult>& results, const Trajectory& ref) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const Trajectory& t = results[rank].t;
    ASSERT_EQ(t.losses.size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      EXPECT_NEAR(t.losses[i], ref.losses[i], kTol) << "rank " << rank << " step " << i;
    }
    EXPECT_LE(MaxAbsDiff(t.params, ref.params), kTol) << "rank " << rank;
  }
}

class WorldSizeTest : public ::testing::TestWithParam<int> {};

TEST_P(WorldSizeTest, DdpSgdMatchesOneProcess) {
  const Batch batch = RandomBatch(1);
  const Trajectory ref = Reference(Opt::kSgd, batch);
  // The losses must move, or matching them proves little.
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.01);
  auto results = Train(Mode::kDdp, Opt::kSgd, GetParam(), batch);
  EXPECT_GT(results[0].num_buckets, 2);
  ExpectMatchesReference(results, ref);
  // One bucket for everything (the 25 MiB default) gives the same.
  ExpectMatchesReference(Train(Mode::kDdp, Opt::kSgd, GetParam(), batch, 25), ref);
}

TEST_P(WorldSizeTest, DdpAdamWMatchesOneProcess) {
  const Batch batch = RandomBatch(2);
  ExpectMatchesReference(Train(Mode::kDdp, Opt::kAdamW, GetParam(), batch),
                         Reference(Opt::kAdamW, batch));
}

TEST_P(WorldSizeTest, Zero1SgdMatchesOneProcess) {
  const Batch batch = RandomBatch(3);
  ExpectMatchesReference(Train(Mode::kZero1, Opt::kSgd, GetParam(), batch),
                         Reference(Opt::kSgd, batch));
}

TEST_P(WorldSizeTest, Zero1AdamWMatchesOneProcessWithOneNthOfTheState) {
  const int n = GetParam();
  const Batch batch = RandomBatch(4);
  const Trajectory ref = Reference(Opt::kAdamW, batch);
  auto zero = Train(Mode::kZero1, Opt::kAdamW, n, batch);
  ExpectMatchesReference(zero, ref);
  auto ddp = Train(Mode::kDdp, Opt::kAdamW, n, batch);
  const int64_t psi = mingpt::GPT(Tiny()).NumParameters();
  const int64_t k = (psi + n - 1) / n;
  for (int rank = 0; rank < n; ++rank) {
    // AdamW: K = 2 fp32 buffers (exp_avg, exp_avg_sq) per element.
    EXPECT_EQ(ddp[rank].optimizer_state_bytes, 2 * 4 * psi) << "rank " << rank;
    EXPECT_EQ(zero[rank].shard_numel, k);
    EXPECT_EQ(zero[rank].optimizer_state_bytes, 2 * 4 * k) << "rank " << rank;
    const double ratio =
        static_cast<double>(zero[rank].optimizer_state_bytes) / ddp[rank].optimizer_state_bytes;
    EXPECT_NEAR(ratio, 1.0 / n, 1e-3) << "rank " << rank;
  }
  std::printf("N=%d Psi=%lld k=%lld optimizer state per rank: ddp %lld B, zero1 %lld B\n", n,
              static_cast<long long>(psi), static_cast<long long>(k),
              static_cast<long long>(ddp[0].optimizer_state_bytes),
              static_cast<long long>(zero[0].optimizer_state_bytes));
}

INSTANTIATE_TEST_SUITE_P(Sizes, WorldSizeTest, ::testing::Values(1, 2, 3, 4));

TEST(DdpTest, BroadcastMakesRanksStartEqual) {
  std::vector<std::vector<float>> params(3);
  ASSERT_TRUE(RunRanks(3, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(RankSeed(rank));
                DistributedDataParallel ddp(model, pg);
                params[rank] = FlatParams(model);
              }).ok());
  mingpt::GPT ref(Tiny());
  ref.Materialize(kSeed);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(params[r], FlatParams(ref)) << r;
}

TEST(DdpTest, BucketsAreReverseOrderAndIssuedBeforeBackwardEnds) {
  const Batch batch = RandomBatch(5);
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                DistributedDataParallel ddp(model, pg, DdpOptions{0.002});
                ASSERT_GT(ddp.num_buckets(), 2);
                auto names = model.NamedParameters();
                // Bucket 0 starts with the last registered parameter (lm_head),
                // the last bucket ends with the first (wte).
                EXPECT_EQ(ddp.BucketParameterNames(0).front(), names.back().first);
                EXPECT_EQ(ddp.BucketParameterNames(ddp.num_buckets() - 1).back(),
                          names.front().first);
                for (int step = 0; step < 2; ++step) {
                  model.ForwardBackward(Rows(batch.idx, rank, 2), Rows(batch.targets, rank, 2));
                  using Kind = DistributedDataParallel::Event::Kind;
                  const auto& ev = ddp.last_backward_events();
                  int root_at = -1, first_issue_at = -1, issued_before_root = 0;
                  for (int i = 0; i < static_cast<int>(ev.size()); ++i) {
                    if (ev[i].kind == Kind::kRootPostBackward) root_at = i;
                    if (ev[i].kind == Kind::kBucketIssued) {
                      if (first_issue_at < 0) first_issue_at = i;
                      if (root_at < 0) ++issued_before_root;
                    }
                  }
                  ASSERT_GE(root_at, 0);
                  EXPECT_EQ(ev.back().kind, Kind::kAllReducesDone);
                  EXPECT_EQ(ev[first_issue_at].bucket, 0);
                  // Every bucket went out while backward was still running.
                  EXPECT_LT(first_issue_at, root_at);
                  EXPECT_EQ(issued_before_root, ddp.num_buckets());
                  ddp.ZeroGrad();
                }
              }).ok());
}

// Reference gradients: one process, `first` then `second` accumulated.
std::vector<float> ReferenceGrads(const std::vector<std::pair<Tensor, Tensor>>& batches) {
  mingpt::GPT model(Tiny());
  model.Materialize(kSeed);
  for (auto& [i, t] : batches) model.ForwardBackward(i, t);
  return FlatGrads(model);
}

TEST(DdpTest, NoSyncAccumulatesLocallyThenAveragesTheSum) {
  const int n = 3;
  const Batch a = RandomBatch(6), b = RandomBatch(7);
  std::vector<std::vector<float>> after_no_sync(n), after_sync(n);
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(RankSeed(rank));
                DistributedDataParallel ddp(model, pg, DdpOptions{0.002});
                {
                  auto guard = ddp.no_sync();
                  EXPECT_FALSE(ddp.require_sync());
                  model.ForwardBackward(Rows(a.idx, rank, n), Rows(a.targets, rank, n));
                  EXPECT_TRUE(ddp.last_backward_events().empty());
                }
                EXPECT_TRUE(ddp.require_sync());
                after_no_sync[rank] = FlatGrads(model);
                model.ForwardBackward(Rows(b.idx, rank, n), Rows(b.targets, rank, n));
                after_sync[rank] = FlatGrads(model);
              }).ok());
  const std::vector<float> global = ReferenceGrads(
      {{Rows(a.idx, 0, 1), Rows(a.targets, 0, 1)}, {Rows(b.idx, 0, 1), Rows(b.targets, 0, 1)}});
  for (int r = 0; r < n; ++r) {
    // No communication: each rank holds the gradient of its own rows only.
    const std::vector<float> local = ReferenceGrads({{Rows(a.idx, r, n), Rows(a.targets, r, n)}});
    EXPECT_LE(MaxAbsDiff(after_no_sync[r], local), kTol) << r;
    EXPECT_GT(MaxAbsDiff(after_no_sync[r], global), 1e-3) << r;
    // The synced step averages the accumulated sums.
    EXPECT_LE(MaxAbsDiff(after_sync[r], global), kTol) << r;
  }
}

TEST(Zero1Test, NoSyncAccumulatesThenReduceScattersTheSum) {
  const int n = 2;
  const Batch a = RandomBatch(8), b = RandomBatch(9);
  std::vector<std::vector<float>> shards(n);
  std::vector<int64_t> begins(n);
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(RankSeed(rank));
                Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd));
                {
                  auto guard = zero.no_sync();
                  model.ForwardBackward(Rows(a.idx, rank, n), Rows(a.targets, rank, n));
                  // Nothing was reduced: a step now is refused.
                  EXPECT_EQ(zero.Step().code(), absl::StatusCode::kFailedPrecondition);
                }
                model.ForwardBackward(Rows(b.idx, rank, n), Rows(b.targets, rank, n));
                ASSERT_TRUE(zero.FinishBackward().ok());
                shards[rank] = zero.grad_shard().ToVector<float>();
                begins[rank] = zero.shard_begin();
              }).ok());
  std::vector<float> global = ReferenceGrads(
      {{Rows(a.idx, 0, 1), Rows(a.targets, 0, 1)}, {Rows(b.idx, 0, 1), Rows(b.targets, 0, 1)}});
  global.resize(shards[0].size() * n, 0.0f);  // the padding
  for (int r = 0; r < n; ++r) {
    std::vector<float> want(global.begin() + begins[r],
                            global.begin() + begins[r] + shards[r].size());
    EXPECT_LE(MaxAbsDiff(shards[r], want), kTol) << r;
  }
}

TEST(Zero1Test, ShardDecayRangesFollowWeightDecayFlags) {
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                Zero1 zero(model, pg, MakeOptimizer(Opt::kAdamW));
                int64_t offset = 0, decayed = 0;
                for (auto& [name, p] : model.NamedParameters()) {
                  if (p->weight_decay) decayed += p->numel();
                  offset += p->numel();
                }
                EXPECT_EQ(zero.numel(), offset);
                EXPECT_EQ(zero.padded_numel() % 2, 0);
                int64_t total = 0;
                for (auto& [b, e] : zero.decay_ranges()) total += e - b;
                EXPECT_EQ(total, decayed);
                for (auto& [b, e] : zero.shard_decay_ranges()) {
                  EXPECT_GE(b, 0);
                  EXPECT_LE(e, zero.shard_numel());
                }
              }).ok());
}

}  // namespace
}  // namespace dist
