// DDP and ZeRO-1 backwards that did not finish, over the threads engine:
// ZeroGrad after a backward that threw finishes its reductions first, and a
// backward stopped partway on one rank stops every rank's step and leaves
// nothing behind once ZeroGrad has run.
#include <map>
#include <memory>
#include <optional>
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
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/error.h"

namespace dist {
namespace {

using ddp_zero1_testing::FlatGrads;
using ddp_zero1_testing::kSeed;
using ddp_zero1_testing::MakeOptimizer;
using ddp_zero1_testing::Mode;
using ddp_zero1_testing::Opt;
using tensor::Tensor;
using testing::MaybeSkips;  // dist/fsdp_testing.h

// ZeroGrad after a backward that threw (its first bucket in flight) finishes
// its reductions first (on every rank alike), instead of zeroing buckets an
// all-reduce or reduce-scatter is still writing: the gradients are zeros
// after it, the values are as a finished step leaves them under bf16
// compute (DDP's fp32 masters: the root's PostBackward that restores them
// never ran), and the next step trains.
TEST(DdpZero1Test, ZeroGradFinishesTheReductionsOfAnAbandonedBackward) {
  for (const std::pair<Mode, bool>& run : std::vector<std::pair<Mode, bool>>{
           {Mode::kDdp, false}, {Mode::kDdp, true}, {Mode::kZero1, false}, {Mode::kZero1, true}}) {
    const Mode mode = run.first;
    const bool bf16 = run.second;
    SCOPED_TRACE(absl::StrCat(mode == Mode::kDdp ? "ddp" : "zero1", bf16 ? ", bf16" : ""));
    ASSERT_TRUE(RunRanks(2, [&](int rank, ProcessGroup& pg) {
                  MaybeSkips model(8);
                  model.Materialize(kSeed);
                  std::unique_ptr<DistributedDataParallel> ddp;
                  std::unique_ptr<Zero1> zero;
                  DdpOptions ddp_options;
                  ddp_options.bucket_cap_mb = 0.0003;  // a bucket per layer
                  Zero1Options zero_options;
                  zero_options.bucket_cap_mb = 0.0003;
                  if (bf16) {
                    ddp_options.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
                    zero_options.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
                  }
                  if (mode == Mode::kDdp) {
                    ddp = std::make_unique<DistributedDataParallel>(model, pg, ddp_options);
                  } else {
                    zero = std::make_unique<Zero1>(model, pg, MakeOptimizer(Opt::kSgd),
                                                   zero_options);
                  }
                  auto zero_grad = [&] { ddp ? ddp->ZeroGrad() : zero->ZeroGrad(); };
                  auto step = [&] {
                    nn::Context ctx;
                    const Tensor x = Tensor::Full({4, 8}, 0.5 + rank);
                    const Tensor y = model.Run(x, ctx);
                    model.RunBackward(Tensor::Full({4, 8}, 1.0), ctx);
                  };
                  step();  // the first synced backward learns the buckets' order
                  if (zero) {
                    ASSERT_TRUE(zero->Step().ok());
                  }
                  zero_grad();
                  std::map<std::string, tensor::Dtype> dtypes;  // as a finished step leaves them
                  for (const auto& [name, p] : model.NamedParameters()) {
                    dtypes[name] = p->value.dtype();
                  }
                  model.stop_in_backward = true;
                  EXPECT_THROW(step(), tensor::OpError);
                  zero_grad();
                  for (float v : FlatGrads(model)) {
                    ASSERT_EQ(v, 0.0f) << "rank " << rank;
                  }
                  for (const auto& [name, p] : model.NamedParameters()) {
                    EXPECT_EQ(p->value.dtype(), dtypes.at(name)) << name;
                  }
                  if (ddp) {
                    EXPECT_EQ(ddp->last_backward_events().back().kind,
                              DistributedDataParallel::Event::Kind::kReductionsDone);
                  }
                  model.stop_in_backward = false;
                  step();
                  if (ddp) {
                    ASSERT_TRUE(ddp->FinishBackward().ok());
                  } else {
                    ASSERT_TRUE(zero->Step().ok());
                  }
                }).ok());
  }
}

// A backward that stops partway on the last rank only (its backward throws
// after 'second''s, before 'first''s): its reductions still go out, but no
// rank steps on the average -- that rank's FinishBackward (and ZeRO-1's
// Step) says its backward stopped partway, the others' name it (DDP's root
// PostBackward throws it first) -- and a backward run before ZeroGrad is
// refused again (its partial writes are still in the gradients). After
// ZeroGrad on every rank (in place, or set_to_none under no_sync), the next
// step's gradients are the first step's again (same inputs, SGD with lr 0):
// nothing of the stopped backward stays. The same when it stopped under
// no_sync (the synced backward after it is refused), and at world size 1.
TEST(DdpZero1Test, ABackwardStoppedPartwayOnOneRankStopsEveryRank) {
  for (Mode mode : {Mode::kDdp, Mode::kZero1}) {
    for (int n : {1, 2}) {
      for (bool no_sync : {false, true}) {
        SCOPED_TRACE(absl::StrCat(mode == Mode::kDdp ? "ddp" : "zero1", ", world ", n,
                                  no_sync ? ", no_sync" : ""));
        ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                      const bool stops = rank == n - 1;
                      MaybeSkips model(8);
                      model.Materialize(kSeed);
                      std::unique_ptr<DistributedDataParallel> ddp;
                      std::unique_ptr<Zero1> zero;
                      if (mode == Mode::kDdp) {
                        ddp = std::make_unique<DistributedDataParallel>(model, pg,
                                                                        DdpOptions{0.0003});
                      } else {
                        optim::SgdOptions sgd;
                        sgd.lr = 0;
                        Zero1Options o;
                        o.bucket_cap_mb = 0.0003;  // a bucket per layer
                        zero = std::make_unique<Zero1>(model, pg,
                                                       optim::SGD::Create(sgd).value(), o);
                      }
                      // The backward's error ("" when none).
                      const auto backward = [&](bool stop) -> std::string {
                        model.stop_in_backward = stop;
                        nn::Context ctx;
                        model.Run(Tensor::Full({4, 8}, 0.5 + rank), ctx);
                        std::string error;
                        try {
                          model.RunBackward(Tensor::Full({4, 8}, 1.0), ctx);
                        } catch (const tensor::OpError& e) {
                          error = e.what();
                        }
                        model.stop_in_backward = false;
                        return error;
                      };
                      const auto finish = [&] {
                        return ddp ? ddp->FinishBackward() : zero->FinishBackward();
                      };
                      const std::string stopped_here = "this rank's backward stopped partway";
                      const std::string stopped_there =
                          "the backward stopped partway on rank 1 (see its error)";
                      // A synced backward refused, this rank's error naming why.
                      const auto expect_refused = [&](const std::string& backward_error) {
                        const absl::Status s = finish();
                        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
                        const std::string& why = stops ? stopped_here : stopped_there;
                        EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(why));
                        if (ddp && !stops) {  // the root's PostBackward threw it
                          EXPECT_THAT(backward_error, ::testing::HasSubstr(why));
                        }
                        if (zero) {
                          EXPECT_THAT(std::string(zero->Step().message()),
                                      ::testing::HasSubstr(why));
                        }
                      };

                      ASSERT_EQ(backward(false), "");  // learns the buckets' order
                      ASSERT_TRUE(finish().ok());
                      const std::vector<float> first = FlatGrads(model);
                      if (zero) {
                        ASSERT_TRUE(zero->Step().ok());
                      }
                      ddp ? ddp->ZeroGrad() : zero->ZeroGrad();

                      if (no_sync) {
                        std::optional<DistributedDataParallel::NoSyncGuard> ddp_guard;
                        std::optional<Zero1::NoSyncGuard> zero_guard;
                        if (ddp) {
                          ddp_guard.emplace(ddp.get());
                        } else {
                          zero_guard.emplace(zero.get());
                        }
                        backward(stops);
                      }
                      expect_refused(backward(!no_sync && stops));
                      // Still refused: the partial writes stay until ZeroGrad.
                      expect_refused(backward(false));
                      EXPECT_NO_THROW(ddp ? ddp->ZeroGrad(no_sync) : zero->ZeroGrad(no_sync));

                      ASSERT_EQ(backward(false), "");
                      ASSERT_TRUE(finish().ok());
                      EXPECT_EQ(FlatGrads(model), first) << "rank " << rank;
                      if (zero) {
                        EXPECT_TRUE(zero->Step().ok());
                      }
                    }).ok());
      }
    }
  }
}

}  // namespace
}  // namespace dist
