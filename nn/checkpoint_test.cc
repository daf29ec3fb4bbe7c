// Activation checkpointing: gradients bitwise equal to the plain run (with
// dropout active, over several steps, nested), side effects (BatchNorm running
// statistics) applied once, IsRecomputing only during the recompute, and the
// memory ledger showing the activations saved between forward and backward.
#include "nn/checkpoint.h"

#include "nn/attention.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/dropout.h"
#include "nn/feed_forward.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "tensor/error.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace nn {
namespace {

using tensor::MemoryCategory;
using tensor::MemoryLedger;
using tensor::testing::AllClose;
using tensor::testing::RandomTensor;

// A pre-norm transformer-style block: x + FFN(LN(x)) (GPT-2 FFN with its own
// dropout), then a dropout. Children "0" (Residual) and "1" (Dropout).
std::unique_ptr<Module> Block(int64_t d, float p) {
  auto branch = std::make_unique<Sequential>();
  branch->Append(std::make_unique<LayerNorm>(d));
  branch->Append(std::make_unique<FeedForward>(d, 4 * d, FeedForwardOptions::Gpt2(4, p)));
  auto block = std::make_unique<Sequential>();
  block->Append(std::make_unique<Residual>(std::move(branch)));
  block->Append(std::make_unique<Dropout>(p));
  return block;
}

std::unique_ptr<Sequential> Stack(int layers, int64_t d, float p) {
  auto stack = std::make_unique<Sequential>();
  for (int i = 0; i < layers; ++i) stack->Append(Block(d, p));
  stack->Materialize(/*seed=*/1);
  SeedRandomSources(*stack, /*seed=*/2);
  return stack;
}

bool TopLevel(const std::string& name, Module&) {
  return !name.empty() && name.find('.') == std::string::npos;
}

// Runs `steps` forward/backward steps on both models and expects outputs,
// input gradients and parameter gradients to be bitwise equal.
void ExpectSameTraining(Module& plain, Module& ckpt, const tensor::Shape& shape, int steps) {
  for (int step = 0; step < steps; ++step) {
    const Tensor x = RandomTensor(shape, 100 + step);
    const Tensor g = RandomTensor(shape, 200 + step);
    plain.ZeroGrad();
    ckpt.ZeroGrad();
    Context c_plain, c_ckpt;
    Tensor y_plain = plain.Run(x, c_plain);
    Tensor y_ckpt = ckpt.Run(x, c_ckpt);
    EXPECT_TRUE(AllClose(y_ckpt, y_plain, 0, 0)) << "step " << step;
    Tensor gx_plain = plain.RunBackward(g, c_plain);
    Tensor gx_ckpt = ckpt.RunBackward(g, c_ckpt);
    EXPECT_TRUE(AllClose(gx_ckpt, gx_plain, 0, 0)) << "step " << step;
    auto p_plain = plain.NamedParameters();
    auto p_ckpt = ckpt.NamedParameters();
    ASSERT_EQ(p_plain.size(), p_ckpt.size());
    for (size_t i = 0; i < p_plain.size(); ++i) {
      ASSERT_EQ(p_plain[i].first, p_ckpt[i].first);  // names unchanged
      EXPECT_TRUE(AllClose(p_ckpt[i].second->grad, p_plain[i].second->grad, 0, 0))
          << "step " << step << " " << p_plain[i].first;
    }
  }
}

TEST(CheckpointTest, GradientsBitwiseEqualWithDropout) {
  auto plain = Stack(3, 8, 0.2f);
  auto ckpt = Stack(3, 8, 0.2f);
  EXPECT_EQ(ApplyCheckpointing(*ckpt, TopLevel), 3);
  ExpectSameTraining(*plain, *ckpt, {2, 5, 8}, /*steps=*/3);
  // Dropout really ran (counters consumed), and the recompute left every
  // generator where the plain run's is.
  auto m_plain = plain->NamedModules();
  auto m_ckpt = ckpt->NamedModules();
  int sources = 0;
  for (size_t i = 0; i < m_plain.size(); ++i) {
    if (auto* d = dynamic_cast<Dropout*>(m_plain[i].second)) {
      ++sources;
      EXPECT_GT(d->generator().offset(), 0u);
      EXPECT_EQ(dynamic_cast<Dropout*>(m_ckpt[i].second)->generator().offset(),
                d->generator().offset())
          << m_plain[i].first;
    }
  }
  EXPECT_EQ(sources, 6);
}

TEST(CheckpointTest, NestedCheckpointingIsStillExact) {
  auto plain = Stack(2, 8, 0.2f);
  auto ckpt = Stack(2, 8, 0.2f);
  // The blocks, and inside each block its residual branch.
  EXPECT_EQ(ApplyCheckpointing(*ckpt,
                               [](const std::string& name, Module& m) {
                                 return TopLevel(name, m) || m.class_name() == "Residual";
                               }),
            4);
  ExpectSameTraining(*plain, *ckpt, {3, 8}, /*steps=*/2);
}

// A model seeded for part k of K of a batch drops what one forward over the
// whole batch drops in those rows: two dropouts in a row, rows of 8 and 36
// elements (one counter per 4 elements: exact), for every part.
TEST(SeedRandomSourcesTest, BatchPartsDrawTheWholeBatchsMasksForTheirRows) {
  auto make = [] {
    auto m = std::make_unique<Sequential>();
    m->Append(std::make_unique<Dropout>(0.5f));
    m->Append(std::make_unique<Dropout>(0.5f));
    return m;
  };
  for (int64_t row : {8, 36}) {
    SCOPED_TRACE(row);
    constexpr int64_t kParts = 3, kRows = 2;  // rows per part
    const tensor::Tensor x = RandomTensor({kParts * kRows, row}, 4);
    auto whole = make();
    SeedRandomSources(*whole, 11);
    Context ctx;
    const std::vector<float> want = whole->Run(x, ctx).ToVector<float>();
    for (int64_t k = 0; k < kParts; ++k) {
      auto part = make();
      SeedRandomSources(*part, 11, k, kParts);
      Context part_ctx;
      const std::vector<float> got =
          part->Run(x.Narrow(0, k * kRows, kRows).Contiguous(), part_ctx).ToVector<float>();
      ASSERT_EQ(got.size(), static_cast<size_t>(kRows * row));
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], want[k * kRows * row + i]) << "part " << k << " element " << i;
      }
    }
  }
  Sequential m;
  EXPECT_THROW(SeedRandomSources(m, 1, 2, 2), tensor::OpError);
}

TEST(CheckpointTest, BatchNormRunningStatsUpdatedOnce) {
  auto make = [] {
    auto block = std::make_unique<Sequential>();
    block->Append(std::make_unique<Linear>(4, 4));
    block->Append(std::make_unique<BatchNorm1d>(4));
    auto stack = std::make_unique<Sequential>();
    stack->Append(std::move(block));
    stack->Materialize(3);
    return stack;
  };
  auto plain = make();
  auto ckpt = make();
  ckpt->set_checkpointed(0, true);
  ExpectSameTraining(*plain, *ckpt, {6, 4}, /*steps=*/2);
  auto b_plain = plain->NamedBuffers();
  auto b_ckpt = ckpt->NamedBuffers();
  ASSERT_EQ(b_plain.size(), 3u);
  for (size_t i = 0; i < b_plain.size(); ++i) {
    EXPECT_TRUE(AllClose(*b_ckpt[i].second, *b_plain[i].second, 0, 0)) << b_plain[i].first;
  }
  EXPECT_EQ(b_ckpt[2].second->Item(), 2.0);  // num_batches_tracked: 2 steps, not 4
}

// Records IsRecomputing() and RecomputeRoot() at each forward; the identity
// otherwise.
class Probe : public Module {
 public:
  Probe() : Module("Probe") {}
  std::vector<bool> seen;
  std::vector<const Module*> roots;

 protected:
  Tensors Forward(const Tensors& in, Context& ctx) override {
    seen.push_back(IsRecomputing());
    roots.push_back(RecomputeRoot());
    ctx.Save(0);
    return in;
  }
  Tensors Backward(const Tensors& g, Context& ctx) override {
    ctx.Saved<int>();  // the recomputed context is the one given to the backward
    return g;
  }
};

TEST(CheckpointTest, IsRecomputingOnlyDuringTheRecompute) {
  Probe probe;
  const Tensor x = RandomTensor({2}, 1);
  Context ctx;
  Tensor y = CheckpointedRun(probe, x, ctx);
  EXPECT_TRUE(y.SharesStorageWith(x));
  EXPECT_EQ(probe.seen, (std::vector<bool>{false}));
  CheckpointedRunBackward(probe, x, ctx);
  EXPECT_EQ(probe.seen, (std::vector<bool>{false, true}));
  EXPECT_EQ(probe.roots, (std::vector<const Module*>{nullptr, &probe}));
  EXPECT_FALSE(IsRecomputing());
  EXPECT_EQ(RecomputeRoot(), nullptr);
  EXPECT_FALSE(ctx.has_saved());  // cleared
}

// Activations held between forward and backward, for 4 blocks of d = 64
// (hidden 256) on x (8, 32, 64), f32. Measured with the ledger:
//   plain:        2,629,632 bytes after forward = 4 x 657,408 per block: LN
//                 mean/rstd (2 KiB), LN output kept as c_fc's input (64 KiB),
//                 pre-activation (256 KiB), GELU output kept by c_proj
//                 (256 KiB), block output kept by the next LN (64 KiB);
//   checkpointed:   262,144 bytes = the 4 block outputs (8*32*64*4 bytes each).
// Activation peaks over forward + backward: plain 2,761,984, checkpointed
// 1,051,904 (one block's activations recomputed at a time).
TEST(CheckpointTest, ActivationsBetweenForwardAndBackwardShrink) {
  const tensor::Device cpu = tensor::Device::Cpu();
  auto measure = [&](bool checkpoint, int64_t* peak) {
    auto stack = Stack(4, 64, 0.1f);
    if (checkpoint) ApplyCheckpointing(*stack, TopLevel);
    const Tensor x = RandomTensor({8, 32, 64}, 5);
    const Tensor g = RandomTensor({8, 32, 64}, 6);
    MemoryLedger ledger;  // outlives every tensor charged to it
    int64_t after_forward = 0;
    {
      tensor::ScopedLedger scoped(&ledger);
      Context ctx;
      Tensor y = stack->Run(x, ctx);
      after_forward = ledger.Stats(cpu, MemoryCategory::kActivations).current;
      stack->RunBackward(g, ctx);
      *peak = ledger.Stats(cpu, MemoryCategory::kActivations).peak;
    }
    return after_forward;
  };
  int64_t peak_plain = 0, peak_ckpt = 0;
  const int64_t plain = measure(false, &peak_plain);
  const int64_t ckpt = measure(true, &peak_ckpt);
  std::cout << "activations after forward: plain " << plain << " checkpointed " << ckpt
            << "; peaks: plain " << peak_plain << " checkpointed " << peak_ckpt << "\n";
  EXPECT_EQ(ckpt, 4 * 8 * 32 * 64 * 4);  // exactly the 4 block outputs
  EXPECT_LT(ckpt * 10, plain);
  EXPECT_LT(peak_ckpt, peak_plain);
}

}  // namespace
}  // namespace nn

namespace nn {
namespace {

// Attention layers are RandomSources too: checkpointing replays their dropout.
TEST(CheckpointTest, AttentionDropoutIsReplayedExactly) {
  auto run = [](bool checkpointed) {
    CausalSelfAttention attn(16, 4, /*attn_pdrop=*/0.3f, /*resid_pdrop=*/0.2f);
    attn.Materialize(5);
    SeedRandomSources(attn, 11);
    const Tensor x = RandomTensor({2, 6, 16}, 12);
    const Tensor g = RandomTensor({2, 6, 16}, 13);
    Context ctx;
    Tensor gx;
    if (checkpointed) {
      CheckpointedRun(attn, x, ctx);
      gx = CheckpointedRunBackward(attn, g, ctx);
    } else {
      attn.Run(x, ctx);
      gx = attn.RunBackward(g, ctx);
    }
    return std::make_pair(gx.ToVector<float>(), attn.NamedParameters()[0].second->grad.ToVector<float>());
  };
  EXPECT_EQ(run(true), run(false));
}

}  // namespace
}  // namespace nn
