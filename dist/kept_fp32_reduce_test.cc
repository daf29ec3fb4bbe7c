// Gradients of parameters the mixed-precision policy keeps fp32 (BatchNorm's)
// are reduced in fp32 under DDP, ZeRO-1 and FSDP (whose BatchNorm is an fp32
// unit of its own whatever the wrap policy, as PyTorch FSDP's under an
// auto-wrap policy), while the others travel in bf16. One SGD step
// (lr 1, no momentum or decay: the step subtracts the averaged gradient) on 2
// ranks of the threads engine, each on rows of its own, against each rank's
// gradient as nn::MixedPrecision computes it in one process: a BatchNorm
// parameter ends exactly at its value minus the fp32 mean of the two, a
// Linear one (reduced in bf16) elsewhere, but close. Under bf16
// compute, and under fp32 compute with bf16 reduction.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "nn/batch_norm.h"
#include "nn/containers.h"
#include "nn/fp32_modules.h"
#include "nn/linear.h"
#include "nn/mixed_precision.h"
#include "optim/param_ref.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace dist {
namespace {

using tensor::Tensor;
using Values = std::map<std::string, std::vector<float>>;

constexpr uint64_t kSeed = 7;
constexpr int kWorld = 2;

// Linear(4, 6, no bias: BatchNorm would zero its gradient) -> BatchNorm1d(6)
// -> Linear(6, 3).
std::unique_ptr<nn::Sequential> MakeNet() {
  auto net = std::make_unique<nn::Sequential>();
  nn::LinearOptions no_bias;
  no_bias.bias = false;
  net->Append(std::make_unique<nn::Linear>(4, 6, no_bias));
  net->Append(std::make_unique<nn::BatchNorm1d>(6));
  net->Append(std::make_unique<nn::Linear>(6, 3));
  net->Materialize(kSeed);
  return net;
}

Tensor Rows(int rank) { return tensor::testing::RandomTensor({8, 4}, 10 + rank); }
Tensor OutputGrad(int rank) { return tensor::testing::RandomTensor({8, 3}, 20 + rank); }

void ForwardBackward(nn::Module& net, int rank) {
  nn::Context ctx;
  net.Run(Rows(rank), ctx);
  net.RunBackward(OutputGrad(rank), ctx);
}

std::unique_ptr<optim::Optimizer> Sgd() {
  optim::SgdOptions o;
  o.lr = 1.0;
  return optim::SGD::Create(o).value();
}

Values ParameterValues(nn::Module& net) {
  Values out;
  for (auto& [name, p] : net.NamedParameters()) out[name] = p->value.ToVector<float>();
  return out;
}

// The fp32 mean over the ranks of each rank's fp32 gradient, as one process
// with nn::MixedPrecision computes it on that rank's rows.
Values MeanOfLocalGradients(const precision::MixedPrecisionPolicy& mp) {
  Values mean;
  for (int rank = 0; rank < kWorld; ++rank) {
    auto net = MakeNet();
    nn::MixedPrecision mixed(*net, mp);
    mixed.CastForCompute();
    ForwardBackward(*net, rank);
    mixed.RestoreMasters();
    for (auto& [name, p] : net->NamedParameters()) {
      std::vector<float> g = p->grad.ToVector<float>();
      std::vector<float>& m = mean[name];
      m.resize(g.size(), 0.0f);
      for (size_t i = 0; i < g.size(); ++i) m[i] += g[i];
    }
  }
  for (auto& [name, m] : mean) {
    for (float& x : m) x /= kWorld;
  }
  return mean;
}

enum class Strategy { kDdp, kZero1, kFsdpNoAutoWrap, kFsdpBatchNormWrapped };

const char* Name(Strategy s) {
  switch (s) {
    case Strategy::kDdp:
      return "DDP";
    case Strategy::kZero1:
      return "ZeRO-1";
    case Strategy::kFsdpNoAutoWrap:
      return "FSDP, no auto-wrap policy";
    case Strategy::kFsdpBatchNormWrapped:
      return "FSDP, BatchNorm wrapped by the policy";
  }
  return "?";
}

// Rank 0's fp32 parameters after one step under `strategy`.
Values AfterOneStep(Strategy strategy, const precision::MixedPrecisionPolicy& mp) {
  Values after;
  std::mutex mu;
  absl::Status s = RunRanks(kWorld, [&](int rank, ProcessGroup& pg) {
    auto net = MakeNet();
    Values mine;
    if (strategy == Strategy::kDdp) {
      DdpOptions options;
      options.mixed_precision = mp;
      DistributedDataParallel ddp(*net, pg, options);
      ASSERT_TRUE(ddp.reduces_in_low_precision());
      ForwardBackward(*net, rank);
      Sgd()->Step(optim::FromModule(*net));
      mine = ParameterValues(*net);
    } else if (strategy == Strategy::kZero1) {
      Zero1Options options;
      options.mixed_precision = mp;
      Zero1 zero(*net, pg, Sgd(), options);
      ASSERT_TRUE(zero.reduces_in_low_precision());
      ForwardBackward(*net, rank);
      ASSERT_TRUE(zero.Step().ok());
      for (auto& [name, t] : zero.FullStateDict()) mine[name] = t.ToVector<float>();
    } else {
      FsdpOptions options;
      options.mixed_precision = mp;
      options.policy = strategy == Strategy::kFsdpBatchNormWrapped
                           ? WrapPolicy::Transformer({"BatchNorm1d"})
                           : WrapPolicy::None();
      auto fsdp = FullyShard(*net, pg, options);
      // Either way BatchNorm ("1") is a unit of its own, nested in the root.
      ASSERT_EQ(fsdp->num_units(), 2);
      EXPECT_EQ(fsdp->unit_name(1), "1");
      ForwardBackward(*net, rank);
      Sgd()->Step(fsdp->ParamRefs());
      for (auto& [name, t] : fsdp->FullStateDict()) mine[name] = t.ToVector<float>();
    }
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      after = std::move(mine);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  return after;
}

// The largest |after - (before - want)| over a parameter's elements, the
// step computed in fp32 as SGD does, relative to the largest |want|.
double StepError(const std::vector<float>& before, const std::vector<float>& after,
                 const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float expected = before[i] - want[i];
    err = std::max(err, std::fabs(static_cast<double>(after[i]) - expected));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / scale;
}

TEST(KeptFp32Reduce, BatchNormGradientsAreAveragedInFp32UnderEveryStrategy) {
  precision::MixedPrecisionPolicy fp32_compute;  // fp32 parameters, bf16 reduction
  fp32_compute.reduce_dtype = tensor::Dtype::kBF16;
  for (const precision::MixedPrecisionPolicy& mp :
       {precision::MixedPrecisionPolicy::Bf16(), fp32_compute}) {
    SCOPED_TRACE(mp.ToString());
    ASSERT_EQ(mp.fp32_module_classes, std::vector<std::string>{"BatchNorm1d"});
    auto reference = MakeNet();
    const std::set<const nn::Parameter*> kept =
        nn::KeptFp32Parameters(*reference, mp.fp32_module_classes);
    std::set<std::string> kept_names;
    for (auto& [name, p] : reference->NamedParameters()) {
      if (kept.count(p) > 0) kept_names.insert(name);
    }
    ASSERT_EQ(kept_names, (std::set<std::string>{"1.weight", "1.bias"}));
    const Values before = ParameterValues(*reference);
    const Values want = MeanOfLocalGradients(mp);
    for (Strategy strategy : {Strategy::kDdp, Strategy::kZero1, Strategy::kFsdpNoAutoWrap,
                              Strategy::kFsdpBatchNormWrapped}) {
      SCOPED_TRACE(Name(strategy));
      const Values after = AfterOneStep(strategy, mp);
      for (const auto& [name, g] : want) {
        ASSERT_EQ(after.count(name), 1u) << name;
        const double err = StepError(before.at(name), after.at(name), g);
        if (kept_names.count(name) > 0) {
          EXPECT_EQ(err, 0.0) << name;  // the same fp32 sum and step
        } else {
          // Each rank's gradient rounded to bf16 (2^-9 relative) first.
          EXPECT_GT(err, 0.0) << name;
          EXPECT_LT(err, 1e-2) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dist
