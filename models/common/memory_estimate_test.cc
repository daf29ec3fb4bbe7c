// The model-state estimate equals what the ledger measures in a real AdamW
// step of a small GPT, fp32 and bf16 mixed precision.
#include "models/common/memory_estimate.h"

#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/mixed_precision.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"

namespace train {
namespace {

using tensor::Device;
using tensor::MemoryCategory;

TEST(MemoryEstimateTest, MatchesTheLedgerOfARealStep) {
  for (bool mixed : {false, true}) {
    tensor::MemoryLedger ledger;
    tensor::ScopedLedger use(&ledger);
    mingpt::GptConfig c = *mingpt::Preset("gpt-nano");
    c.vocab_size = 64;
    c.block_size = 16;
    c.dropout = 0;
    mingpt::GPT gpt(c);
    gpt.Materialize(1);
    nn::MixedPrecision mp(gpt, mixed ? precision::MixedPrecisionPolicy::Bf16()
                                     : precision::MixedPrecisionPolicy::Fp32());
    auto opt = optim::AdamW::Create({});
    std::vector<int64_t> ids(2 * 16, 3);
    tensor::Tensor idx = tensor::Tensor::FromData<int64_t>(ids, {2, 16});
    mp.CastForCompute();
    gpt.ForwardBackward(idx, idx);
    mp.RestoreMasters();
    {
      auto refs = optim::FromModule(gpt);
      (*opt)->Step(refs);
    }
    const ModelStateBytes want =
        EstimateModelState(mingpt::CountParameters(c).total, *OptimizerBytesPerParameter("adamw"),
                           mixed);
    const Device cpu = Device::Cpu();
    EXPECT_EQ(ledger.Stats(cpu, MemoryCategory::kParameters).peak, want.parameters) << mixed;
    EXPECT_EQ(ledger.Stats(cpu, MemoryCategory::kGradients).peak, want.gradients);
    EXPECT_EQ(ledger.Stats(cpu, MemoryCategory::kOptimizerState).peak, want.optimizer_state);
  }
  EXPECT_FALSE(OptimizerBytesPerParameter("lion").ok());
}

}  // namespace
}  // namespace train
