// minGPT: names and counts agree with config.h, finite-difference gradients of
// the whole tiny model, activation checkpointing is exact, and AdamW overfits a
// fixed batch.
#include "models/mingpt/model.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nn/checkpoint.h"
#include "nn/freeze.h"
#include "nn/module_testing.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace mingpt {
namespace {

using tensor::Dtype;
using tensor::testing::AllClose;
using tensor::testing::NumericalGradient;

GptConfig Tiny() {
  GptConfig c;
  c.name = "tiny";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = 11;
  c.block_size = 6;
  c.dropout = 0.0f;
  return c;
}

Tensor Ids(std::vector<int64_t> v, int64_t B, int64_t T) {
  return Tensor::FromData<int64_t>(v, {B, T});
}

TEST(GptTest, NamesAndCountsMatchTheConfig) {
  GptConfig c = Tiny();
  GPT gpt(c);
  auto params = gpt.NamedParameters();
  std::vector<ParamShape> shapes = ParameterShapes(c);
  ASSERT_EQ(params.size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(params[i].first, shapes[i].name);
    EXPECT_EQ(params[i].second->shape.dims(), tensor::Dims(shapes[i].shape.begin(),
                                                            shapes[i].shape.end()));
  }
  EXPECT_EQ(gpt.NumParameters(), CountParameters(c).total);
  EXPECT_EQ(gpt.transformer()->blocks()->at(1)->class_name(), "Block");
}

TEST(GptTest, GradientsOfTheWholeModelMatchFiniteDifferences) {
  GPT gpt(Tiny());
  gpt.Materialize(3);
  const Tensor idx = Ids({1, 4, 2, 9, 0, 3, 7, 7, 10, 5, 6, 1}, 2, 6);
  const Tensor targets = Ids({4, 2, 9, 0, 3, 8, 7, 10, 5, 6, 1, 2}, 2, 6);
  const double loss = gpt.ForwardBackward(idx, targets);
  EXPECT_NEAR(loss, gpt.Loss(idx, targets), 1e-6);
  EXPECT_NEAR(loss, std::log(11.0), 0.1);  // near-uniform at init
  for (auto& [name, p] : gpt.NamedParameters()) {
    Tensor numeric = NumericalGradient([&](const Tensor&) { return gpt.Loss(idx, targets); },
                                       p->value, 1e-3);
    EXPECT_TRUE(AllClose(p->grad, numeric, 2e-4, 2e-2)) << name;
  }
}

TEST(GptTest, CheckpointedBlocksGiveTheSameGradients) {
  GptConfig c = Tiny();
  c.dropout = 0.1f;
  auto grads = [&](bool checkpoint) {
    GPT gpt(c);
    gpt.Materialize(4);
    nn::SeedRandomSources(gpt, 5);
    if (checkpoint) {
      for (size_t l = 0; l < gpt.transformer()->blocks()->size(); ++l) {
        gpt.transformer()->blocks()->set_checkpointed(l, true);
      }
    }
    gpt.ForwardBackward(Ids({1, 2, 3, 4, 5, 6}, 1, 6), Ids({2, 3, 4, 5, 6, 7}, 1, 6));
    std::vector<std::vector<float>> out;
    for (auto& [name, p] : gpt.NamedParameters()) out.push_back(p->grad.ToVector<float>());
    return out;
  };
  EXPECT_EQ(grads(true), grads(false));
}

// Counts the backward passes of the modules it is installed on.
class BackwardCounter : public nn::ModuleHooks {
 public:
  void PostBackward(nn::Module& m) override { ++counts[&m]; }
  std::map<nn::Module*, int> counts;
};

// Fine-tuning with the embeddings and the lower blocks frozen: the backward
// stops at the lowest trainable block (the frozen blocks below it and the
// embeddings run none, as PyTorch's autograd), the forward keeps none of
// their activations (a lower activation peak), and every trainable gradient
// is, to the bit, the one of the unfrozen model; a trainable embedding makes
// the backward go all the way down again.
TEST(GptTest, BackwardStopsAtTheLowestTrainableBlock) {
  GptConfig c = Tiny();
  c.n_layer = 3;
  const Tensor idx = Ids({1, 4, 2, 9, 0, 3, 7, 7, 10, 5, 6, 1}, 2, 6);
  const Tensor targets = Ids({4, 2, 9, 0, 3, 8, 7, 10, 5, 6, 1, 2}, 2, 6);
  GPT reference(c);
  reference.Materialize(3);
  tensor::MemoryLedger reference_ledger;
  {
    tensor::ScopedLedger scoped(&reference_ledger);
    reference.ForwardBackward(idx, targets);
  }
  const int64_t reference_activations =
      reference_ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kActivations).peak;
  struct Case {
    std::vector<std::string> freeze;
    std::vector<int> block_backwards;  // per block
  };
  for (const Case& k : std::vector<Case>{
           {{"transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1"}, {0, 0, 1}},
           {{"transformer.wte", "transformer.wpe", "transformer.h.0"}, {0, 1, 1}},
           {{"transformer.wte", "transformer.wpe", "transformer.h.1"}, {1, 1, 1}},
           {{"transformer.wpe", "transformer.h.0", "transformer.h.1"}, {1, 1, 1}},
           {{"transformer"}, {0, 0, 0}},
       }) {
    SCOPED_TRACE(k.freeze.back());
    GPT gpt(c);
    ASSERT_TRUE(nn::FreezeParameters(gpt, k.freeze).ok());
    gpt.Materialize(3);
    BackwardCounter counter;
    for (size_t l = 0; l < 3; ++l) gpt.transformer()->blocks()->at(l)->set_hooks(&counter);
    const double want_loss = reference.Loss(idx, targets);
    tensor::MemoryLedger ledger;
    {
      tensor::ScopedLedger scoped(&ledger);
      EXPECT_EQ(gpt.ForwardBackward(idx, targets), want_loss);
    }
    const int64_t activations =
        ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kActivations).peak;
    if (k.block_backwards[0] == 0) {
      EXPECT_LT(activations, reference_activations);
    } else {  // frozen embeddings keep their saved ids no longer
      EXPECT_LE(activations, reference_activations);
    }
    for (size_t l = 0; l < 3; ++l) {
      EXPECT_EQ(counter.counts[gpt.transformer()->blocks()->at(l)], k.block_backwards[l]) << l;
    }
    nn::testing::ExpectTrainableGradsAndNoneFrozen(gpt, reference);
  }
}

TEST(GptTest, AdamWOverfitsAFixedBatch) {
  GptConfig c = Tiny();
  c.n_embd = 16;
  GPT gpt(c);
  gpt.Materialize(6);
  optim::AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0.0;
  auto opt = optim::AdamW::Create(options);
  ASSERT_TRUE(opt.ok());
  const Tensor idx = Ids({1, 4, 2, 9, 0, 3, 7, 7, 10, 5, 6, 1}, 2, 6);
  const Tensor targets = Ids({4, 2, 9, 0, 3, 8, 7, 10, 5, 6, 1, 2}, 2, 6);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    gpt.ZeroGrad();
    last = gpt.ForwardBackward(idx, targets);
    if (step == 0) first = last;
    std::vector<optim::ParamRef> refs = optim::FromModule(gpt);
    (*opt)->Step(refs);
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.05) << "loss went from " << first << " to " << last;
}

TEST(GptTest, TooLongSequenceIsAClearError) {
  GPT gpt(Tiny());
  gpt.Materialize(1);
  try {
    gpt.Loss(Tensor::Zeros({1, 7}, Dtype::kI64), Tensor::Zeros({1, 7}, Dtype::kI64));
    FAIL();
  } catch (const tensor::OpError& e) {
    EXPECT_EQ(std::string(e.what()), "[gpt] sequence length 7 exceeds block_size 6");
  }
}

}  // namespace
}  // namespace mingpt
