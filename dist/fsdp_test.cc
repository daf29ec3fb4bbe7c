// FSDP on the threads engine with a tiny minGPT: sharded initialization
// (bitwise equal to single-process Materialize), training parity with one
// process on the global batch for FULL_SHARD / SHARD_GRAD_OP / NO_SHARD at
// world sizes 1..4 (3: uneven padding), mixed precision, and gradients the
// backward skips or ZeroGrad drops. Wrap policies: wrap_policy_test.cc;
// FlatParameter: flat_param_test.cc; the per-rank memory ledger and
// Unshard(): fsdp_memory_test.cc.
#include "dist/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/linear.h"
#include "nn/mixed_precision.h"
#include "nn/state_dict.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/init.h"
#include "tensor/ops/matmul.h"
#include "tensor/testing.h"

namespace dist {
namespace {

using tensor::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using namespace dist::testing;  // NOLINT: the shared fixtures

// ---- Sharded initialization ----

class ShardedInitTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedInitTest, ShardsEqualSingleProcessMaterializeBitwise) {
  const int world = GetParam();
  const mingpt::GptConfig c = Tiny();
  mingpt::GPT ref(c);
  ref.Materialize(kSeed);
  std::map<std::string, Tensor> ref_params;
  for (auto& [n, p] : ref.NamedParameters()) ref_params[n] = p->value;
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    FsdpOptions options = PerBlock();
    auto fsdp = FullyShard(gpt, pg, options);
    // No rank holds full parameters after sharding.
    for (auto& [n, p] : gpt.NamedParameters()) EXPECT_FALSE(p->value.defined()) << n;
    for (int u = 0; u < fsdp->num_units(); ++u) {
      const FlatParameter& flat = fsdp->flat_param(u);
      EXPECT_EQ(flat.padded_numel() % world, 0);
      // The reference flat buffer of this unit, then this rank's slice of it.
      std::vector<float> expected(flat.padded_numel(), 0.0f);
      for (auto& e : flat.entries()) {
        auto v = ref_params.at(e.name).ToVector<float>();
        std::copy(v.begin(), v.end(), expected.begin() + e.offset);
      }
      ASSERT_EQ(flat.shard().numel(), flat.shard_numel());
      EXPECT_EQ(0, std::memcmp(flat.shard().data<float>(), expected.data() + flat.shard_begin(),
                               flat.shard_numel() * sizeof(float)))
          << "unit " << fsdp->unit_name(u) << " rank " << rank;
    }
    NamedTensors full = fsdp->FullStateDict();
    if (rank == 0) {
      ASSERT_EQ(full.size(), ref_params.size());
      for (auto& [n, t] : full) {
        const Tensor& r = ref_params.at(n);
        ASSERT_EQ(t.shape().dims(), r.shape().dims()) << n;
        EXPECT_EQ(0, std::memcmp(t.data<float>(), r.data<float>(), r.nbytes())) << n;
      }
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedInitTest, ::testing::Values(1, 2, 3, 4));

// sync_module_states: rank 0's model (materialized with another seed) is
// every rank's, whatever the others hold (another model, or nothing), under
// each strategy: each rank's shard is the slice of rank 0's values. Without
// a value on rank 0, every rank refuses alike.
TEST(ShardedInitTest, SyncModuleStatesShardsRankZerosModel) {
  const mingpt::GptConfig c = Tiny();
  mingpt::GPT ref(c);
  ref.Materialize(kSeed + 7);
  std::map<std::string, Tensor> ref_params;
  for (auto& [n, p] : ref.NamedParameters()) ref_params[n] = p->value;
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard,
                                    ShardingStrategy::kHybridShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    absl::Status s = RunRanks(4, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      if (rank == 0) gpt.Materialize(kSeed + 7);
      if (rank == 2) gpt.Materialize(99);  // ranks 1 and 3: nothing
      FsdpOptions options = PerBlock(strategy);
      options.hybrid_shard_group_size = IsHybrid(strategy) ? 2 : 0;
      options.sync_module_states = true;
      auto fsdp = FullyShard(gpt, pg, options);
      for (int u = 0; u < fsdp->num_units(); ++u) {
        const FlatParameter& flat = fsdp->flat_param(u);
        std::vector<float> expected(flat.padded_numel(), 0.0f);
        for (auto& e : flat.entries()) {
          auto v = ref_params.at(e.name).ToVector<float>();
          std::copy(v.begin(), v.end(), expected.begin() + e.offset);
        }
        EXPECT_EQ(0, std::memcmp(flat.shard().data<float>(), expected.data() + flat.shard_begin(),
                                 flat.shard_numel() * sizeof(float)))
            << "unit " << fsdp->unit_name(u) << " rank " << rank;
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    if (rank == 1) gpt.Materialize(kSeed);
    FsdpOptions options = PerBlock();
    options.sync_module_states = true;
    try {
      auto fsdp = FullyShard(gpt, pg, options);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const tensor::OpError& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "sync_module_states: rank 0's parameter '"))
          << e.what();
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A unit after the first failing in FullyShard (rank 0 lacks a value of the
// second Block) leaves no module with hooks: none points at the units freed
// with the constructor, and the model can be sharded again once it is whole.
TEST(FsdpTest, AUnitFailingInFullyShardLeavesNoHooks) {
  const mingpt::GptConfig c = Tiny();
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    gpt.Materialize(kSeed);
    nn::Parameter* dropped = nullptr;
    for (auto& [name, p] : gpt.NamedParameters()) {
      if (name == "transformer.h.1.attn.c_attn.weight") dropped = p;
    }
    ASSERT_NE(dropped, nullptr);
    if (rank == 0) dropped->value = tensor::Tensor();
    FsdpOptions options = PerBlock();
    options.sync_module_states = true;
    try {
      auto fsdp = FullyShard(gpt, pg, options);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const tensor::OpError& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "transformer.h.1.attn.c_attn.weight")) << e.what();
    }
    for (auto& [name, module] : gpt.NamedModules()) {
      EXPECT_EQ(module->hooks(), nullptr) << "rank " << rank << ": module '" << name << "'";
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// While FSDP holds a model, its parameters are FSDP's views: an optimizer
// stepping on them (optim::FromModule) would change nothing FSDP keeps, and
// is refused naming the unit; so is wrapping the model again. Once the
// wrapper is gone they are the module's again.
TEST(FsdpTest, AWrappedModelsParametersAreRefusedToAnOptimizerAndToASecondWrap) {
  const mingpt::GptConfig c = Tiny();
  absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
    mingpt::GPT gpt(c);
    auto fsdp = FullyShard(gpt, pg, PerBlock());
    const Tensor idx = Tensor::FromData<int64_t>(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
    gpt.ForwardBackward(idx, idx);
    const auto message = [&](const std::function<void()>& f) -> std::string {
      try {
        f();
      } catch (const tensor::OpError& e) {
        return e.what();
      }
      return "no error";
    };
    EXPECT_EQ(message([&] { optim::FromModule(gpt); }),
              "[FromModule] parameter 'transformer.wte.weight' is held by the FSDP root unit, "
              "whose optimizer steps on this rank's shards, not on the module's parameters "
              "(FSDP: FullyShardedModel::ParamRefs(); ZeRO-1: Zero1::Step())");
    EXPECT_TRUE(absl::StrContains(message([&] { optim::FromModule(*gpt.transformer()->blocks()); }),
                                  "'0.ln_1.weight' is held by FSDP unit 'transformer.h.0'"));
    EXPECT_EQ(message([&] { FullyShard(gpt, pg, PerBlock()); }),
              "[FullyShard] the root module is wrapped already (FullyShard, DDP or ZeRO-1 hooks "
              "on it): wrap a model once");
    // A wrapper of other modules over the same parameters: refused too.
    EXPECT_EQ(message([&] { FullyShard(*gpt.transformer()->blocks(), pg, FsdpOptions()); }),
              "[FullyShard] parameter '0.ln_1.weight' is held by FSDP unit 'transformer.h.0' "
              "already: wrap a model once");
    EXPECT_EQ(message([&] { Zero1 zero(gpt, pg, optim::SGD::Create({}).value()); }),
              "[zero1] parameter transformer.wte.weight is held by the FSDP root unit already: "
              "wrap a model once");
    // The module's state dict functions too: its values are the units'.
    EXPECT_TRUE(absl::StrContains(message([&] { nn::StateDict(gpt); }),
                                  "is held by the FSDP root unit: its value is the wrapper's"));
    mingpt::GPT other(c);
    other.Materialize(kSeed);
    const absl::Status loaded = nn::LoadStateDict(gpt, nn::StateDict(other));
    EXPECT_EQ(loaded.code(), absl::StatusCode::kFailedPrecondition) << loaded;
    fsdp.reset();
    for (auto& [name, p] : gpt.NamedParameters()) EXPECT_EQ(p->held_by, "") << name;
    EXPECT_EQ(message([&] { optim::FromModule(gpt); }), "no error");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A layer the forward skips: its parameters' gradients, in the unit's new
// unsharded gradient that no backward wrote, reach the shards as zeros (the
// unit zeroes the views still unwritten after its backward), not as what the
// new memory held. The memory is first filled with NaN and freed, for the
// allocator to hand back.
class SkipsSecond : public nn::Module {
 public:
  SkipsSecond() : Module("SkipsSecond") {
    first_ = RegisterModule("first", std::make_unique<nn::Linear>(8, 8));
    RegisterModule("second", std::make_unique<nn::Linear>(8, 8));
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    return first_->Run(in, ctx.Child(0));
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    return first_->RunBackward(grad, ctx.Child(0));
  }

 private:
  nn::Linear* first_;
};

TEST(FsdpUnreachedTest, ParametersTheBackwardSkipsGetZeroGradients) {
  ThreadWorld world(2);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    SkipsSecond m;
    FsdpOptions options;
    options.seed = kSeed;
    auto fsdp = FullyShard(m, pg, options);
    ASSERT_EQ(fsdp->num_units(), 1);
    const int64_t padded = fsdp->flat_param(0).padded_numel();
    for (int step = 0; step < 2; ++step) {
      { const Tensor nan = Tensor::Full({padded}, std::nan("")); }
      nn::Context ctx;
      const Tensor x = tensor::testing::RandomTensor({3, 8}, 10 + rank);
      m.Run(x, ctx);
      m.RunBackward(Tensor::Full({3, 8}, 1.0), ctx);
      for (const optim::ParamRef& ref : fsdp->ParamRefs()) {
        const std::vector<float> g = ref.grad.ToVector<float>();
        const FlatParameter& flat = fsdp->flat_param(0);
        for (const FlatParameter::Entry& e : flat.entries()) {
          const bool second = absl::StartsWith(e.name, "second.");
          // e's elements in this shard, in shard coordinates
          const int64_t lo = std::max(e.offset, flat.shard_begin()) - flat.shard_begin();
          const int64_t hi = std::min(e.offset + e.numel, flat.shard_end()) - flat.shard_begin();
          for (int64_t i = lo; i < hi; ++i) {
            ASSERT_TRUE(std::isfinite(g[i])) << e.name << " step " << step;
            if (second) {
              ASSERT_EQ(g[i], 0.0f) << e.name << " step " << step;
            }
          }
        }
        for (int64_t i = flat.numel() - flat.shard_begin(); i < flat.shard_numel(); ++i) {
          if (i >= 0) {
            ASSERT_EQ(g[i], 0.0f) << "padding";
          }
        }
      }
      fsdp->ZeroGrad();
    }
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A Linear run twice in a row, y = inner(inner(x)): as its own unit, its two
// backwards come back to back with no other unit's between.
class TwiceInARow : public nn::Module {
 public:
  TwiceInARow() : Module("TwiceInARow") {
    inner_ = RegisterModule("inner", std::make_unique<nn::Linear>(8, 8));
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    return inner_->Run(inner_->Run(in, ctx.Child(0)), ctx.Child(1));
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    return inner_->RunBackward(inner_->RunBackward(grad, ctx.Child(1)), ctx.Child(0));
  }

 private:
  nn::Linear* inner_;
};

// Each backward of the unit reduces its gradient, and the second waits for
// the first: both reach the shard (the second used to be issued over the
// first, which was lost, and the unit then finished a reduce twice: a crash).
TEST(FsdpRunTwiceTest, AUnitRunTwiceInARowGetsBothGradients) {
  constexpr int kWorld = 2;
  constexpr int64_t kRows = 4;
  const Tensor x = tensor::testing::RandomTensor({kRows, 8}, 21);
  // One process on every row: the reference flat gradient, in entry order.
  TwiceInARow ref;
  ref.Materialize(kSeed);
  {
    nn::Context ctx;
    ref.Run(x, ctx);
    ref.RunBackward(Tensor::Full({kRows, 8}, 1.0 / kRows), ctx);
  }
  std::map<std::string, std::vector<float>> want;
  for (auto& [name, p] : ref.NamedParameters()) want[name] = p->grad.ToVector<float>();

  // HYBRID_SHARD with shard groups of 1: the first run's all-reduce over the
  // replicas finishes before the second run's reduce is issued.
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard,
                                    ShardingStrategy::kHybridShard}) {
    SCOPED_TRACE(ShardingStrategyName(strategy));
    ThreadWorld world(kWorld);
    absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
      TwiceInARow m;
      FsdpOptions options;
      options.seed = kSeed;
      options.strategy = strategy;
      options.hybrid_shard_group_size = IsHybrid(strategy) ? 1 : 0;
      options.policy = WrapPolicy::Transformer({"Linear"});
      auto fsdp = FullyShard(m, pg, options);
      ASSERT_EQ(fsdp->num_units(), 2);  // the root (no parameters) and inner
      nn::Context ctx;
      const int64_t B = kRows / kWorld;
      m.Run(x.Narrow(0, rank * B, B).Contiguous(), ctx);
      m.RunBackward(Tensor::Full({B, 8}, 1.0 / kRows * kWorld), ctx);  // local mean
      for (int u = 0; u < fsdp->num_units(); ++u) {
        const FlatParameter& flat = fsdp->flat_param(u);
        if (flat.numel() == 0) continue;
        const std::vector<float> got = flat.grad_shard().ToVector<float>();
        for (const FlatParameter::Entry& e : flat.entries()) {
          const int64_t lo = std::max(e.offset, flat.shard_begin());
          const int64_t hi = std::min(e.offset + e.numel, flat.shard_end());
          for (int64_t i = lo; i < hi; ++i) {
            ASSERT_NEAR(got[i - flat.shard_begin()], want.at(e.name)[i - e.offset], 1e-6)
                << e.name << " element " << i - e.offset << " rank " << rank;
          }
        }
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// A root that also reads its child Linear's weight W (8, 8) itself, as a
// tied head reads an embedding: out = inner(x) W^T (the read after inner's,
// so its backward writes W's gradient before inner's backward), or
// out = inner(x W^T) (after inner's backward).
class ReadsInnerWeight : public nn::Module {
 public:
  explicit ReadsInnerWeight(bool after) : Module("ReadsInnerWeight"), after_(after) {
    inner_ = RegisterModule("inner", std::make_unique<nn::Linear>(8, 8));
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    tensor::MatmulOptions trans_b;
    trans_b.trans_b = true;
    const Tensor& w = inner_->weight()->value;  // (8, 8)
    if (after_) {
      const Tensor h = inner_->Run(in, ctx.Child(0)).at(0);  // (rows, 8)
      ctx.Save(h);
      return {tensor::Matmul(h, w, trans_b)};
    }
    ctx.Save(in.at(0));
    return {inner_->Run(tensor::Matmul(in.at(0), w, trans_b), ctx.Child(0))};
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    const Tensor input = ctx.Saved<Tensor>();  // the matmul's (rows, 8)
    tensor::MatmulOptions trans_a;
    trans_a.trans_a = true;
    auto through_w = [&](const Tensor& g) {  // dW += g^T input; returns g W
      const nn::Parameter::GradSink sink = inner_->weight()->GradToWrite();
      tensor::MatmulInto(g, input, sink.grad, trans_a, sink.accumulate ? 1.0f : 0.0f);
      return tensor::Matmul(g, inner_->weight()->value);
    };
    if (after_) return {inner_->RunBackward(through_w(grad.at(0)), ctx.Child(0))};
    return {through_w(inner_->RunBackward(grad, ctx.Child(0)).at(0))};
  }

 private:
  const bool after_;
  nn::Linear* inner_;
};

// A parameter of one unit used by a module outside it (a tied weight left
// in another unit than its head) would lose that module's gradient without
// a word: its unit's backward replaced the gradient written before it, and
// one written after it was never reduced. Both are an error naming it
// (strategies that keep the weight gathered for the outside read: with
// FULL_SHARD it is already freed, and Linear's own check names that).
TEST(FsdpTiedOutsideTest, AGradientWrittenOutsideTheUnitIsAnError) {
  for (bool after : {true, false}) {
    for (ShardingStrategy strategy : {ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
      // (Read before inner's forward, W is gathered only under NO_SHARD.)
      if (!after && strategy != ShardingStrategy::kNoShard) continue;
      SCOPED_TRACE(absl::StrCat(ShardingStrategyName(strategy), after ? ", read after" : ""));
      ThreadWorld world(2);
      absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
        ReadsInnerWeight m(after);
        FsdpOptions options;
        options.seed = kSeed;
        options.strategy = strategy;
        options.policy = WrapPolicy::Transformer({"Linear"});
        auto fsdp = FullyShard(m, pg, options);
        ASSERT_EQ(fsdp->num_units(), 2);
        nn::Context ctx;
        ASSERT_NO_THROW(m.Run(tensor::testing::RandomTensor({3, 8}, 10 + rank), ctx));
        try {
          m.RunBackward(Tensor::Full({3, 8}, 1.0), ctx);
          ADD_FAILURE() << "the outside gradient was taken silently";
        } catch (const tensor::OpError& e) {
          EXPECT_TRUE(absl::StrContains(
              e.what(), absl::StrCat("unit 'inner': inner.weight has a gradient ",
                                     after ? "before" : "after", " the unit's backward")))
              << e.what();
        }
        // The step is dropped and the next one runs (and throws alike).
        fsdp->ZeroGrad();
        nn::Context again;
        ASSERT_NO_THROW(m.Run(tensor::testing::RandomTensor({3, 8}, 20 + rank), again));
        EXPECT_THROW(m.RunBackward(Tensor::Full({3, 8}, 1.0), again), tensor::OpError);
        fsdp->ZeroGrad();
      });
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

// A unit's backward that throws (a wrong gradient shape) leaves its
// parameters' gradient views behind (its PostBackward never runs): ZeroGrad
// drops them, so the next step's backward does not take them for gradients
// written outside the unit.
TEST(FsdpTiedOutsideTest, ZeroGradDropsTheViewsABackwardThatThrewLeft) {
  ThreadWorld world(2);
  absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
    MaybeSkips m(8);
    FsdpOptions options;
    options.seed = kSeed;
    options.policy = WrapPolicy::Transformer({"Linear"});
    auto fsdp = FullyShard(m, pg, options);
    nn::Context ctx;
    m.Run(tensor::testing::RandomTensor({3, 8}, 10 + rank), ctx);
    EXPECT_THROW(m.RunBackward(Tensor::Full({3, 5}, 1.0), ctx), tensor::OpError);
    fsdp->ZeroGrad();
    nn::Context next;
    m.Run(tensor::testing::RandomTensor({3, 8}, 20 + rank), next);
    EXPECT_NO_THROW(m.RunBackward(Tensor::Full({3, 8}, 1.0), next));
  });
  EXPECT_TRUE(s.ok()) << s;
}

// One forward and backward of `m` on random (rows, d) inputs (this rank's:
// seed + rank) and output gradients (seed + 7, the same on every rank).
void RandomBackward(nn::Module& m, int64_t rows, int64_t d, int seed, int rank) {
  nn::Context ctx;
  m.Run(tensor::testing::RandomTensor({rows, d}, seed + rank), ctx);
  m.RunBackward(tensor::testing::RandomTensor({rows, d}, seed + 7), ctx);
}

// Every parameter of `m` gathered whole (collective: every rank calls it),
// in NamedParameters order as one vector.
std::vector<float> GatheredParameters(FullyShardedModel& fsdp, nn::Module& m) {
  fsdp.Unshard();
  std::vector<float> all;
  for (const auto& [name, p] : m.NamedParameters()) {
    const std::vector<float> v = p->value.ToVector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  fsdp.Reshard();
  return all;
}

// FSDP trains alike whether ZeroGrad zeroes the gradient shards or drops them
// (set_to_none: the next reduce writes each), and whether the model is one
// unit or a unit per Linear (a root with no parameter of its own), bit for
// bit: with a step whose forward skips the second Linear (as its own unit, no
// reduce reaches its dropped shard: ParamRefs zeroes it) and a step of two
// micro-batches (the first under no_sync). Fails if a dropped shard is added
// to, or read before it is written or zeroed, or if a reduce is still in
// flight when the backward returns (the root without parameters used to leave
// the last one pending past the optimizer's step).
TEST(FsdpDroppedGradTest, DroppedShardsTrainAsZeroedOnes) {
  constexpr int64_t kD = 8, kRows = 4;
  std::vector<float> params[2][2];  // [wrap][drop]: rank 0's final parameters, gathered
  for (bool wrap : {false, true}) {
    for (bool drop : {false, true}) {
      SCOPED_TRACE(absl::StrCat(wrap ? "a unit per Linear" : "one unit", drop ? ", dropped" : ""));
      ThreadWorld world(2);
      absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
        MaybeSkips m(kD);
        FsdpOptions options;
        options.seed = kSeed;
        if (wrap) options.policy = WrapPolicy::Transformer({"Linear"});
        auto fsdp = FullyShard(m, pg, options);
        ASSERT_EQ(fsdp->num_units(), wrap ? 3 : 1);
        auto opt = optim::SGD::Create(Sgd()).value();
        auto backward = [&](int seed) { RandomBackward(m, kRows, kD, seed, rank); };
        const bool uses[] = {true, false, true, true};
        for (int step = 0; step < 4; ++step) {
          m.use_second = uses[step];
          if (step == 3) {
            auto no_sync = fsdp->no_sync();
            backward(100);
          }
          backward(10 * step);
          if (drop && wrap && step == 1) {  // the skipped unit: not written yet
            ASSERT_EQ(fsdp->unit_name(2), "second");
            ASSERT_TRUE(fsdp->flat_param(2).grad_shard_unwritten());
          }
          opt->Step(fsdp->ParamRefs());
          for (int u = 0; u < fsdp->num_units(); ++u) {
            ASSERT_FALSE(fsdp->flat_param(u).grad_shard_unwritten()) << "unit " << u;
          }
          fsdp->ZeroGrad(drop);
          for (int u = 0; u < fsdp->num_units(); ++u) {
            const FlatParameter& flat = fsdp->flat_param(u);
            EXPECT_EQ(flat.grad_shard_unwritten(), drop && flat.trains()) << "unit " << u;
          }
        }
        const std::vector<float> gathered = GatheredParameters(*fsdp, m);
        if (rank == 0) params[wrap][drop] = gathered;
      });
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  ASSERT_EQ(params[0][0].size(), static_cast<size_t>(2 * (kD * kD + kD)));
  EXPECT_EQ(params[0][1], params[0][0]) << "one unit, dropped";
  EXPECT_EQ(params[1][0], params[0][0]) << "a unit per Linear";
  EXPECT_EQ(params[1][1], params[0][0]) << "a unit per Linear, dropped";
}

// A backward that throws after the second unit's reduce-scatter was issued
// leaves it in flight: ZeroGrad finishes it before zeroing (or dropping) the
// shards, so the next step trains exactly as if the failed backward had never
// run (before, its reduction was added into the next step's gradients).
TEST(FsdpAbandonedBackwardTest, ZeroGradFinishesItsReductionsAndTheNextStepIsClean) {
  constexpr int64_t kD = 8, kRows = 4;
  for (bool drop : {false, true}) {
    std::vector<float> params[2];  // [abandoned]: rank 0's final parameters, gathered
    for (bool abandoned : {false, true}) {
      SCOPED_TRACE(absl::StrCat(abandoned ? "abandoned" : "clean", drop ? ", dropped" : ""));
      ThreadWorld world(2);
      absl::Status s = RunRanks(world, [&](int rank, ProcessGroup& pg) {
        MaybeSkips m(kD);
        FsdpOptions options;
        options.seed = kSeed;
        options.policy = WrapPolicy::Transformer({"Linear"});
        auto fsdp = FullyShard(m, pg, options);
        auto opt = optim::SGD::Create(Sgd()).value();
        auto backward = [&](int seed) { RandomBackward(m, kRows, kD, seed, rank); };
        for (int step = 0; step < 3; ++step) {
          if (abandoned && step == 2) {
            m.stop_in_backward = true;
            EXPECT_THROW(backward(1000), tensor::OpError);
            m.stop_in_backward = false;
            fsdp->ZeroGrad(drop);
          }
          backward(10 * step);
          opt->Step(fsdp->ParamRefs());
          fsdp->ZeroGrad(drop);
        }
        const std::vector<float> gathered = GatheredParameters(*fsdp, m);
        if (rank == 0) params[abandoned] = gathered;
      });
      ASSERT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(params[1], params[0]) << (drop ? "dropped" : "zeroed");
  }
}

// ---- Training parity ----
// Tolerance: |fsdp - single| <= 1e-5 + 1e-5 * |single| for every loss, every
// gradient norm and every final parameter (the ranks sum their halves of the
// batch in another order, so results are not bitwise).

using ParityParam = std::tuple<ShardingStrategy, int, bool>;  // strategy, world, auto-wrap

class FsdpParityTest : public ::testing::TestWithParam<ParityParam> {};

TEST_P(FsdpParityTest, FiveStepsMatchOneProcessOnTheGlobalBatch) {
  const auto [strategy, world, auto_wrap] = GetParam();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 8);
  const RunResult want = SingleProcess(c, idx, tgt);
  // The run must move the parameters and clip: otherwise it proves little.
  ASSERT_GT(want.losses.front() - want.losses.back(), 1e-3);
  ASSERT_GT(want.norms.front(), kClip);
  const RunResult got = Sharded(c, idx, tgt, world, strategy,
                                auto_wrap ? WrapPolicy::Transformer({"Block", "T5Block"})
                                          : WrapPolicy::None());
  ExpectSameTraining(got, want);
}

INSTANTIATE_TEST_SUITE_P(
    All, FsdpParityTest,
    ::testing::Combine(::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                         ShardingStrategy::kNoShard),
                       ::testing::Values(1, 2, 3, 4), ::testing::Bool()),
    [](const ::testing::TestParamInfo<ParityParam>& info) {
      return std::string(ShardingStrategyName(std::get<0>(info.param))) + "_world" +
             std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_blocks" : "_none");
    });

TEST(FsdpParityTest, NestedSizeBasedUnitsMatchToo) {
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 8);
  const RunResult want = SingleProcess(c, idx, tgt);
  ExpectSameTraining(Sharded(c, idx, tgt, 3, ShardingStrategy::kFullShard, WrapPolicy::SizeBased(300)),
                     want);
}

// ---- Mixed precision ----
// bf16 FULL_SHARD (transformer wrap) against one process running
// nn::MixedPrecision(Bf16) on the global batch. Not bitwise: the per-rank
// gradients are rounded to bf16 before they are averaged (reduce_dtype bf16;
// one process rounds nothing: its gradients accumulate fp32), and each rank's
// bf16 matmuls see a different batch split, so sums round differently. bf16
// keeps 8 significant bits (relative step 2^-8 = 3.9e-3). Measured over 5
// steps: losses within 3.5e-5 (world 2) / 1.2e-4 (world 3) relative, fp32
// master parameters within 2.4e-4 / 6.6e-4 absolute. Asserted with ~15x
// margin: losses 2e-3 relative, clip norms 2e-2 relative, parameters
// 2e-3 absolute + 2e-2 relative.
class FsdpMixedPrecisionTest : public ::testing::TestWithParam<int> {};

TEST_P(FsdpMixedPrecisionTest, Bf16FullShardMatchesOneProcessMixedPrecision) {
  const int world = GetParam();
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 8);
  const auto mp = precision::MixedPrecisionPolicy::Bf16();
  const RunResult want = SingleProcess(c, idx, tgt, mp);
  ASSERT_GT(want.losses.front() - want.losses.back(), 1e-3);
  // bf16 really differs from fp32 (else the test proves nothing about the casts).
  const RunResult fp32 = SingleProcess(c, idx, tgt);
  EXPECT_NE(want.losses.back(), fp32.losses.back());
  const RunResult got = Sharded(c, idx, tgt, world, ShardingStrategy::kFullShard,
                                WrapPolicy::Transformer({"Block"}), mp);
  ExpectCloseTraining(got, want);
  double max_loss_rel = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    max_loss_rel = std::max(max_loss_rel, std::abs(got.losses[i] - want.losses[i]) / want.losses[i]);
  }
  double max_param_abs = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    const auto a = got.params[i].second.ToVector<float>();
    const auto b = want.params[i].second.ToVector<float>();
    for (size_t j = 0; j < a.size(); ++j) max_param_abs = std::max(max_param_abs, double(std::abs(a[j] - b[j])));
  }
  std::printf("world %d: max loss rel diff %.3g, max param abs diff %.3g\n", world, max_loss_rel,
              max_param_abs);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FsdpMixedPrecisionTest, ::testing::Values(2, 3));

// The other strategies' mixed paths (NO_SHARD: bf16 copies of the full shard,
// all-reduce in bf16) and a kept-fp32 class (LayerNorm: units gathered fp32).
TEST(FsdpMixedPrecisionTest, Bf16OtherStrategiesAndKeptFp32ClassesMatchToo) {
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 8);
  const WrapPolicy wrap = WrapPolicy::Transformer({"Block"});
  const auto mp = precision::MixedPrecisionPolicy::Bf16();
  const RunResult want = SingleProcess(c, idx, tgt, mp);
  ExpectCloseTraining(Sharded(c, idx, tgt, 2, ShardingStrategy::kNoShard, wrap, mp), want);
  ExpectCloseTraining(Sharded(c, idx, tgt, 3, ShardingStrategy::kShardGradOp, wrap, mp), want);
  auto keep_ln = mp;
  keep_ln.fp32_module_classes = {"LayerNorm"};
  const RunResult want_ln = SingleProcess(c, idx, tgt, keep_ln);
  ExpectCloseTraining(Sharded(c, idx, tgt, 3, ShardingStrategy::kFullShard, wrap, keep_ln), want_ln);
  // Whole blocks kept (their attention, MLP and norms): units gathered fp32.
  auto keep_block = mp;
  keep_block.fp32_module_classes = {"Block"};
  const RunResult want_block = SingleProcess(c, idx, tgt, keep_block);
  ExpectCloseTraining(Sharded(c, idx, tgt, 3, ShardingStrategy::kFullShard, wrap, keep_block),
                      want_block);
}

TEST(FsdpMixedPrecisionTest, Fp32PolicyIsBitwiseTheDefault) {
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(kGlobalBatch, c.block_size, c.vocab_size, 8);
  const WrapPolicy wrap = WrapPolicy::Transformer({"Block"});
  const RunResult a = Sharded(c, idx, tgt, 3, ShardingStrategy::kFullShard, wrap);
  const RunResult b = Sharded(c, idx, tgt, 3, ShardingStrategy::kFullShard, wrap,
                              precision::MixedPrecisionPolicy::Fp32());
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.norms, b.norms);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_EQ(a.params[i].second.ToVector<float>(), b.params[i].second.ToVector<float>())
        << a.params[i].first;
  }
}

// Values are bf16 views while unsharded; shards and gradients stay fp32;
// parameters of kept-fp32 module classes get fp32 values.
TEST(FsdpMixedPrecisionTest, ComputeValuesAreBf16ShardsAndGradsFp32) {
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(4, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(4, c.block_size, c.vocab_size, 8);
  // Kept: nothing, the LayerNorms, or whole Blocks (every module inside them).
  for (const char* keep : {"", "LayerNorm", "Block"}) {
    SCOPED_TRACE(keep);
    auto mp = precision::MixedPrecisionPolicy::Bf16();
    if (*keep != 0) mp.fp32_module_classes = {keep};
    ThreadWorld thread_world(2);
    absl::Status s = RunRanks(thread_world, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      // SHARD_GRAD_OP keeps every unit unsharded after forward.
      FsdpOptions options = PerBlock(ShardingStrategy::kShardGradOp);
      options.mixed_precision = mp;
      auto fsdp = FullyShard(gpt, pg, options);
      gpt.Loss(idx, tgt);
      for (auto& [name, p] : gpt.NamedParameters()) {
        ASSERT_TRUE(p->value.defined()) << name;
        const bool fp32 =
            (std::string(keep) == "LayerNorm" && name.find(".ln_") != std::string::npos) ||
            (std::string(keep) == "Block" && name.find(".h.") != std::string::npos);
        EXPECT_EQ(p->value.dtype(), fp32 ? tensor::Dtype::kF32 : tensor::Dtype::kBF16) << name;
      }
      fsdp->ZeroGrad();
      gpt.ForwardBackward(idx, tgt);
      double grad_sq = 0;
      for (int u = 0; u < fsdp->num_units(); ++u) {
        EXPECT_EQ(fsdp->flat_param(u).shard().dtype(), tensor::Dtype::kF32);
        EXPECT_EQ(fsdp->flat_param(u).grad_shard().dtype(), tensor::Dtype::kF32);
        for (float g : fsdp->flat_param(u).grad_shard().ToVector<float>()) grad_sq += double(g) * g;
      }
      EXPECT_GT(grad_sq, 0.0);
      for (auto& [name, p] : gpt.NamedParameters()) EXPECT_FALSE(p->grad.defined()) << name;
    });
    ASSERT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace dist
