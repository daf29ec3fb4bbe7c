// DDP and ZeRO-1 over the threads engine against one process training the
// global batch: losses, parameters, bucket overlap, no_sync accumulation, the
// optimizer-state bytes in each rank's ledger, and under bf16 mixed precision
// the dtypes held, the bf16 gradient reduction and the model-state bytes
// (the bf16 training parity tests are in mixed_precision_parity_test.cc).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/error.h"
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

using testing::Tiny;  // dist/fsdp_testing.h

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
  std::vector<int64_t> bucket_numels;  // ZeRO-1: each bucket's parameter elements
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
      Zero1Options o;
      o.bucket_cap_mb = bucket_cap_mb;
      Zero1 zero(model, pg, MakeOptimizer(opt), o);
      r.shard_numel = zero.shard_numel();
      r.num_buckets = zero.num_buckets();
      for (int b = 0; b < zero.num_buckets(); ++b) r.bucket_numels.push_back(zero.segment(b).numel);
      for (int step = 0; step < kSteps; ++step) {
        r.t.losses.push_back(GlobalLoss(pg, model.ForwardBackward(idx, targets)));
        ASSERT_TRUE(zero.Step().ok());
        zero.ZeroGrad();
      }
      r.optimizer_state_bytes =
          tensor::MemoryLedger::Current()
              .Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kOptimizerState)
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
  const Trajectory ref = Reference(Opt::kSgd, batch);
  auto results = Train(Mode::kZero1, Opt::kSgd, GetParam(), batch);
  EXPECT_GT(results[0].num_buckets, 2);
  ExpectMatchesReference(results, ref);
  // One bucket for everything (the 25 MiB default) gives the same.
  results = Train(Mode::kZero1, Opt::kSgd, GetParam(), batch, 25);
  EXPECT_EQ(results[0].num_buckets, 1);
  ExpectMatchesReference(results, ref);
}

TEST_P(WorldSizeTest, Zero1AdamWMatchesOneProcessWithOneNthOfTheState) {
  const int n = GetParam();
  const Batch batch = RandomBatch(4);
  const Trajectory ref = Reference(Opt::kAdamW, batch);
  // Many buckets: each is padded to a multiple of n on its own.
  auto buckets = Train(Mode::kZero1, Opt::kAdamW, n, batch);
  ExpectMatchesReference(buckets, ref);
  const int64_t psi = mingpt::GPT(Tiny()).NumParameters();
  int64_t sum = 0, k_buckets = 0;
  for (int64_t m : buckets[0].bucket_numels) {
    sum += m;
    k_buckets += (m + n - 1) / n;
  }
  EXPECT_EQ(sum, psi);
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(buckets[rank].shard_numel, k_buckets) << "rank " << rank;
    EXPECT_EQ(buckets[rank].optimizer_state_bytes, 2 * 4 * k_buckets) << "rank " << rank;
  }
  // One bucket: k = ceil(Psi / n).
  auto zero = Train(Mode::kZero1, Opt::kAdamW, n, batch, 25);
  ExpectMatchesReference(zero, ref);
  auto ddp = Train(Mode::kDdp, Opt::kAdamW, n, batch);
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
                  EXPECT_EQ(ev.back().kind, Kind::kReductionsDone);
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

// This rank's reduced gradient slices, each element with its position in the
// model's gradients flattened in registration order without padding (-1 for
// padding). The segments follow registration order, so a segment's first
// element is preceded by the elements of the segments before it.
std::vector<std::pair<int64_t, float>> ReducedSlices(const Zero1& zero) {
  std::vector<std::pair<int64_t, float>> out;
  for (int b = 0; b < zero.num_buckets(); ++b) {
    const Zero1::Segment seg = zero.segment(b);
    int64_t unpadded = 0;
    for (int c = 0; c < zero.num_buckets(); ++c) {
      if (zero.segment(c).begin < seg.begin) unpadded += zero.segment(c).numel;
    }
    const std::vector<float> g = zero.grad_shard(b).ToVector<float>();
    for (int64_t j = 0; j < static_cast<int64_t>(g.size()); ++j) {
      const int64_t in_segment = seg.shard_begin - seg.begin + j;
      out.emplace_back(in_segment < seg.numel ? unpadded + in_segment : -1, g[j]);
    }
  }
  return out;
}

// Every slice element equals `want` at its position within `tol`; padding is zero.
void ExpectSlicesEqual(const std::vector<std::pair<int64_t, float>>& slices,
                       const std::vector<float>& want, double tol, int rank) {
  int64_t checked = 0;
  for (auto& [pos, v] : slices) {
    if (pos < 0) {
      EXPECT_EQ(v, 0.0f) << "rank " << rank << ": padding";
      continue;
    }
    ASSERT_LT(pos, static_cast<int64_t>(want.size()));
    EXPECT_NEAR(v, want[pos], tol) << "rank " << rank << " @" << pos;
    ++checked;
  }
  EXPECT_GT(checked, 0) << "rank " << rank;
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
  std::vector<std::vector<std::pair<int64_t, float>>> shards(n);
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(RankSeed(rank));
                Zero1Options o;
                o.bucket_cap_mb = 0.002;
                Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd), o);
                {
                  auto guard = zero.no_sync();
                  model.ForwardBackward(Rows(a.idx, rank, n), Rows(a.targets, rank, n));
                  // Nothing was reduced: a step now is refused.
                  EXPECT_EQ(zero.Step().code(), absl::StatusCode::kFailedPrecondition);
                }
                model.ForwardBackward(Rows(b.idx, rank, n), Rows(b.targets, rank, n));
                ASSERT_TRUE(zero.FinishBackward().ok());
                shards[rank] = ReducedSlices(zero);
              }).ok());
  const std::vector<float> global = ReferenceGrads(
      {{Rows(a.idx, 0, 1), Rows(a.targets, 0, 1)}, {Rows(b.idx, 0, 1), Rows(b.targets, 0, 1)}});
  for (int r = 0; r < n; ++r) ExpectSlicesEqual(shards[r], global, kTol, r);
}

TEST(Zero1Test, BucketsAreReverseOrderAndReduceScatterBeforeBackwardEnds) {
  const Batch batch = RandomBatch(5);
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                Zero1Options o;
                o.bucket_cap_mb = 0.002;
                Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd), o);
                ASSERT_GT(zero.num_buckets(), 2);
                auto names = model.NamedParameters();
                // Bucket 0 ends with the last registered parameter (lm_head),
                // the last bucket starts with the first (wte); the segments
                // follow registration order: the last bucket's first.
                EXPECT_EQ(zero.BucketParameters(0).back().first, names.back().first);
                EXPECT_EQ(zero.BucketParameters(zero.num_buckets() - 1).front().first,
                          names.front().first);
                EXPECT_EQ(zero.segment(zero.num_buckets() - 1).begin, 0);
                for (int b = 0; b + 1 < zero.num_buckets(); ++b) {
                  const Zero1::Segment seg = zero.segment(b + 1);
                  EXPECT_EQ(seg.begin + seg.padded, zero.segment(b).begin) << b;
                  EXPECT_EQ(seg.padded % 2, 0);
                  EXPECT_EQ(seg.shard_begin, seg.begin + rank * seg.shard_numel);
                }
                for (int step = 0; step < 2; ++step) {
                  model.ForwardBackward(Rows(batch.idx, rank, 2), Rows(batch.targets, rank, 2));
                  using Kind = BackwardEvent::Kind;
                  const auto& ev = zero.last_backward_events();
                  int root_at = -1, issued_before_root = 0, expect_bucket = 0;
                  for (int i = 0; i < static_cast<int>(ev.size()); ++i) {
                    if (ev[i].kind == Kind::kRootPostBackward) root_at = i;
                    if (ev[i].kind == Kind::kBucketIssued) {
                      EXPECT_EQ(ev[i].bucket, expect_bucket++);  // in bucket order
                      if (root_at < 0) ++issued_before_root;
                    }
                  }
                  ASSERT_GE(root_at, 0);
                  // Every bucket went out while backward was still running;
                  // Step waits for them.
                  EXPECT_EQ(issued_before_root, zero.num_buckets());
                  EXPECT_EQ(ev.back().kind, Kind::kRootPostBackward);
                  ASSERT_TRUE(zero.Step().ok());
                  EXPECT_EQ(zero.last_backward_events().back().kind, Kind::kReductionsDone);
                  zero.ZeroGrad();
                }
              }).ok());
}

TEST(Zero1Test, ShardDecayRangesFollowWeightDecayFlags) {
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                Zero1Options o;
                o.bucket_cap_mb = 0.002;
                Zero1 zero(model, pg, MakeOptimizer(Opt::kAdamW), o);
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
                // Each slice's ranges are the flat ranges within it, relative to it.
                int64_t in_slices = 0, in_slices_want = 0;
                for (int i = 0; i < zero.num_buckets(); ++i) {
                  const Zero1::Segment seg = zero.segment(i);
                  for (auto& [b, e] : zero.shard_decay_ranges(i)) {
                    EXPECT_GE(b, 0);
                    EXPECT_LE(e, seg.shard_numel);
                    in_slices += e - b;
                  }
                  for (auto& [b, e] : zero.decay_ranges()) {
                    in_slices_want +=
                        std::max<int64_t>(0, std::min(e, seg.shard_begin + seg.shard_numel) -
                                                 std::max(b, seg.shard_begin));
                  }
                }
                EXPECT_EQ(in_slices, in_slices_want);
                EXPECT_GT(in_slices, 0);
              }).ok());
}

// ---- A module run twice in forward (T5's shared embedding) ----

// y = shared(mid(shared(x))); `shared` is registered first, so its parameters
// sit in the last bucket, which every other bucket precedes: after shared's
// first backward (its second use) and mid's, the old readiness rule issued
// that bucket before shared's second backward had accumulated into it.
class SharedTwice : public nn::Module {
 public:
  explicit SharedTwice(int64_t d) : nn::Module("SharedTwice") {
    nn::LinearOptions o;
    o.weight_init = nn::InitSpec::Normal(0.0f, 0.3f);
    o.bias_init = nn::InitSpec::Normal(0.0f, 0.1f);
    shared_ = RegisterModule("shared", std::make_unique<nn::Linear>(d, d, o));
    mid_ = RegisterModule("mid", std::make_unique<nn::Linear>(d, d, o));
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    nn::Tensors h = shared_->Run(in, ctx.Child(0));
    h = mid_->Run(h, ctx.Child(1));
    return shared_->Run(h, ctx.Child(2));
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    nn::Tensors g = shared_->RunBackward(grad, ctx.Child(2));
    g = mid_->RunBackward(g, ctx.Child(1));
    return shared_->RunBackward(g, ctx.Child(0));
  }

 private:
  nn::Linear* shared_;
  nn::Linear* mid_;
};

// Gradients of 0.5 * sum(y^2) / rows for x (rows, d), rows = x's rows.
std::vector<float> SharedTwiceGrads(SharedTwice& m, const Tensor& x, int64_t rows) {
  nn::Context ctx;
  Tensor y = m.Run(x, ctx);
  std::vector<float> g = y.ToVector<float>();
  for (float& v : g) v /= static_cast<float>(rows);
  m.RunBackward(Tensor::FromVector(g, y.shape()), ctx);
  return FlatGrads(m);
}

// The inputs, the one-process gradients and the tolerances for SharedTwice
// reduced over n ranks of kRows / n rows each.
struct SharedTwiceCase {
  static constexpr int64_t kD = 16, kRows = 8;
  int n = 2;
  Tensor x;                 // (kRows, kD)
  std::vector<float> want;  // one process, every row
  // A bf16 reduction rounds each rank's gradient (and the sum) to 8
  // significant bits, so where the ranks' local gradients cancel the error is
  // relative to the largest local gradient, not to the mean. An early issue
  // (a bucket reduced before the shared module's second backward) loses a
  // whole contribution: errors of the order of that largest local gradient.
  double bf16_tol = 0;

  Tensor RankRows(int rank) const {
    const int64_t B = kRows / n;
    return x.Narrow(0, rank * B, B).Contiguous();
  }
  double Tol(tensor::Dtype reduce) const { return reduce == tensor::Dtype::kF32 ? 1e-6 : bf16_tol; }
};

SharedTwiceCase MakeSharedTwiceCase(int n) {
  SharedTwiceCase c;
  c.n = n;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  std::vector<float> xs(c.kRows * c.kD);
  for (float& v : xs) v = normal(gen);
  c.x = Tensor::FromVector(xs, {c.kRows, c.kD});
  SharedTwice ref(c.kD);
  ref.Materialize(kSeed);
  c.want = SharedTwiceGrads(ref, c.x, c.kRows);
  double local_max = 0;
  for (int r = 0; r < n; ++r) {
    SharedTwice local(c.kD);
    local.Materialize(kSeed);
    for (float g : SharedTwiceGrads(local, c.RankRows(r), c.kRows / n)) {
      local_max = std::max(local_max, static_cast<double>(std::abs(g)));
    }
  }
  c.bf16_tol = local_max / 128;
  return c;
}

TEST(DdpTest, ModuleRunTwiceIsReducedAfterItsLastBackward) {
  const SharedTwiceCase c = MakeSharedTwiceCase(2);
  for (tensor::Dtype reduce : {tensor::Dtype::kF32, tensor::Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(reduce));
    std::vector<std::vector<float>> got(c.n);
    ASSERT_TRUE(RunRanks(c.n, [&](int rank, ProcessGroup& pg) {
                  SharedTwice m(c.kD);
                  m.Materialize(kSeed);
                  DdpOptions o;
                  o.bucket_cap_mb = 0.002;  // one Linear per bucket
                  o.mixed_precision.reduce_dtype = reduce;
                  DistributedDataParallel ddp(m, pg, o);
                  ASSERT_EQ(ddp.num_buckets(), 2);
                  EXPECT_EQ(ddp.BucketParameterNames(1).back(), "shared.weight");
                  // Local means, averaged by DDP: the global mean.
                  got[rank] = SharedTwiceGrads(m, c.RankRows(rank), c.kRows / c.n);
                }).ok());
    for (int r = 0; r < c.n; ++r) {
      ASSERT_EQ(got[r].size(), c.want.size());
      for (size_t i = 0; i < c.want.size(); ++i) {
        EXPECT_NEAR(got[r][i], c.want[i], c.Tol(reduce)) << "rank " << r << " element " << i;
      }
    }
  }
}

TEST(Zero1Test, ModuleRunTwiceIsReducedAfterItsLastBackward) {
  const SharedTwiceCase c = MakeSharedTwiceCase(2);
  for (tensor::Dtype reduce : {tensor::Dtype::kF32, tensor::Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(reduce));
    std::vector<std::vector<std::pair<int64_t, float>>> got(c.n);
    ASSERT_TRUE(RunRanks(c.n, [&](int rank, ProcessGroup& pg) {
                  SharedTwice m(c.kD);
                  m.Materialize(kSeed);
                  Zero1Options o;
                  o.bucket_cap_mb = 0.002;  // one Linear per bucket
                  o.mixed_precision.reduce_dtype = reduce;
                  Zero1 zero(m, pg, MakeOptimizer(Opt::kSgd), o);
                  ASSERT_EQ(zero.num_buckets(), 2);
                  EXPECT_EQ(zero.BucketParameters(1).front().first, "shared.weight");
                  SharedTwiceGrads(m, c.RankRows(rank), c.kRows / c.n);
                  ASSERT_TRUE(zero.FinishBackward().ok());
                  got[rank] = ReducedSlices(zero);
                }).ok());
    for (int r = 0; r < c.n; ++r) ExpectSlicesEqual(got[r], c.want, c.Tol(reduce), r);
  }
}

// ---- Mixed precision ----

using precision::MixedPrecisionPolicy;
using tensor::Dtype;
using tensor::MemoryCategory;

int64_t Current(MemoryCategory c) {
  return tensor::MemoryLedger::Current().Stats(tensor::Device::Cpu(), c).current;
}

// True when every element is a bf16 value (its low 16 bits are zero).
bool AllBf16Representable(const std::vector<float>& v) {
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    if ((bits & 0xffffu) != 0) return false;
  }
  return true;
}

DdpOptions MixedDdp(const MixedPrecisionPolicy& mp) {
  DdpOptions o;
  o.bucket_cap_mb = 0.002;
  o.mixed_precision = mp;
  return o;
}

// Forward computes with bf16 copies; after backward the values are the fp32
// masters again (the same tensors), the gradients fp32, all-reduced in bf16
// (so every element is a bf16 value) at world 2 and untouched at world 1.
TEST(DdpMixedPrecisionTest, Bf16ComputeCopiesFp32MastersBf16Reduction) {
  const Batch batch = RandomBatch(21);
  for (int n : {1, 2}) {
    ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                  mingpt::GPT model(Tiny());
                  model.Materialize(kSeed);
                  std::vector<Tensor> masters;
                  for (auto& [name, p] : model.NamedParameters()) masters.push_back(p->value);
                  DistributedDataParallel ddp(model, pg, MixedDdp(MixedPrecisionPolicy::Bf16()));
                  EXPECT_EQ(ddp.reduces_in_low_precision(), n > 1);
                  const Tensor idx = Rows(batch.idx, rank, n), tgt = Rows(batch.targets, rank, n);
                  model.Loss(idx, tgt);  // a forward alone leaves the compute copies in place
                  for (auto& [name, p] : model.NamedParameters()) {
                    EXPECT_EQ(p->value.dtype(), Dtype::kBF16) << name;
                  }
                  model.ForwardBackward(idx, tgt);
                  auto params = model.NamedParameters();
                  for (size_t i = 0; i < params.size(); ++i) {
                    nn::Parameter* p = params[i].second;
                    EXPECT_TRUE(p->value.SharesStorageWith(masters[i])) << params[i].first;
                    EXPECT_EQ(p->value.dtype(), Dtype::kF32);
                    EXPECT_EQ(p->grad.dtype(), Dtype::kF32);
                  }
                  EXPECT_EQ(AllBf16Representable(FlatGrads(model)), n > 1) << "world " << n;
                  // The bucket copies are gone once backward returns.
                  EXPECT_EQ(Current(MemoryCategory::kCommunication), 0);
                }).ok());
  }
}

// The ledger after a few AdamW steps, against what the headers say is held:
// DDP (2+2+K) Psi = 16 Psi in fp32 and in bf16 (fp32 masters and gradients,
// no compute copies between steps); ZeRO-1 (4+4) Psi + 8 Psi/N in fp32 and
// 2 Psi + 4 Psi/N + 4 Psi + 8 Psi/N in bf16, Psi padded to a multiple of N.
TEST(MixedPrecisionMemoryTest, ModelStateBytesBetweenSteps) {
  const int n = 3;
  const int64_t psi = mingpt::GPT(Tiny()).NumParameters();
  const int64_t padded = (psi + n - 1) / n * n, k = padded / n;
  ASSERT_NE(padded, psi);  // the padding is exercised
  const Batch batch = RandomBatch(22);
  for (bool mixed : {false, true}) {
    const MixedPrecisionPolicy mp =
        mixed ? MixedPrecisionPolicy::Bf16() : MixedPrecisionPolicy::Fp32();
    ThreadWorld world(n);
    ASSERT_TRUE(
        RunRanks(world, [&](int rank, ProcessGroup& pg) {
          const Tensor idx = Rows(batch.idx, rank, n), tgt = Rows(batch.targets, rank, n);
          {
            mingpt::GPT model(Tiny());
            model.Materialize(kSeed);
            DistributedDataParallel ddp(model, pg, MixedDdp(mp));
            auto opt = MakeOptimizer(Opt::kAdamW);
            world.ledger(rank).ResetPeaks();
            for (int step = 0; step < 2; ++step) {
              model.ForwardBackward(idx, tgt);
              opt->Step(optim::FromModule(model));
              ddp.ZeroGrad();
            }
            EXPECT_EQ(Current(MemoryCategory::kParameters), 4 * psi);
            EXPECT_EQ(Current(MemoryCategory::kGradients), 4 * psi);
            EXPECT_EQ(Current(MemoryCategory::kOptimizerState), 8 * psi);
            // bf16 compute copies exist during the step only.
            const int64_t params_peak =
                world.ledger(rank).Stats(tensor::Device::Cpu(), MemoryCategory::kParameters).peak;
            EXPECT_EQ(params_peak, mixed ? 6 * psi : 4 * psi);
          }
          {
            mingpt::GPT model(Tiny());
            model.Materialize(kSeed);
            Zero1Options options;
            options.mixed_precision = mp;
            Zero1 zero(model, pg, MakeOptimizer(Opt::kAdamW), options);
            ASSERT_EQ(zero.num_buckets(), 1);  // the 25 MiB default
            EXPECT_EQ(zero.flat_param_dtype(), mixed ? Dtype::kBF16 : Dtype::kF32);
            EXPECT_EQ(zero.master_shard(0).dtype(), Dtype::kF32);
            EXPECT_EQ(zero.master_shard(0).numel(), k);
            for (int step = 0; step < 2; ++step) {
              model.ForwardBackward(idx, tgt);
              ASSERT_TRUE(zero.Step().ok());
              zero.ZeroGrad();
            }
            for (auto& [name, p] : model.NamedParameters()) {
              EXPECT_EQ(p->value.dtype(), mixed ? Dtype::kBF16 : Dtype::kF32) << name;
            }
            EXPECT_EQ(Current(MemoryCategory::kParameters),
                      mixed ? 2 * padded + 4 * k : 4 * padded);
            EXPECT_EQ(Current(MemoryCategory::kGradients), 4 * padded);
            EXPECT_EQ(Current(MemoryCategory::kOptimizerState), 8 * k);
            EXPECT_EQ(Current(MemoryCategory::kCommunication), 0);
          }
        }).ok());
  }
}

// Construction moves the model's tensors into the buckets' buffers one
// bucket at a time and allocates the flat gradient after them: the set-up
// holds the model twice for one bucket at most (not 2 Psi), and its peak
// stays under the model state held between steps.
TEST(MixedPrecisionMemoryTest, Zero1SetUpHoldsTheModelTwiceForOneBucketAtMost) {
  const int n = 2;
  const int64_t psi = mingpt::GPT(Tiny()).NumParameters();
  for (bool mixed : {false, true}) {
    ThreadWorld world(n);
    ASSERT_TRUE(RunRanks(world, [&](int rank, ProcessGroup& pg) {
                  mingpt::GPT model(Tiny());
                  model.Materialize(kSeed);
                  ASSERT_EQ(Current(MemoryCategory::kParameters), 4 * psi);
                  world.ledger(rank).ResetPeaks();
                  Zero1Options options;
                  options.mixed_precision =
                      mixed ? MixedPrecisionPolicy::Bf16() : MixedPrecisionPolicy::Fp32();
                  options.bucket_cap_mb = 0.002;
                  Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd), options);
                  ASSERT_GE(zero.num_buckets(), 4);
                  int64_t largest = 0;
                  for (int b = 0; b < zero.num_buckets(); ++b) {
                    largest = std::max(largest, zero.segment(b).padded);
                  }
                  ASSERT_LT(largest, psi / 3);  // the bound below is well under 2 Psi
                  const int64_t bucket_bytes = (mixed ? 2 : 4) * largest;
                  const int64_t master_bytes = mixed ? 4 * zero.shard_numel() : 0;
                  const tensor::MemoryLedger& ledger = world.ledger(rank);
                  const int64_t params_peak =
                      ledger.Stats(tensor::Device::Cpu(), MemoryCategory::kParameters).peak;
                  EXPECT_LE(params_peak, 4 * psi + master_bytes + bucket_bytes);
                  // Between steps (no optimizer state yet): the buffers and the gradient.
                  const int64_t held =
                      Current(MemoryCategory::kParameters) + Current(MemoryCategory::kGradients);
                  EXPECT_EQ(held, (mixed ? 2 + 4 : 4 + 4) * zero.padded_numel() + master_bytes);
                  EXPECT_LE(ledger.Total(tensor::Device::Cpu()).peak,
                            std::max(held, 4 * psi + master_bytes + bucket_bytes));
                }).ok());
  }
}

// Forwards every collective to the group it wraps, but its works never say
// they are completed before they are waited for: as a slow network would,
// every copy stays in flight until something waits for it. `on_issue` sees
// each collective's kind as it is issued.
class UnpolledGroup final : public ProcessGroup {
 public:
  explicit UnpolledGroup(ProcessGroup& inner,
                         std::function<void(CollectiveKind)> on_issue = nullptr)
      : ProcessGroup(inner.timeout()), inner_(inner), on_issue_(std::move(on_issue)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::string_view backend() const override { return inner_.backend(); }

 protected:
  class UnpolledWork final : public Work {
   public:
    explicit UnpolledWork(WorkPtr inner) : inner_(std::move(inner)) {}
    absl::Status Wait() override {
      waited_ = true;
      return inner_->Wait();
    }
    bool IsCompleted() const override { return waited_; }

   private:
    WorkPtr inner_;
    std::atomic<bool> waited_{false};
  };
  WorkPtr Issue(std::shared_ptr<CollectiveCall> call) override {
    if (on_issue_) on_issue_(call->kind);
    const auto options = CollectiveOptions::WithTimeout(call->timeout);
    WorkPtr work;
    switch (call->kind) {
      case CollectiveKind::kAllReduce:
        work = inner_.AllReduce(call->input, call->op, options);
        break;
      case CollectiveKind::kReduceScatter:
        work = inner_.ReduceScatter(call->input, call->output, call->op, options);
        break;
      case CollectiveKind::kAllGather:
        work = inner_.AllGather(call->input, call->output, options);
        break;
      case CollectiveKind::kBroadcast:
        work = inner_.Broadcast(call->input, call->root, options);
        break;
      case CollectiveKind::kBarrier:
        work = inner_.Barrier(options);
        break;
    }
    return std::make_shared<UnpolledWork>(std::move(work));
  }
  absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int, int, absl::Duration) override {
    return absl::UnimplementedError("UnpolledGroup does not split");
  }

 private:
  ProcessGroup& inner_;
  std::function<void(CollectiveKind)> on_issue_;
};

// Steps nothing; records which ParamRefs it was asked to update, into the
// same log as the collectives.
class RecordingOptimizer final : public optim::Optimizer {
 public:
  explicit RecordingOptimizer(std::vector<std::string>* log) : Optimizer(0.1), log_(log) {}
  const char* name() const override { return "recording"; }
  std::vector<std::string> BufferNames() const override { return {}; }

 protected:
  void Update(const optim::ParamRef& ref, optim::ParamState&) override {
    log_->push_back("step " + ref.name);
  }

 private:
  std::vector<std::string>* log_;
};

// Step() starts each bucket's all-gather right after stepping that bucket,
// so the all-gather of bucket b runs while bucket b + 1 steps: the log
// alternates step / all-gather, bucket by bucket.
TEST(Zero1Test, StepStartsEachBucketsAllGatherRightAfterItsStep) {
  const int n = 2;
  const Batch batch = RandomBatch(25);
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& world_pg) {
                std::vector<std::string> log;
                UnpolledGroup pg(world_pg, [&](CollectiveKind kind) {
                  if (kind == CollectiveKind::kAllGather) log.push_back("all_gather");
                });
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                Zero1Options options;
                options.bucket_cap_mb = 0.002;
                Zero1 zero(model, pg, std::make_unique<RecordingOptimizer>(&log), options);
                ASSERT_GE(zero.num_buckets(), 3);
                model.ForwardBackward(Rows(batch.idx, rank, n), Rows(batch.targets, rank, n));
                log.clear();
                ASSERT_TRUE(zero.Step().ok());
                std::vector<std::string> want;
                for (int b = 0; b < zero.num_buckets(); ++b) {
                  want.push_back("step zero1.bucket" + std::to_string(b));
                  want.push_back("all_gather");
                }
                EXPECT_EQ(log, want);
              }).ok());
}

// bf16 bucket copies in flight are bounded. Over a group whose collectives
// are never seen completed before they are waited for, every bucket is in
// flight at once without a bound; with max_inflight_buckets = K exactly K
// are (the communication ledger's peak is at most the K largest buckets'
// bf16 bytes), and the gradients equal the unbounded run's bit for bit, for
// DDP and ZeRO-1.
TEST(MixedPrecisionMemoryTest, Bf16BucketCopiesInFlightAreBounded) {
  const int n = 2;
  const Batch batch = RandomBatch(24);
  for (bool zero1 : {false, true}) {
    std::vector<std::vector<float>> unbounded(n);
    for (int bound : {0, 1, 2, 3}) {
      ThreadWorld world(n);
      ASSERT_TRUE(RunRanks(world, [&](int rank, ProcessGroup& world_pg) {
                    UnpolledGroup pg(world_pg);
                    mingpt::GPT model(Tiny());
                    model.Materialize(kSeed);
                    const Tensor idx = Rows(batch.idx, rank, n), tgt = Rows(batch.targets, rank, n);
                    std::vector<int64_t> bucket_bytes;  // bf16 copy of each bucket
                    std::unique_ptr<DistributedDataParallel> ddp;
                    std::unique_ptr<Zero1> zero;
                    if (zero1) {
                      Zero1Options o;
                      o.mixed_precision = MixedPrecisionPolicy::Bf16();
                      o.bucket_cap_mb = 0.001;
                      o.max_inflight_buckets = bound;
                      zero = std::make_unique<Zero1>(model, pg, MakeOptimizer(Opt::kSgd), o);
                      for (int b = 0; b < zero->num_buckets(); ++b) {
                        bucket_bytes.push_back(2 * zero->segment(b).padded);
                      }
                    } else {
                      DdpOptions o = MixedDdp(MixedPrecisionPolicy::Bf16());
                      o.bucket_cap_mb = 0.001;
                      o.max_inflight_buckets = bound;
                      ddp = std::make_unique<DistributedDataParallel>(model, pg, o);
                      for (int b = 0; b < ddp->num_buckets(); ++b) {
                        bucket_bytes.push_back(2 * ddp->BucketNumel(b));
                      }
                    }
                    ASSERT_GE(bucket_bytes.size(), 6u);
                    world.ledger(rank).ResetPeaks();
                    model.ForwardBackward(idx, tgt);
                    if (zero) ASSERT_TRUE(zero->FinishBackward().ok());
                    const int peak =
                        zero ? zero->last_peak_inflight_copies() : ddp->last_peak_inflight_copies();
                    const std::vector<float> grads = FlatGrads(model);
                    if (bound == 0) {
                      EXPECT_EQ(peak, static_cast<int>(bucket_bytes.size()));  // all at once
                      unbounded[rank] = grads;
                      return;
                    }
                    EXPECT_EQ(peak, bound);
                    std::sort(bucket_bytes.rbegin(), bucket_bytes.rend());
                    int64_t allowed = 0;
                    for (int b = 0; b < bound; ++b) allowed += bucket_bytes[b];
                    EXPECT_LE(world.ledger(rank)
                                  .Stats(tensor::Device::Cpu(), MemoryCategory::kCommunication)
                                  .peak,
                              allowed)
                        << "bound " << bound;
                    EXPECT_EQ(grads, unbounded[rank]) << "bound " << bound;
                  }).ok());
    }
  }
}

// ZeRO-1 in bf16: the gradient shard is reduced in bf16 and lands fp32; the
// masters gathered by FullStateDict are fp32 and round to the bf16 values the
// layers compute with.
TEST(Zero1MixedPrecisionTest, Bf16ReductionIntoFp32ShardAndFp32Masters) {
  const int n = 2;
  const Batch batch = RandomBatch(23);
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(RankSeed(rank));
                Zero1Options options;
                options.mixed_precision = MixedPrecisionPolicy::Bf16();
                options.bucket_cap_mb = 0.002;
                Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd), options);
                EXPECT_TRUE(zero.reduces_in_low_precision());
                model.ForwardBackward(Rows(batch.idx, rank, n), Rows(batch.targets, rank, n));
                ASSERT_TRUE(zero.FinishBackward().ok());
                // Every bucket's bf16 copy was cast back and freed.
                EXPECT_EQ(Current(MemoryCategory::kCommunication), 0);
                for (int b = 0; b < zero.num_buckets(); ++b) {
                  EXPECT_EQ(zero.grad_shard(b).dtype(), Dtype::kF32);
                  const std::vector<float> g = zero.grad_shard(b).ToVector<float>();
                  EXPECT_TRUE(AllBf16Representable(g)) << b;
                  EXPECT_GT(MaxAbsDiff(g, std::vector<float>(g.size(), 0.0f)), 0.0) << b;
                }
                ASSERT_TRUE(zero.Step().ok());
                auto full = zero.FullStateDict();
                if (rank != 0) {
                  EXPECT_TRUE(full.empty());
                  return;
                }
                auto params = model.NamedParameters();
                ASSERT_EQ(full.size(), params.size());
                bool any_not_bf16 = false;
                for (size_t i = 0; i < full.size(); ++i) {
                  EXPECT_EQ(full[i].first, params[i].first);
                  ASSERT_EQ(full[i].second.dtype(), Dtype::kF32);
                  EXPECT_EQ(full[i].second.To(Dtype::kBF16).ToVector<float>(),
                            params[i].second->value.ToVector<float>())
                      << full[i].first;
                  any_not_bf16 |= !AllBf16Representable(full[i].second.ToVector<float>());
                }
                EXPECT_TRUE(any_not_bf16);  // the masters keep fp32 precision
              }).ok());
}

// A policy keeping LayerNorm fp32: ZeRO-1 keeps an fp32 flat parameter; the
// other parameters compute with bf16 copies from forward to backward only.
TEST(Zero1MixedPrecisionTest, KeptFp32ClassesKeepAnFp32FlatParameter) {
  const Batch batch = RandomBatch(24);
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                Zero1Options options;
                options.mixed_precision = MixedPrecisionPolicy::Bf16();
                options.mixed_precision.fp32_module_classes = {"LayerNorm"};
                Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd), options);
                EXPECT_EQ(zero.flat_param_dtype(), Dtype::kF32);
                const Tensor idx = Rows(batch.idx, rank, 2), tgt = Rows(batch.targets, rank, 2);
                model.Loss(idx, tgt);
                for (auto& [name, p] : model.NamedParameters()) {
                  const bool ln = name.find(".ln_") != std::string::npos;
                  EXPECT_EQ(p->value.dtype(), ln ? Dtype::kF32 : Dtype::kBF16) << name;
                }
                model.ForwardBackward(idx, tgt);
                for (auto& [name, p] : model.NamedParameters()) {
                  EXPECT_EQ(p->value.dtype(), Dtype::kF32) << name;
                }
                ASSERT_TRUE(zero.Step().ok());
              }).ok());
}

TEST(MixedPrecisionOptionsTest, Fp32PolicyIsBitwiseTheDefault) {
  const Batch batch = RandomBatch(25);
  for (Mode mode : {Mode::kDdp, Mode::kZero1}) {
    std::vector<std::vector<float>> a(3), b(3);
    for (bool explicit_policy : {false, true}) {
      auto& out = explicit_policy ? b : a;
      ASSERT_TRUE(RunRanks(3, [&](int rank, ProcessGroup& pg) {
                    mingpt::GPT model(Tiny());
                    model.Materialize(kSeed);
                    const Tensor idx = Rows(batch.idx, rank, 3), tgt = Rows(batch.targets, rank, 3);
                    std::unique_ptr<DistributedDataParallel> ddp;
                    std::unique_ptr<Zero1> zero;
                    auto opt = MakeOptimizer(Opt::kAdamW);
                    if (mode == Mode::kDdp) {
                      ddp = explicit_policy ? std::make_unique<DistributedDataParallel>(
                                                  model, pg, MixedDdp(MixedPrecisionPolicy::Fp32()))
                                            : std::make_unique<DistributedDataParallel>(
                                                  model, pg, DdpOptions{0.002});
                    } else {
                      zero = explicit_policy ? std::make_unique<Zero1>(
                                                   model, pg, std::move(opt),
                                                   Zero1Options{MixedPrecisionPolicy::Fp32()})
                                             : std::make_unique<Zero1>(model, pg, std::move(opt));
                    }
                    for (int step = 0; step < 3; ++step) {
                      model.ForwardBackward(idx, tgt);
                      if (ddp) {
                        opt->Step(optim::FromModule(model));
                        ddp->ZeroGrad();
                      } else {
                        ASSERT_TRUE(zero->Step().ok());
                        zero->ZeroGrad();
                      }
                    }
                    out[rank] = FlatParams(model);
                  }).ok());
    }
    EXPECT_EQ(a, b);
  }
}

TEST(MixedPrecisionOptionsTest, UnknownDtypeInThePolicyIsAClearError) {
  ASSERT_TRUE(RunRanks(1, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                MixedPrecisionPolicy mp = MixedPrecisionPolicy::Bf16();
                mp.param_dtype = Dtype::kI32;
                try {
                  DistributedDataParallel ddp(model, pg, MixedDdp(mp));
                  ADD_FAILURE() << "an i32 param_dtype was accepted";
                } catch (const tensor::OpError& e) {
                  EXPECT_NE(std::string(e.what()).find("param_dtype"), std::string::npos)
                      << e.what();
                }
                Zero1Options options;
                options.mixed_precision = mp;
                EXPECT_THROW(Zero1(model, pg, MakeOptimizer(Opt::kSgd), options), tensor::OpError);
              }).ok());
}

}  // namespace
}  // namespace dist
