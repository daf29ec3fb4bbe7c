// The FSDP tests' shared fixtures (fsdp_testing.h).
#include "dist/fsdp_testing.h"

#include <cmath>
#include <memory>
#include <mutex>
#include <random>

#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/mixed_precision.h"
#include "optim/clip_grad.h"
#include "tensor/error.h"
#include "optim/param_ref.h"
#include "tensor/testing.h"

namespace dist {
namespace testing {

using tensor::Tensor;

mingpt::GptConfig Tiny() {
  mingpt::GptConfig c;
  c.name = "tiny";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = 11;
  c.block_size = 6;
  c.dropout = 0.0f;
  return c;
}

mingpt::GptConfig Small() {
  mingpt::GptConfig c = Tiny();
  c.name = "small";
  c.n_layer = 4;
  c.n_embd = 32;
  c.vocab_size = 64;
  c.block_size = 16;
  return c;
}

FsdpOptions PerBlock(ShardingStrategy strategy) {
  FsdpOptions options;
  options.strategy = strategy;
  options.policy = WrapPolicy::Transformer({"Block"});
  options.seed = kSeed;
  return options;
}

Tensor RandomIds(int64_t B, int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> v(B * T);
  for (auto& x : v) x = static_cast<int64_t>(rng() % V);
  return Tensor::FromData<int64_t>(v, {B, T});
}

optim::SgdOptions Sgd() {
  optim::SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.1;
  return o;
}

namespace {

// Rows [r R + j b, r R + (j + 1) b) of every rank r (R = rows per rank): the
// global rows of micro-batch j.
Tensor MicroBatchRows(const Tensor& t, int world, int micro_batches, int j) {
  const int64_t per_rank = t.dim(0) / world;
  const int64_t b = per_rank / micro_batches;
  const int64_t T = t.dim(1);
  std::vector<int64_t> all = t.Contiguous().ToVector<int64_t>();
  std::vector<int64_t> rows;
  for (int r = 0; r < world; ++r) {
    const int64_t first = r * per_rank + j * b;
    rows.insert(rows.end(), all.begin() + first * T, all.begin() + (first + b) * T);
  }
  return Tensor::FromData<int64_t>(rows, {world * b, T});
}

}  // namespace

RunResult SingleProcess(const mingpt::GptConfig& c, const Tensor& idx, const Tensor& tgt,
                        const precision::MixedPrecisionPolicy& mp, int micro_batches, int world,
                        tensor::Device device) {
  mingpt::GPT gpt(c);
  gpt.Materialize(kSeed, device);
  auto opt = optim::SGD::Create(Sgd()).value();
  std::unique_ptr<nn::MixedPrecision> mixed;
  if (mp.IsMixed()) mixed = std::make_unique<nn::MixedPrecision>(gpt, mp);
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    gpt.ZeroGrad();
    if (mixed) mixed->CastForCompute();
    double loss = 0;
    for (int j = 0; j < micro_batches; ++j) {
      if (micro_batches == 1) {
        loss += gpt.ForwardBackward(idx.To(device), tgt.To(device));
      } else {
        loss += gpt.ForwardBackward(MicroBatchRows(idx, world, micro_batches, j).To(device),
                                    MicroBatchRows(tgt, world, micro_batches, j).To(device));
      }
    }
    r.losses.push_back(loss / micro_batches);
    if (mixed) mixed->RestoreMasters();
    auto refs = optim::FromModule(gpt);
    r.norms.push_back(optim::ClipGradNorm(refs, kClip));
    opt->Step(refs);
  }
  for (auto& [name, p] : gpt.NamedParameters()) {
    r.params.emplace_back(name, device.is_cpu() ? p->value.Clone() : p->value.To(tensor::Device::Cpu()));
  }
  return r;
}

double RankMean(ProcessGroup& pg, double x) {
  absl::StatusOr<double> mean = dist::MeanOverRanks(pg, x);
  EXPECT_TRUE(mean.ok()) << mean.status();
  return mean.ok() ? *mean : 0.0;
}

RunResult TrainRank(const mingpt::GptConfig& c, const Tensor& idx, const Tensor& tgt,
                    ProcessGroup& pg, FsdpOptions options, int micro_batches,
                    bool checkpoint_blocks) {
  const int rank = pg.rank();
  const int64_t B = idx.dim(0) / pg.size();
  const int64_t b = B / micro_batches;
  options.seed = kSeed;
  mingpt::GPT gpt(c);
  if (checkpoint_blocks) {
    for (size_t l = 0; l < gpt.transformer()->blocks()->size(); ++l) {
      gpt.transformer()->blocks()->set_checkpointed(l, true);
    }
  }
  auto fsdp = FullyShard(gpt, pg, options);
  auto opt = optim::SGD::Create(Sgd()).value();
  RunResult mine;
  for (int step = 0; step < kSteps; ++step) {
    // Zeroed in place, then dropped (set_to_none), alternately: the same training.
    fsdp->ZeroGrad(/*set_to_none=*/step % 2 == 1);
    double loss = 0;
    for (int j = 0; j < micro_batches; ++j) {
      const Tensor my_idx = idx.Narrow(0, rank * B + j * b, b).Contiguous().To(options.device);
      const Tensor my_tgt = tgt.Narrow(0, rank * B + j * b, b).Contiguous().To(options.device);
      if (j + 1 < micro_batches) {
        auto no_sync = fsdp->no_sync();
        loss += gpt.ForwardBackward(my_idx, my_tgt);
      } else {
        loss += gpt.ForwardBackward(my_idx, my_tgt);
      }
    }
    mine.losses.push_back(RankMean(pg, loss / micro_batches));
    mine.norms.push_back(fsdp->ClipGradNorm(kClip));
    opt->Step(fsdp->ParamRefs());
  }
  mine.params = fsdp->FullStateDict();
  if (rank != 0) {
    EXPECT_TRUE(mine.params.empty());
  }
  return mine;
}

RunResult Sharded(const mingpt::GptConfig& c, const Tensor& idx, const Tensor& tgt, int world,
                  FsdpOptions options, int micro_batches, bool checkpoint_blocks) {
  RunResult result;
  std::mutex mu;
  ThreadWorld thread_world(world);
  absl::Status s = RunRanks(thread_world, [&](int rank, ProcessGroup& pg) {
    RunResult mine = TrainRank(c, idx, tgt, pg, options, micro_batches, checkpoint_blocks);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(mine);
    }
  });
  EXPECT_TRUE(s.ok()) << s;
  // Copies charged to the process ledger, so rank 0's ledger is empty when the
  // world goes away.
  for (auto& [name, t] : result.params) t = t.Clone();
  return result;
}

RunResult Sharded(const mingpt::GptConfig& c, const Tensor& idx, const Tensor& tgt, int world,
                  ShardingStrategy strategy, const WrapPolicy& policy,
                  const precision::MixedPrecisionPolicy& mp) {
  FsdpOptions options;
  options.strategy = strategy;
  options.policy = policy;
  options.mixed_precision = mp;
  return Sharded(c, idx, tgt, world, options);
}

void ExpectSameTraining(const RunResult& got, const RunResult& want, double tol) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], tol + tol * std::abs(want.losses[i]))
        << "step " << i;
    EXPECT_NEAR(got.norms[i], want.norms[i], tol + tol * std::abs(want.norms[i]))
        << "step " << i;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_EQ(got.params[i].first, want.params[i].first);
    EXPECT_TRUE(tensor::testing::AllClose(got.params[i].second, want.params[i].second, tol, tol))
        << want.params[i].first;
  }
}

void ExpectBitwiseEqual(const RunResult& got, const RunResult& want) {
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_EQ(got.params[i].first, want.params[i].first);
    EXPECT_EQ(got.params[i].second.ToVector<float>(), want.params[i].second.ToVector<float>())
        << want.params[i].first;
  }
}

void ExpectCloseTraining(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 2e-3 * std::abs(want.losses[i])) << "step " << i;
    EXPECT_NEAR(got.norms[i], want.norms[i], 2e-2 * std::abs(want.norms[i])) << "step " << i;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    EXPECT_EQ(got.params[i].first, want.params[i].first);
    EXPECT_EQ(got.params[i].second.dtype(), tensor::Dtype::kF32);
    EXPECT_TRUE(tensor::testing::AllClose(got.params[i].second, want.params[i].second, 2e-2, 2e-3))
        << want.params[i].first;
  }
}

MaybeSkips::MaybeSkips(int64_t d) : nn::Module("MaybeSkips") {
  first_ = RegisterModule("first", std::make_unique<nn::Linear>(d, d));
  second_ = RegisterModule("second", std::make_unique<nn::Linear>(d, d));
}

nn::Tensors MaybeSkips::Forward(const nn::Tensors& in, nn::Context& ctx) {
  nn::Tensors h = first_->Run(in, ctx.Child(0));
  return use_second ? second_->Run(h, ctx.Child(1)) : h;
}

nn::Tensors MaybeSkips::Backward(const nn::Tensors& grad, nn::Context& ctx) {
  const nn::Tensors g = use_second ? second_->RunBackward(grad, ctx.Child(1)) : grad;
  if (stop_in_backward) tensor::ThrowOpError("MaybeSkips", "backward stopped after 'second'");
  return first_->RunBackward(g, ctx.Child(0));
}

}  // namespace testing
}  // namespace dist
