// Gradient buckets in backward order and the rule for when one is final,
// driven through the hook calls directly (DDP and ZeRO-1 tests run it inside
// real backward passes).
#include "dist/grad_buckets.h"

#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "nn/containers.h"
#include "nn/linear.h"
#include "tensor/error.h"

namespace dist::internal {
namespace {

// Three Linear(4, 4): parameters 0.weight (16), 0.bias (4), 1.weight, 1.bias,
// 2.weight, 2.bias, indices 0..5 in registration order.
std::unique_ptr<nn::Sequential> ThreeLinears() {
  auto seq = std::make_unique<nn::Sequential>();
  for (int i = 0; i < 3; ++i) seq->Append(std::make_unique<nn::Linear>(4, 4));
  seq->Materialize(1);
  return seq;
}

double Mb(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

TEST(ReverseOrderBucketsTest, LastParametersFirstUpToTheCap) {
  auto seq = ThreeLinears();
  const auto params = seq->NamedParameters();
  // 20 floats per bucket: one Linear's weight and bias.
  EXPECT_EQ(ReverseOrderBuckets("t", params, Mb(80)),
            (std::vector<std::vector<int>>{{5, 4}, {3, 2}, {1, 0}}));
  // 10 floats: a weight (16) exceeds the cap and gets a bucket of its own.
  EXPECT_EQ(ReverseOrderBuckets("t", params, Mb(40)),
            (std::vector<std::vector<int>>{{5}, {4}, {3}, {2}, {1}, {0}}));
  // A large cap: one bucket; so is an infinite or huge one (not a bucket
  // each, as an undefined conversion to bytes gave).
  for (double cap : {25.0, 1e300, std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(ReverseOrderBuckets("t", params, cap),
              (std::vector<std::vector<int>>{{5, 4, 3, 2, 1, 0}}))
        << cap;
  }
}

// DDP leaves frozen parameters out of its buckets; ZeRO-1, whose buckets
// also hold the parameters, keeps them in.
TEST(ReverseOrderBucketsTest, FrozenParametersAreSkippedWhenAsked) {
  auto seq = ThreeLinears();
  const auto params = seq->NamedParameters();
  params[2].second->requires_grad = false;  // 1.weight
  params[5].second->requires_grad = false;  // 2.bias
  EXPECT_EQ(ReverseOrderBuckets("t", params, Mb(80), /*skip_frozen=*/true),
            (std::vector<std::vector<int>>{{4, 3}, {1, 0}}));
  EXPECT_EQ(ReverseOrderBuckets("t", params, Mb(80)),
            (std::vector<std::vector<int>>{{5, 4}, {3, 2}, {1, 0}}));
  // A parameter in no bucket (-1) is waited for by none: bucket 0 (4, 3) is
  // ready once its two parameters are final.
  BucketReadiness readiness(*seq, {1, 1, -1, 0, 0, -1}, 2);
  readiness.StartBackward();
  EXPECT_EQ(readiness.TakeNextReady(), -1);
  readiness.MarkAllFinal();
  EXPECT_EQ(readiness.TakeNextReady(), 0);
  EXPECT_EQ(readiness.TakeNextReady(), 1);
  EXPECT_EQ(readiness.TakeNextReady(), -1);
  // PointGradsAtBuckets gives a frozen parameter no gradient.
  std::vector<tensor::Tensor> views;
  for (const auto& [name, p] : params) views.push_back(tensor::Tensor::Zeros(p->shape));
  PointGradsAtBuckets(params, views);
  EXPECT_FALSE(params[2].second->grad.defined());
  EXPECT_TRUE(params[3].second->grad.defined());
}

// Parameters kept fp32 (reduced in fp32) never share a bucket with others:
// a bucket starts where keptness changes, the cap still applies within a run
// of kept parameters, and frozen ones skipped do not count.
TEST(ReverseOrderBucketsTest, KeptFp32ParametersGetBucketsOfTheirOwn) {
  auto seq = ThreeLinears();
  const auto params = seq->NamedParameters();
  const std::set<const nn::Parameter*> kept = {params[2].second, params[3].second};  // 1.*
  EXPECT_EQ(ReverseOrderBuckets("t", params, 25.0, /*skip_frozen=*/false, kept),
            (std::vector<std::vector<int>>{{5, 4}, {3, 2}, {1, 0}}));
  // 10 floats: the kept weight (16) alone, its bias (4) in a bucket of its own.
  EXPECT_EQ(ReverseOrderBuckets("t", params, Mb(40), /*skip_frozen=*/false, kept),
            (std::vector<std::vector<int>>{{5}, {4}, {3}, {2}, {1}, {0}}));
  params[3].second->requires_grad = false;  // 1.bias, kept and frozen
  EXPECT_EQ(ReverseOrderBuckets("t", params, 25.0, /*skip_frozen=*/true, kept),
            (std::vector<std::vector<int>>{{5, 4}, {2}, {1, 0}}));
  EXPECT_EQ(ReverseOrderBuckets("t", params, 25.0, /*skip_frozen=*/true,
                                {params[4].second, params[1].second}),  // 2.weight, 0.bias
            (std::vector<std::vector<int>>{{5}, {4}, {2}, {1}, {0}}));
  // A skipped kept parameter starts no bucket (none is left empty).
  EXPECT_EQ(ReverseOrderBuckets("t", params, 25.0, /*skip_frozen=*/true, {params[3].second}),
            (std::vector<std::vector<int>>{{5, 4, 2, 1, 0}}));
}

// DDP and ZeRO-1 check before each backward that no parameter was frozen or
// unfrozen since they were built.
TEST(CheckFrozenUnchangedTest, NamesTheParameterThatChanged) {
  auto seq = ThreeLinears();
  const auto params = seq->NamedParameters();
  params[2].second->requires_grad = false;
  const std::vector<bool> frozen = FrozenFlags(params);
  EXPECT_EQ(frozen, (std::vector<bool>{false, false, true, false, false, false}));
  EXPECT_NO_THROW(CheckFrozenUnchanged("ddp", params, frozen));
  params[4].second->requires_grad = false;
  try {
    CheckFrozenUnchanged("ddp", params, frozen);
    FAIL() << "no error";
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("[ddp] parameter 2.weight was frozen (requires_grad) "
                                         "after the wrapper was built"),
              std::string::npos)
        << e.what();
  }
  params[4].second->requires_grad = true;
  params[2].second->requires_grad = true;
  EXPECT_THROW(CheckFrozenUnchanged("zero1", params, frozen), tensor::OpError);
}

// One flat buffer with a view per parameter, as DDP and ZeRO-1 lay out their
// buckets: a dropped gradient becomes its view, not zeroed but marked
// unwritten, a replaced one is copied into its view, and one already there is
// left alone. ZeroUnwrittenGrads then zeroes the marked views of the given
// parameters (or of all) and clears the marks; DropGrads drops every one.
TEST(PointGradsAtBucketsTest, EveryGradientEndsInItsView) {
  auto seq = ThreeLinears();
  const auto params = seq->NamedParameters();
  tensor::Tensor flat = tensor::Tensor::Full({60}, 7.0);  // stale values everywhere
  std::vector<tensor::Tensor> views;
  int64_t offset = 0;
  for (const auto& [name, p] : params) {
    views.push_back(flat.Narrow(0, offset, p->value.numel()).Reshape(p->value.shape()));
    offset += p->value.numel();
  }
  params[0].second->grad = tensor::Tensor();                                     // dropped
  params[1].second->grad = tensor::Tensor::Full({4}, 2.5);                       // replaced
  for (size_t i = 2; i < params.size(); ++i) params[i].second->grad = views[i];  // in place
  views[2].CopyFrom(tensor::Tensor::Full({4, 4}, 1.0));
  PointGradsAtBuckets(params, views);
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i].first);
    EXPECT_EQ(params[i].second->grad.raw_data(), views[i].raw_data());
  }
  EXPECT_TRUE(params[0].second->grad_unwritten);
  EXPECT_EQ(views[0].ToVector<float>(), std::vector<float>(16, 7.0f));  // not zeroed
  for (size_t i = 1; i < params.size(); ++i) EXPECT_FALSE(params[i].second->grad_unwritten);
  EXPECT_EQ(views[1].ToVector<float>(), std::vector<float>(4, 2.5f));
  EXPECT_EQ(views[2].ToVector<float>(), std::vector<float>(16, 1.0f));
  EXPECT_EQ(views[3].ToVector<float>(), std::vector<float>(4, 7.0f));  // untouched

  ZeroUnwrittenGrads(params, {1, 2});  // not parameter 0's
  EXPECT_TRUE(params[0].second->grad_unwritten);
  ZeroUnwrittenGrads(params, {0});
  EXPECT_FALSE(params[0].second->grad_unwritten);
  EXPECT_EQ(views[0].ToVector<float>(), std::vector<float>(16, 0.0f));
  EXPECT_EQ(views[2].ToVector<float>(), std::vector<float>(16, 1.0f));  // written: kept
  params[3].second->grad_unwritten = true;
  ZeroUnwrittenGrads(params);
  EXPECT_EQ(views[3].ToVector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_FALSE(params[3].second->grad_unwritten);

  DropGrads(params);
  for (const auto& [name, p] : params) EXPECT_FALSE(p->grad.defined()) << name;
  EXPECT_EQ(views[2].ToVector<float>(), std::vector<float>(16, 1.0f));  // the buffer as it was
}

TEST(ReverseOrderBucketsTest, CapMustBePositive) {
  auto seq = ThreeLinears();
  try {
    ReverseOrderBuckets("zero1", seq->NamedParameters(), 0);
    FAIL() << "no error";
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("zero1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bucket_cap_mb must be > 0"), std::string::npos)
        << e.what();
  }
}

// Buckets {5, 4} {3, 2} {1, 0}: per parameter 2 2 1 1 0 0.
std::unique_ptr<BucketReadiness> Readiness(nn::Sequential& seq) {
  return std::make_unique<BucketReadiness>(seq, std::vector<int>{2, 2, 1, 1, 0, 0}, 3);
}

void Forward(BucketReadiness& r, nn::Sequential& seq) {
  r.OnPreForward(seq);
  for (size_t i = 0; i < seq.size(); ++i) r.OnPreForward(*seq.at(i));
  r.EndForward();
}

// A backward's gradient writes: once per parameter of seq.at(layer).
void WriteGrads(nn::Sequential& seq, size_t layer) {
  for (auto& [name, p] : seq.at(layer)->NamedParameters()) p->GradToWrite();
}

// The first synced backward (each layer's parameters written once), which
// the rule learns from: every bucket waits for its end.
std::unique_ptr<BucketReadiness> LearnedReadiness(nn::Sequential& seq) {
  auto r = Readiness(seq);
  Forward(*r, seq);
  r->StartBackward();
  for (size_t layer : {2, 1, 0}) {
    WriteGrads(seq, layer);
    r->OnPostBackward(*seq.at(layer));
    EXPECT_EQ(r->TakeNextReady(), -1) << "the first backward issues at its end";
  }
  r->EndBackward();
  for (int b = 0; b < 3; ++b) EXPECT_EQ(r->TakeNextReady(), b);
  EXPECT_TRUE(r->CheckNoLateWrites("t", "all-reduce").ok());
  return r;
}

TEST(BucketReadinessTest, BucketsAreTakenInOrderOnceTheirModulesAreDone) {
  auto seq = ThreeLinears();
  auto r = LearnedReadiness(*seq);
  for (int step = 0; step < 2; ++step) {
    Forward(*r, *seq);
    r->StartBackward();
    EXPECT_EQ(r->TakeNextReady(), -1);
    WriteGrads(*seq, 2);
    r->OnPostBackward(*seq->at(2));
    EXPECT_EQ(r->TakeNextReady(), 0);
    EXPECT_EQ(r->TakeNextReady(), -1);
    // Bucket 2 is ready before bucket 1: it waits, so every rank issues 0, 1, 2.
    WriteGrads(*seq, 0);
    r->OnPostBackward(*seq->at(0));
    EXPECT_EQ(r->TakeNextReady(), -1);
    WriteGrads(*seq, 1);
    r->OnPostBackward(*seq->at(1));
    EXPECT_EQ(r->TakeNextReady(), 1);
    EXPECT_EQ(r->TakeNextReady(), 2);
    EXPECT_EQ(r->TakeNextReady(), -1);
    EXPECT_EQ(r->num_taken(), 3);
  }
}

TEST(BucketReadinessTest, AModuleRunTwiceIsDoneAfterItsSecondBackward) {
  auto seq = ThreeLinears();
  auto r = LearnedReadiness(*seq);
  r->OnPreForward(*seq);
  for (int i : {0, 1, 2, 2}) r->OnPreForward(*seq->at(i));  // layer 2 runs twice
  r->EndForward();
  r->StartBackward();
  WriteGrads(*seq, 2);
  r->OnPostBackward(*seq->at(2));
  EXPECT_EQ(r->TakeNextReady(), -1);
  WriteGrads(*seq, 2);
  r->OnPostBackward(*seq->at(2));
  EXPECT_EQ(r->TakeNextReady(), 0);
}

TEST(BucketReadinessTest, ForwardsRecomputedDuringBackwardDoNotCount) {
  auto seq = ThreeLinears();
  auto r = LearnedReadiness(*seq);
  Forward(*r, *seq);
  r->StartBackward();
  r->OnPreForward(*seq->at(2));  // activation checkpointing recomputes layer 2
  WriteGrads(*seq, 2);
  r->OnPostBackward(*seq->at(2));
  EXPECT_EQ(r->TakeNextReady(), 0);
}

TEST(BucketReadinessTest, MarkAllFinalReleasesEveryBucketInOrder) {
  auto seq = ThreeLinears();
  auto r = LearnedReadiness(*seq);
  Forward(*r, *seq);
  r->StartBackward();
  WriteGrads(*seq, 1);
  r->OnPostBackward(*seq->at(1));  // bucket 1 ready, bucket 0 not
  EXPECT_EQ(r->TakeNextReady(), -1);
  r->MarkAllFinal();
  EXPECT_EQ(r->TakeNextReady(), 0);
  EXPECT_EQ(r->TakeNextReady(), 1);
  EXPECT_EQ(r->TakeNextReady(), 2);
  EXPECT_EQ(r->TakeNextReady(), -1);
  // The root's backward marks its whole subtree too (once every gradient is written).
  r->StartBackward();
  for (size_t layer : {2, 1, 0}) WriteGrads(*seq, layer);
  r->OnPostBackward(*seq);
  EXPECT_EQ(r->num_taken(), 0);
  EXPECT_EQ(r->TakeNextReady(), 0);
}

// A parameter another module also uses (a weight of layer 2 that layer 0's
// backward writes too, as T5's tied head writes the shared embedding): the
// first backward learns its two writes, and later ones wait for both.
TEST(BucketReadinessTest, AGradientWrittenByAnotherModuleIsFinalAfterThatWriteToo) {
  auto seq = ThreeLinears();
  auto r = Readiness(*seq);
  nn::Parameter& shared = *seq->NamedParameters()[4].second;  // 2.weight, bucket 0
  for (int step = 0; step < 3; ++step) {
    Forward(*r, *seq);
    r->StartBackward();
    WriteGrads(*seq, 2);
    r->OnPostBackward(*seq->at(2));
    EXPECT_EQ(r->TakeNextReady(), -1) << step;  // step 0: learning; then: one write missing
    WriteGrads(*seq, 1);
    r->OnPostBackward(*seq->at(1));
    EXPECT_EQ(r->TakeNextReady(), -1) << step;
    WriteGrads(*seq, 0);
    shared.GradToWrite();  // layer 0's backward uses 2.weight too
    r->OnPostBackward(*seq->at(0));
    if (step == 0) {
      EXPECT_EQ(r->TakeNextReady(), -1);
      r->EndBackward();
    }
    for (int b = 0; b < 3; ++b) EXPECT_EQ(r->TakeNextReady(), b) << step;
    EXPECT_TRUE(r->CheckNoLateWrites("t", "all-reduce").ok());
    if (step > 0) r->EndBackward();
  }
}

// A gradient written after its bucket was taken (more uses than the first
// backward made) is an error naming the parameter and the counts.
TEST(BucketReadinessTest, AWriteAfterTheBucketWentOutIsReported) {
  auto seq = ThreeLinears();
  auto r = LearnedReadiness(*seq);
  Forward(*r, *seq);
  r->StartBackward();
  WriteGrads(*seq, 2);
  r->OnPostBackward(*seq->at(2));
  EXPECT_EQ(r->TakeNextReady(), 0);
  seq->NamedParameters()[5].second->GradToWrite();  // 2.bias again, after bucket 0 went out
  WriteGrads(*seq, 1);
  r->OnPostBackward(*seq->at(1));
  WriteGrads(*seq, 0);
  r->OnPostBackward(*seq->at(0));
  r->EndBackward();
  const absl::Status late = r->CheckNoLateWrites("ddp", "all-reduce");
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(late.message()),
            "[ddp] the gradient of '2.bias' was written after its bucket's all-reduce went out "
            "(2 writes this backward, 1 when the bucket went out): it was used more often than "
            "in the synced backwards before, which set when its gradient is final, and every "
            "rank's gradient of it is wrong. Use each parameter equally often every step");
}

}  // namespace
// Copies in flight: at the bound, making another waits for the oldest and
// unpacks it; completed ones unpack oldest first; a failed collective's copy
// is freed without unpacking and its error comes out of Finish.
TEST(LowPrecisionCopiesTest, BoundOrderAndErrors) {
  std::vector<int> unpacked;
  LowPrecisionCopies copies(2, [&](int b, const tensor::Tensor& reduced) {
    EXPECT_EQ(reduced.dtype(), tensor::Dtype::kBF16);
    unpacked.push_back(b);
  });
  const tensor::Tensor src = tensor::Tensor::Zeros({8});
  auto pending = std::make_shared<CompletionWork>();  // completes when told
  copies.Make(0, src, tensor::Dtype::kBF16);
  copies.Issued(0, Work::Done(absl::OkStatus()));
  copies.Make(1, src, tensor::Dtype::kBF16);
  copies.Issued(1, pending);
  EXPECT_EQ(copies.inflight(), 2);
  copies.Make(2, src, tensor::Dtype::kBF16);  // at the bound: bucket 0 is unpacked first
  copies.Issued(2, Work::Done(absl::DataLossError("peer died")));
  EXPECT_EQ(unpacked, std::vector<int>{0});
  EXPECT_EQ(copies.inflight(), 2);
  copies.UnpackCompleted();  // 2 failed: freed, not unpacked; 1 still pending
  EXPECT_EQ(unpacked, std::vector<int>{0});
  EXPECT_EQ(copies.inflight(), 1);
  pending->Complete(absl::OkStatus());
  const absl::Status s = copies.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(unpacked, (std::vector<int>{0, 1}));
  EXPECT_EQ(copies.inflight(), 0);
  EXPECT_EQ(copies.last_peak_inflight(), 2);
  EXPECT_TRUE(copies.Finish().ok());  // the error was reported once
  EXPECT_THROW(copies.Issued(3, Work::Done(absl::OkStatus())), tensor::OpError);  // no copy made
}

// A copy whose collective was never issued (issuing it threw) is abandoned:
// freed, never unpacked; the bucket's copy made again and issued is unpacked
// once.
TEST(LowPrecisionCopiesTest, AnAbandonedCopyIsNeverUnpacked) {
  std::vector<int> unpacked;
  LowPrecisionCopies copies(0, [&](int b, const tensor::Tensor&) { unpacked.push_back(b); });
  const tensor::Tensor src = tensor::Tensor::Zeros({8});
  copies.Make(0, src, tensor::Dtype::kBF16);
  copies.Issued(0, Work::Done(absl::OkStatus()));
  copies.Make(1, src, tensor::Dtype::kBF16);
  copies.Abandon(0);  // not the last one made: nothing happens
  EXPECT_EQ(copies.inflight(), 2);
  copies.Abandon(1);
  EXPECT_EQ(copies.inflight(), 1);
  copies.Abandon(1);  // nothing left of it
  copies.Make(1, src, tensor::Dtype::kBF16);
  copies.Issued(1, Work::Done(absl::OkStatus()));
  EXPECT_TRUE(copies.Finish().ok());
  EXPECT_EQ(unpacked, (std::vector<int>{0, 1}));
  copies.Make(2, src, tensor::Dtype::kBF16);  // never issued nor abandoned: an internal error
  EXPECT_THROW(copies.Finish().IgnoreError(), tensor::OpError);
}

}  // namespace dist::internal
