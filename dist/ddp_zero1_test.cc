// DDP and ZeRO-1 over the threads engine against one process training the
// global batch: losses, parameters, bucket overlap, no_sync accumulation and
// the optimizer-state bytes in each rank's ledger (parameters used more than
// once, or outside their module: ddp_zero1_reuse_test.cc; bf16
// mixed precision and the memory held: ddp_zero1_mixed_precision_test.cc;
// backwards that did not finish: ddp_zero1_abandoned_test.cc; the bf16
// training parity tests: mixed_precision_parity_test.cc).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/ddp.h"
#include "dist/ddp_zero1_testing.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/freeze.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace dist {
namespace {

using ddp_zero1_testing::Batch;
using ddp_zero1_testing::ExpectSlicesEqual;
using ddp_zero1_testing::FlatGrads;
using ddp_zero1_testing::FlatParams;
using ddp_zero1_testing::kSeed;
using ddp_zero1_testing::kSteps;
using ddp_zero1_testing::kTol;
using ddp_zero1_testing::MakeOptimizer;
using ddp_zero1_testing::MaxAbsDiff;
using ddp_zero1_testing::Mode;
using ddp_zero1_testing::Opt;
using ddp_zero1_testing::RandomBatch;
using ddp_zero1_testing::RankSeed;
using ddp_zero1_testing::ReducedSlices;
using ddp_zero1_testing::Rows;
using tensor::Tensor;
using testing::MaybeSkips;  // dist/fsdp_testing.h
using testing::Tiny;        // dist/fsdp_testing.h

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

double GlobalLoss(ProcessGroup& pg, double local) {
  Tensor t = Tensor::FromVector({static_cast<float>(local)}, {1});
  EXPECT_TRUE(pg.AllReduceSync(t, ReduceOp::kAvg).ok());
  return t.Item();
}

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
        ddp.ZeroGrad(/*set_to_none=*/step % 2 == 1);  // both ways: the same training
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
        zero.ZeroGrad(/*set_to_none=*/step % 2 == 1);  // both ways: the same training
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

// broadcast_buffers (PyTorch DDP's default): each training forward starts
// from rank 0's buffers. Ranks that trained on different rows, then run one
// forward on the same rows, end with the same BatchNorm statistics; without
// it, each keeps its own.
TEST(DdpZero1Test, BroadcastBuffersKeepsTheRanksBatchNormStatisticsRank0s) {
  for (auto [zero1, broadcast] : {std::pair{false, true}, std::pair{false, false},
                                  std::pair{true, true}, std::pair{true, false}}) {
    SCOPED_TRACE(absl::StrCat(zero1 ? "ZeRO-1" : "DDP", broadcast ? "" : ", no broadcast"));
    std::vector<std::vector<float>> means(2);
    ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                  nn::Sequential net;
                  net.Append(std::make_unique<nn::Linear>(4, 3));
                  auto* bn = net.Append(std::make_unique<nn::BatchNorm1d>(3));
                  net.Materialize(kSeed);
                  std::unique_ptr<DistributedDataParallel> ddp;
                  std::unique_ptr<Zero1> zero;
                  if (zero1) {
                    Zero1Options options;
                    options.broadcast_buffers = broadcast;
                    zero = std::make_unique<Zero1>(net, pg, optim::SGD::Create({}).value(),
                                                   options);
                  } else {
                    DdpOptions options;
                    options.broadcast_buffers = broadcast;
                    ddp = std::make_unique<DistributedDataParallel>(net, pg, options);
                  }
                  for (int step = 0; step < 2; ++step) {
                    // Step 0: this rank's rows; step 1: the same rows on both.
                    const int seed = step == 0 ? 10 + rank : 20;
                    nn::Context ctx;
                    net.Run(tensor::testing::RandomTensor({6, 4}, seed), ctx);
                    net.RunBackward(tensor::testing::RandomTensor({6, 3}, 30), ctx);
                    if (zero1) {
                      zero->ZeroGrad();
                    } else {
                      ddp->ZeroGrad();
                    }
                  }
                  means[rank] = bn->NamedBuffers()[0].second->ToVector<float>();
                }).ok());
    if (broadcast) {
      EXPECT_EQ(means[0], means[1]);
    } else {
      EXPECT_NE(means[0], means[1]);
    }
  }
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
                  if (step == 0) {  // the first synced backward learns: all at its end
                    EXPECT_EQ(issued_before_root, 0);
                  } else {  // every bucket went out while backward was still running
                    EXPECT_LT(first_issue_at, root_at);
                    EXPECT_EQ(issued_before_root, ddp.num_buckets());
                  }
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

// Under ZeRO-1 each rank's gradient is averaged in its own slices only: an
// optimizer of the caller's stepping on the model's parameters would set the
// ranks apart, and is refused naming the parameter; frozen ones and a model
// whose Zero1 is gone are the module's own again.
TEST(Zero1Test, AnOptimizerOfTheCallersIsRefusedTheModelsParameters) {
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                mingpt::GPT model(Tiny());
                model.Materialize(kSeed);
                {
                  Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd));
                  model.ForwardBackward(Rows(RandomBatch(3).idx, rank, 2),
                                        Rows(RandomBatch(3).targets, rank, 2));
                  ASSERT_TRUE(zero.FinishBackward().ok());
                  EXPECT_THAT([&] { optim::FromModule(model); },
                              ::testing::ThrowsMessage<tensor::OpError>(::testing::StartsWith(
                                  "[FromModule] parameter 'transformer.wte.weight' is held by "
                                  "ZeRO-1, whose optimizer steps on this rank's shards")));
                  ASSERT_TRUE(zero.Step().ok());
                  // Nor is the model wrapped again.
                  EXPECT_THAT([&] { Zero1 again(model, pg, MakeOptimizer(Opt::kSgd)); },
                              ::testing::ThrowsMessage<tensor::OpError>(::testing::StrEq(
                                  "[zero1] the model is wrapped already (DDP or ZeRO-1 hooks on "
                                  "it): wrap a model once")));
                  EXPECT_THAT([&] { DistributedDataParallel ddp(model, pg); },
                              ::testing::ThrowsMessage<tensor::OpError>(::testing::StartsWith(
                                  "[ddp] the model is wrapped already")));
                  // Nor a part of it.
                  EXPECT_THAT(
                      [&] { DistributedDataParallel ddp(*model.transformer()->blocks(), pg); },
                      ::testing::ThrowsMessage<tensor::OpError>(::testing::StartsWith(
                          "[ddp] the model is wrapped already")));
                }
                for (auto& [name, p] : model.NamedParameters()) EXPECT_EQ(p->held_by, "") << name;
                EXPECT_FALSE(optim::FromModule(model).empty());
                {
                  // DDP leaves the parameters to the caller's optimizer, and
                  // is not wrapped twice either.
                  DistributedDataParallel ddp(model, pg);
                  EXPECT_FALSE(optim::FromModule(model).empty());
                  EXPECT_THAT([&] { DistributedDataParallel again(model, pg); },
                              ::testing::ThrowsMessage<tensor::OpError>(::testing::StartsWith(
                                  "[ddp] the model is wrapped already")));
                  EXPECT_THAT([&] { Zero1 zero(model, pg, MakeOptimizer(Opt::kSgd)); },
                              ::testing::ThrowsMessage<tensor::OpError>(::testing::StartsWith(
                                  "[zero1] the model is wrapped already")));
                }
                Zero1 after(model, pg, MakeOptimizer(Opt::kSgd));  // once DDP is gone
              }).ok());
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
                  // Every bucket went out while backward was still running
                  // (after the first synced backward, which issues them at
                  // its end); Step waits for them.
                  EXPECT_EQ(issued_before_root, step == 0 ? 0 : zero.num_buckets());
                  EXPECT_EQ(ev.back().kind,
                            step == 0 ? Kind::kBucketIssued : Kind::kRootPostBackward);
                  ASSERT_TRUE(zero.Step().ok());
                  EXPECT_EQ(zero.last_backward_events().back().kind, Kind::kReductionsDone);
                  zero.ZeroGrad();
                }
              }).ok());
}

// Frozen parameters: with small buckets the embeddings and the first Block
// fill buckets of frozen parameters only, which reduce-scatter nothing, take
// no optimizer step (no state) and all-gather nothing; the parameters end
// bitwise as with one bucket (frozen ranges inside it), the frozen ones as
// they began.
TEST(Zero1Test, FrozenBucketsCommunicateNothing) {
  const Batch batch = RandomBatch(5);
  const std::vector<std::string> freeze = {"transformer.wte", "transformer.wpe",
                                           "transformer.h.0"};
  std::vector<std::vector<float>> finals(2);  // rank 0's parameters: small buckets, one bucket
  for (int run = 0; run < 2; ++run) {
    ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                  mingpt::GPT model(Tiny());
                  ASSERT_TRUE(nn::FreezeParameters(model, freeze).ok());
                  model.Materialize(kSeed);
                  const std::vector<float> start = FlatParams(model);
                  Zero1Options o;
                  o.bucket_cap_mb = run == 0 ? 0.002 : 25;
                  Zero1 zero(model, pg, MakeOptimizer(Opt::kAdamW), o);
                  int frozen_buckets = 0;
                  for (int b = 0; b < zero.num_buckets(); ++b) {
                    frozen_buckets += zero.bucket_trains(b) ? 0 : 1;
                  }
                  EXPECT_EQ(frozen_buckets > 0, run == 0);
                  for (int step = 0; step < 3; ++step) {
                    model.ForwardBackward(Rows(batch.idx, rank, 2), Rows(batch.targets, rank, 2));
                    int issued = 0;
                    for (const BackwardEvent& e : zero.last_backward_events()) {
                      issued += e.kind == BackwardEvent::Kind::kBucketIssued ? 1 : 0;
                    }
                    EXPECT_EQ(issued, zero.num_buckets() - frozen_buckets);
                    ASSERT_TRUE(zero.Step().ok());
                    zero.ZeroGrad();
                  }
                  for (int b = 0; b < zero.num_buckets(); ++b) {
                    EXPECT_EQ(zero.optimizer().HasState(absl::StrCat("zero1.bucket", b)),
                              zero.bucket_trains(b));
                  }
                  const std::vector<float> now = FlatParams(model);
                  int64_t offset = 0, frozen_moved = 0, trained_moved = 0;
                  for (auto& [name, p] : model.NamedParameters()) {
                    for (int64_t i = offset; i < offset + p->numel(); ++i) {
                      (p->requires_grad ? trained_moved : frozen_moved) += now[i] != start[i];
                    }
                    offset += p->numel();
                  }
                  EXPECT_EQ(frozen_moved, 0);
                  EXPECT_GT(trained_moved, 0);
                  if (rank == 0) finals[run] = now;
                }).ok());
  }
  EXPECT_EQ(finals[0], finals[1]);
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

// DDP and ZeRO-1 train alike whether ZeroGrad zeroes the buckets or drops the
// gradients (the next backward writing them), bit for bit, with a step whose
// forward skips a layer on rank 1 (its part of the bucket, not written, is
// zeros in the average either way) and a step accumulating two micro-batches
// (the first under no_sync). A layer no rank runs differs under DDP, as in
// PyTorch (ALayerNoRankRanKeepsItsStepStartGradientUnderDdp): there only
// rank 1 skips it; ZeRO-1 gives it zeros either way, so there no rank does.
TEST(DdpZero1Test, DroppedGradientsTrainAsZeroedOnes) {
  constexpr int64_t kD = 8, kRows = 4;
  for (Mode mode : {Mode::kDdp, Mode::kZero1}) {
    std::vector<float> params[2];  // rank 0's, ZeroGrad zeroing / dropping
    for (bool drop : {false, true}) {
      SCOPED_TRACE(absl::StrCat(mode == Mode::kDdp ? "ddp" : "zero1", drop ? ", dropped" : ""));
      ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                    MaybeSkips m(kD);
                    m.Materialize(kSeed);
                    std::unique_ptr<DistributedDataParallel> ddp;
                    std::unique_ptr<Zero1> zero;
                    std::unique_ptr<optim::Optimizer> opt;
                    if (mode == Mode::kDdp) {
                      ddp = std::make_unique<DistributedDataParallel>(m, pg, DdpOptions{0.0005});
                      opt = MakeOptimizer(Opt::kSgd);
                    } else {
                      Zero1Options o;
                      o.bucket_cap_mb = 0.0005;
                      zero = std::make_unique<Zero1>(m, pg, MakeOptimizer(Opt::kSgd), o);
                    }
                    auto backward = [&](int seed) {
                      nn::Context ctx;
                      const Tensor x = tensor::testing::RandomTensor({kRows, kD}, seed + rank);
                      m.Run(x, ctx);
                      m.RunBackward(tensor::testing::RandomTensor({kRows, kD}, seed + 7), ctx);
                    };
                    const bool uses[] = {true, false, true, true};
                    for (int step = 0; step < 4; ++step) {
                      m.use_second = uses[step] || (mode == Mode::kDdp && rank == 0);
                      if (step == 3) {  // two micro-batches, the first under no_sync
                        if (ddp) {
                          auto guard = ddp->no_sync();
                          backward(100);
                        } else {
                          auto guard = zero->no_sync();
                          backward(100);
                        }
                      }
                      backward(10 * step);
                      if (ddp) {
                        ASSERT_TRUE(ddp->FinishBackward().ok());
                        opt->Step(optim::FromModule(m));
                        ddp->ZeroGrad(drop);
                      } else {
                        ASSERT_TRUE(zero->Step().ok());
                        zero->ZeroGrad(drop);
                      }
                      for (const auto& [name, p] : m.NamedParameters()) {
                        EXPECT_EQ(p->grad.defined(), !drop) << name;
                      }
                    }
                    if (rank == 0) params[drop] = FlatParams(m);
                  }).ok());
    }
    ASSERT_FALSE(params[0].empty());
    EXPECT_EQ(params[0], params[1]) << (mode == Mode::kDdp ? "ddp" : "zero1");
  }
}

// A layer no rank runs in a step keeps the gradient it had when the step
// began under DDP (the ranks agree on it), as in one process: none after
// ZeroGrad(set_to_none=true) or before its first backward, so AdamW skips it
// (no weight decay, no momentum step, no step count); zeros after
// ZeroGrad(set_to_none=false), which AdamW steps. Also when each step begins
// with ZeroGrad (the usual loop) instead of ending with it: ZeroGrad(false)
// before the first backward leaves no gradient where there was none. Each
// rank gets the batch one process sees, so the runs match; before, DDP
// stepped the layer with a zero gradient in every case, and then dropped it
// in every case. A layer one rank runs and the other does not is averaged
// as usual.
TEST(DdpZero1Test, ALayerNoRankRanKeepsItsStepStartGradientUnderDdp) {
  constexpr int64_t kD = 8, kRows = 4;
  const bool uses[] = {false, false, true, false};
  constexpr int kSteps = 4;
  auto batch = [&](int step) {
    return std::make_pair(tensor::testing::RandomTensor({kRows, kD}, 10 * step),
                          tensor::testing::RandomTensor({kRows, kD}, 10 * step + 7));
  };
  for (const auto& [drop, zero_first] : std::vector<std::pair<bool, bool>>{
           {true, false}, {false, false}, {true, true}, {false, true}}) {
    SCOPED_TRACE(absl::StrCat(drop ? "ZeroGrad drops" : "ZeroGrad zeroes",
                              zero_first ? ", first in each step" : ", last in each step"));
    // Whether the layer has a gradient after each step's backward.
    std::vector<bool> has_grad;
    MaybeSkips one(kD);
    one.Materialize(kSeed);
    std::unique_ptr<optim::Optimizer> one_opt = MakeOptimizer(Opt::kAdamW);
    for (int step = 0; step < kSteps; ++step) {
      if (zero_first) one.ZeroGrad(drop);
      one.use_second = uses[step];
      nn::Context ctx;
      one.Run(batch(step).first, ctx);
      one.RunBackward(batch(step).second, ctx);
      has_grad.push_back(one.NamedParameters().back().second->grad.defined());
      one_opt->Step(optim::FromModule(one));
      if (!zero_first) one.ZeroGrad(drop);
    }
    // Skipped at steps 0 and 1 either way; zeros stepped at step 3 unless dropped.
    EXPECT_EQ(one_opt->StepCount("second.weight"), drop ? 1 : 2);
    const std::vector<float> want = FlatParams(one);
    ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                  MaybeSkips m(kD);
                  m.Materialize(kSeed);
                  DistributedDataParallel ddp(m, pg, DdpOptions{0.0005});
                  std::unique_ptr<optim::Optimizer> opt = MakeOptimizer(Opt::kAdamW);
                  for (int step = 0; step < kSteps; ++step) {
                    if (zero_first) ddp.ZeroGrad(drop);
                    m.use_second = uses[step];
                    nn::Context ctx;
                    m.Run(batch(step).first, ctx);
                    m.RunBackward(batch(step).second, ctx);
                    ASSERT_TRUE(ddp.FinishBackward().ok());
                    EXPECT_EQ(m.NamedParameters().back().second->grad.defined(),
                              has_grad[step])
                        << "step " << step;
                    opt->Step(optim::FromModule(m));
                    if (!zero_first) ddp.ZeroGrad(drop);
                  }
                  EXPECT_EQ(opt->StepCount("second.weight"), drop ? 1 : 2);
                  const std::vector<float> got = FlatParams(m);
                  ASSERT_EQ(got.size(), want.size());
                  for (size_t i = 0; i < got.size(); ++i) {
                    ASSERT_NEAR(got[i], want[i], 1e-6) << "element " << i << " rank " << rank;
                  }
                }).ok());
  }
  // One rank runs the layer, the other not: its gradient is the average.
  ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                MaybeSkips m(kD);
                m.Materialize(kSeed);
                DistributedDataParallel ddp(m, pg, DdpOptions{0.0005});
                m.use_second = rank == 0;
                nn::Context ctx;
                m.Run(batch(0).first, ctx);
                m.RunBackward(batch(0).second, ctx);
                ASSERT_TRUE(ddp.FinishBackward().ok());
                EXPECT_TRUE(m.NamedParameters().back().second->grad.defined());
              }).ok());
}

}  // namespace
}  // namespace dist
