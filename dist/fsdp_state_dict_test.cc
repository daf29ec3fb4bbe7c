// FullyShardedModel's state dicts: FullStateDict holds the buffers after the
// parameters (and ZeRO-1's too), LoadFullStateDict loads a whole state dict
// after wrapping (every rank agreeing first), and a unit named "root" is
// refused (its optimizer state name is the root unit's).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dist/fsdp.h"
#include "dist/fsdp_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/linear.h"
#include "nn/state_dict.h"
#include "optim/sgd.h"
#include "tensor/error.h"
#include "tensor/testing.h"

namespace dist {
namespace {

using tensor::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using namespace dist::testing;  // NOLINT: the shared fixtures

// A unit named "root" would share the root unit's optimizer state name
// ("fsdp.root"): refused when wrapping, naming it.
class HasAChildNamedRoot : public nn::Module {
 public:
  HasAChildNamedRoot() : Module("HasAChildNamedRoot") {
    RegisterModule("root", std::make_unique<nn::Linear>(8, 8));
    RegisterParameter("scale", {8}, nn::InitSpec::Ones());
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context&) override { return in; }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context&) override { return grad; }
};

TEST(FsdpTest, AUnitNamedRootIsRefused) {
  absl::Status s = RunRanks(1, [&](int, ProcessGroup& pg) {
    HasAChildNamedRoot m;
    FsdpOptions options;
    options.policy = WrapPolicy::Transformer({"Linear"});
    try {
      FullyShard(m, pg, options);
      ADD_FAILURE() << "wrapped";
    } catch (const tensor::OpError& e) {
      EXPECT_EQ(std::string(e.what()),
                "[FullyShard] a unit is named 'root', as the root unit's optimizer state is "
                "(\"fsdp.root\"): rename that module");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// FullStateDict holds the buffers too (rank 0's BatchNorm statistics), after
// the parameters, as nn::StateDict: an unwrapped model loads it whole; and
// ZeRO-1's the same.
TEST(FsdpTest, FullStateDictHoldsTheBuffers) {
  for (bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "ZeRO-1" : "FSDP");
    absl::Status s = RunRanks(2, [&](int rank, ProcessGroup& pg) {
      nn::Sequential net;
      net.Append(std::make_unique<nn::Linear>(4, 3));
      auto* bn = net.Append(std::make_unique<nn::BatchNorm1d>(3));
      net.Materialize(kSeed);
      std::unique_ptr<FullyShardedModel> fsdp;
      std::unique_ptr<Zero1> zero;
      if (zero1) {
        zero = std::make_unique<Zero1>(net, pg, optim::SGD::Create({}).value());
      } else {
        fsdp = FullyShard(net, pg, FsdpOptions());
      }
      nn::Context ctx;
      net.Run(tensor::testing::RandomTensor({6, 4}, 10 + rank), ctx);  // statistics move
      const NamedTensors full = zero1 ? zero->FullStateDict() : fsdp->FullStateDict();
      if (rank != 0) return;
      nn::Sequential plain;
      plain.Append(std::make_unique<nn::Linear>(4, 3));
      plain.Append(std::make_unique<nn::BatchNorm1d>(3));
      plain.Materialize(kSeed + 1);
      ASSERT_EQ(full.size(), nn::StateDict(plain).size());
      const absl::Status loaded = nn::LoadStateDict(plain, full);
      ASSERT_TRUE(loaded.ok()) << loaded;
      const auto mine = bn->NamedBuffers();
      const auto theirs = plain.NamedModules()[2].second->NamedBuffers();
      ASSERT_EQ(mine.size(), theirs.size());
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_EQ(mine[i].second->To(tensor::Dtype::kF32).ToVector<float>(),
                  theirs[i].second->To(tensor::Dtype::kF32).ToVector<float>())
            << mine[i].first;
      }
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// LoadFullStateDict: a one-process model's state dict, loaded after
// wrapping (every rank the whole), gives back that state from FullStateDict
// and the one-process model's loss; a unit held unsharded is freed, so the
// loaded values are gathered. Bad state dicts change nothing.
TEST(FsdpTest, LoadFullStateDictLoadsTheWholeModelIntoTheShards) {
  const mingpt::GptConfig c = Tiny();
  const Tensor idx = RandomIds(2, c.block_size, c.vocab_size, 7);
  const Tensor tgt = RandomIds(2, c.block_size, c.vocab_size, 8);
  mingpt::GPT ref(c);
  ref.Materialize(kSeed + 3);
  const NamedTensors want = nn::StateDict(ref);
  const double want_loss = ref.Loss(idx, tgt);
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    absl::Status s = RunRanks(3, [&](int rank, ProcessGroup& pg) {
      mingpt::GPT gpt(c);
      auto fsdp = FullyShard(gpt, pg, PerBlock(strategy));
      fsdp->Unshard();  // held: the load frees it
      NamedTensors bad = want;
      bad[1].second = Tensor::Zeros({3});
      const NamedTensors before = fsdp->FullStateDict();
      absl::Status refused = fsdp->LoadFullStateDict(bad);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(
          refused.message(),
          absl::StrCat("LoadFullStateDict: state dict entry '", want[1].first, "' has shape (3)")))
          << refused;
      bad = want;
      bad.pop_back();
      EXPECT_TRUE(
          absl::StrContains(fsdp->LoadFullStateDict(bad).message(),
                            "LoadFullStateDict: state dict lacks 1 entries: " + want.back().first));
      bad = want;
      bad.emplace_back("extra.weight", Tensor::Zeros({1}));
      EXPECT_EQ(fsdp->LoadFullStateDict(bad).message(),
                "LoadFullStateDict: state dict has entries the model lacks: extra.weight");
      // One rank's refusal: every rank fails, nothing loaded anywhere.
      const absl::Status one = fsdp->LoadFullStateDict(rank == 1 ? bad : want);
      if (rank == 1) {
        EXPECT_EQ(one.code(), absl::StatusCode::kInvalidArgument) << one;
      } else {
        EXPECT_EQ(one.message(), "LoadFullStateDict: rank(s) 1 refused the state dict (see their "
                                 "errors): nothing was loaded");
      }
      const NamedTensors unchanged = fsdp->FullStateDict();
      if (rank == 0) {
        for (size_t i = 0; i < before.size(); ++i) {
          EXPECT_EQ(before[i].second.ToVector<float>(), unchanged[i].second.ToVector<float>());
        }
      }
      fsdp->Unshard();
      const absl::Status loaded = fsdp->LoadFullStateDict(want);
      ASSERT_TRUE(loaded.ok()) << loaded;
      const NamedTensors got = fsdp->FullStateDict();
      if (rank == 0) {
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(got[i].first, want[i].first);
          EXPECT_EQ(got[i].second.ToVector<float>(), want[i].second.ToVector<float>())
              << want[i].first;
        }
      }
      EXPECT_NEAR(gpt.Loss(idx, tgt), want_loss, 1e-5);
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace dist
