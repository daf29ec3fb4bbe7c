// DDP and ZeRO-1 under bf16 mixed precision, and the memory they hold: the
// dtypes of masters, compute copies and gradients, the bf16 gradient
// reduction into fp32, the model-state bytes between steps and during set-up,
// the bf16 bucket copies in flight (bounded), ZeRO-1's all-gathers started
// bucket by bucket, a reduction failing on one rank alone failing every
// rank, and the policy's errors (DDP and ZeRO-1 against one process:
// ddp_zero1_test.cc).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dist/ddp.h"
#include "dist/ddp_zero1_testing.h"
#include "dist/fsdp_testing.h"
#include "dist/recording_group.h"
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

using ddp_zero1_testing::Batch;
using ddp_zero1_testing::FlatGrads;
using ddp_zero1_testing::FlatParams;
using ddp_zero1_testing::kSeed;
using ddp_zero1_testing::MakeOptimizer;
using ddp_zero1_testing::MaxAbsDiff;
using ddp_zero1_testing::Mode;
using ddp_zero1_testing::Opt;
using ddp_zero1_testing::RandomBatch;
using ddp_zero1_testing::RankSeed;
using ddp_zero1_testing::Rows;
using precision::MixedPrecisionPolicy;
using tensor::Dtype;
using tensor::MemoryCategory;
using tensor::Tensor;
using testing::Tiny;  // dist/fsdp_testing.h

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

// Forward-only work (evaluation, generation): BeginForwardOnly makes the
// bf16 compute copies once and the forwards that follow compute with those
// same tensors (no cast per forward; ZeRO-1 casts only when a kept-fp32
// class is present, here LayerNorm); a backward in between is refused naming
// EndForwardOnly, which gives the fp32 masters back; training then goes on.
TEST(MixedPrecisionForwardOnlyTest, ComputeCopiesMadeOnceUntilEndForwardOnly) {
  const Batch batch = RandomBatch(22);
  MixedPrecisionPolicy mp = MixedPrecisionPolicy::Bf16();
  mp.fp32_module_classes = {"LayerNorm"};
  for (const bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "ZeRO-1" : "DDP");
    ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                  mingpt::GPT model(Tiny());
                  model.Materialize(kSeed);
                  std::unique_ptr<DistributedDataParallel> ddp;
                  std::unique_ptr<Zero1> z;
                  if (zero1) {
                    Zero1Options options;
                    options.mixed_precision = mp;
                    z = std::make_unique<Zero1>(model, pg, MakeOptimizer(Opt::kSgd), options);
                  } else {
                    ddp = std::make_unique<DistributedDataParallel>(model, pg, MixedDdp(mp));
                  }
                  auto begin = [&] { zero1 ? z->BeginForwardOnly() : ddp->BeginForwardOnly(); };
                  auto end = [&] { zero1 ? z->EndForwardOnly() : ddp->EndForwardOnly(); };
                  const Tensor idx = Rows(batch.idx, rank, 2), tgt = Rows(batch.targets, rank, 2);
                  nn::Parameter* head = model.NamedParameters().back().second;  // lm_head.weight
                  begin();
                  const Tensor copy = head->value;
                  EXPECT_EQ(copy.dtype(), Dtype::kBF16);
                  const double loss = model.Loss(idx, tgt);
                  EXPECT_EQ(model.Loss(idx, tgt), loss);
                  EXPECT_TRUE(head->value.SharesStorageWith(copy));  // not cast again
                  try {
                    model.ForwardBackward(idx, tgt);
                    ADD_FAILURE() << "backward ran between BeginForwardOnly and EndForwardOnly";
                  } catch (const tensor::OpError& e) {
                    EXPECT_NE(std::string(e.what()).find("call EndForwardOnly before training"),
                              std::string::npos)
                        << e.what();
                  }
                  end();
                  EXPECT_EQ(head->value.dtype(), Dtype::kF32);
                  EXPECT_TRUE(std::isfinite(model.ForwardBackward(idx, tgt)));
                  EXPECT_EQ(head->value.dtype(), Dtype::kF32);
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
// each collective's kind as it is issued; what it returns replaces the
// collective's result when that was OK (a failure of this rank alone, such
// as copying the result back, after the collective itself completed).
class UnpolledGroup final : public ProcessGroup {
 public:
  explicit UnpolledGroup(ProcessGroup& inner,
                         std::function<absl::Status(CollectiveKind)> on_issue = nullptr)
      : ProcessGroup(inner.timeout()), inner_(inner), on_issue_(std::move(on_issue)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::string_view backend() const override { return inner_.backend(); }

 protected:
  class UnpolledWork final : public Work {
   public:
    UnpolledWork(WorkPtr inner, absl::Status result)
        : inner_(std::move(inner)), result_(std::move(result)) {}
    absl::Status Wait() override {
      waited_ = true;
      const absl::Status s = inner_->Wait();
      return s.ok() ? result_ : s;
    }
    bool IsCompleted() const override { return waited_; }

   private:
    WorkPtr inner_;
    const absl::Status result_;
    std::atomic<bool> waited_{false};
  };
  WorkPtr Issue(std::shared_ptr<CollectiveCall> call) override {
    const absl::Status result = on_issue_ ? on_issue_(call->kind) : absl::OkStatus();
    return std::make_shared<UnpolledWork>(dist::testing::ForwardCall(inner_, *call), result);
  }
  absl::StatusOr<std::unique_ptr<ProcessGroup>> DoSplit(int, int, absl::Duration) override {
    return absl::UnimplementedError("UnpolledGroup does not split");
  }

 private:
  ProcessGroup& inner_;
  std::function<absl::Status(CollectiveKind)> on_issue_;
};

// Steps nothing; records which ParamRefs it was asked to update, into the
// same log as the collectives.
class RecordingOptimizer final : public optim::Optimizer {
 public:
  explicit RecordingOptimizer(std::vector<std::string>* log) : Optimizer(0.1), log_(log) {}
  const char* name() const override { return "recording"; }
  std::string Settings() const override { return "recording()"; }
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
                  return absl::OkStatus();
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
                    if (zero) {
                      ASSERT_TRUE(zero->FinishBackward().ok());
                    }
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

// A step's reduction that fails on rank 1 alone (its result could not be
// copied back; the collective itself completed on both ranks) fails both
// ranks' FinishBackward, rank 0 naming rank 1, so neither steps and the
// ranks' collectives stay in step: the next step trains on both.
TEST(DdpZero1Test, AReductionFailingOnOneRankFailsEveryRank) {
  const int n = 2;
  const Batch batch = RandomBatch(26);
  for (bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "zero1" : "ddp");
    const CollectiveKind reduction =
        zero1 ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
    std::vector<std::vector<float>> params(n);
    ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& world_pg) {
                  int reductions = 0;
                  UnpolledGroup pg(world_pg, [&](CollectiveKind kind) {
                    // Rank 1's first bucket reduction of step 0 (the set-up
                    // only broadcasts).
                    const bool fail = rank == 1 && kind == reduction && ++reductions == 1;
                    return fail ? absl::DataLossError("copying the result back failed")
                                : absl::OkStatus();
                  });
                  mingpt::GPT model(Tiny());
                  model.Materialize(kSeed);
                  std::unique_ptr<DistributedDataParallel> ddp;
                  std::unique_ptr<Zero1> zero;
                  if (zero1) {
                    zero = std::make_unique<Zero1>(model, pg, MakeOptimizer(Opt::kSgd));
                  } else {
                    ddp = std::make_unique<DistributedDataParallel>(model, pg);
                  }
                  for (int step = 0; step < 2; ++step) {
                    std::string error;
                    try {
                      model.ForwardBackward(Rows(batch.idx, rank, n),
                                            Rows(batch.targets, rank, n));
                      const absl::Status s = zero ? zero->FinishBackward() : ddp->FinishBackward();
                      if (!s.ok()) error = std::string(s.message());
                    } catch (const tensor::OpError& e) {  // DDP: at the root's PostBackward
                      error = e.what();
                    }
                    if (step == 0 && zero) {
                      EXPECT_FALSE(zero->Step().ok()) << "a rank stepped";
                    }
                    if (step == 1) {
                      EXPECT_EQ(error, "");
                      if (zero) {
                        EXPECT_TRUE(zero->Step().ok());
                      }
                    } else if (rank == 1) {
                      EXPECT_NE(error.find("copying the result back failed"), std::string::npos)
                          << error;
                    } else {
                      EXPECT_NE(error.find(absl::StrCat("this step's ",
                                                        zero1 ? "reduce-scatter" : "all-reduce",
                                                        "s failed on rank 1 (see its error), so "
                                                        "no rank should step")),
                                std::string::npos)
                          << error;
                    }
                    zero ? zero->ZeroGrad() : ddp->ZeroGrad();
                  }
                  params[rank] = FlatParams(model);
                }).ok());
    EXPECT_EQ(MaxAbsDiff(params[0], params[1]), 0.0) << "the ranks' parameters differ";
  }
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
