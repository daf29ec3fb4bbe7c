// Fixtures of the data-parallel step tests (data_parallel_testing.h).
#include "models/common/data_parallel_testing.h"

#include <atomic>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dist/process_group.h"
#include "gtest/gtest.h"
#include "models/mingpt/model.h"
#include "nn/containers.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/param_ref.h"
#include "tensor/testing.h"

namespace train {
namespace dp_testing {

using tensor::Tensor;

GetEnvFn FakeEnv(std::map<std::string, std::string> vars) {
  auto owned = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [owned](const char* name) -> const char* {
    auto it = owned->find(name);
    return it == owned->end() ? nullptr : it->second.c_str();
  };
}

std::map<std::string, std::string> LaunchVars(int rank, int world, const std::string& run_id) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"RESTART_COUNT", "0"},
          {"RUN_ID", run_id}};
}

DataParallelFlags Flags(std::string backend, std::string strategy, int world_size) {
  DataParallelFlags f;
  f.backend = std::move(backend);
  f.strategy = std::move(strategy);
  f.world_size = world_size;
  return f;
}

Tensor Rows(const std::vector<int64_t>& v, int r, int n) {
  const int64_t B = kRows / n;
  std::vector<int64_t> out(v.begin() + r * B * kT, v.begin() + (r + 1) * B * kT);
  return Tensor::FromData<int64_t>(out, {B, kT});
}

std::unique_ptr<optim::Optimizer> AdamW() {
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return *optim::AdamW::Create(o);
}

std::vector<int64_t> RandomTokens(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> tok(0, 10);
  std::vector<int64_t> v(kRows * kT);
  for (int64_t& x : v) x = tok(gen);
  return v;
}

Trace SingleProcess(tensor::Device device, const std::vector<std::string>& freeze) {
  mingpt::GPT model(Tiny());
  if (!freeze.empty()) {
    EXPECT_TRUE(nn::FreezeParameters(model, freeze).ok());
  }
  model.Materialize(kSeed, device);
  std::map<std::string, Tensor> frozen;  // their values before training
  for (auto& [name, p] : model.NamedParameters()) {
    if (!p->requires_grad) frozen[name] = p->value.Clone();
  }
  std::unique_ptr<optim::Optimizer> opt = AdamW();
  Trace t;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<int64_t> idx = RandomTokens(100 + step), tgt = RandomTokens(200 + step);
    t.losses.push_back(
        model.ForwardBackward(Rows(idx, 0, 1).To(device), Rows(tgt, 0, 1).To(device)));
    std::vector<optim::ParamRef> refs = optim::FromModule(model);
    t.norms.push_back(optim::ClipGradNorm(refs, kClip));
    opt->Step(refs);
    model.ZeroGrad();
  }
  for (auto& [name, p] : model.NamedParameters()) {
    if (frozen.count(name)) {
      EXPECT_TRUE(tensor::testing::AllClose(p->value, frozen[name], 0, 0)) << name;
      EXPECT_FALSE(p->grad.defined()) << name;
    }
  }
  return t;
}

absl::StatusOr<Trace> TrainSteps(const DataParallelConfig& config, dist::ProcessGroup& world_pg,
                                 tensor::Device device, bool checkpointing, int64_t micro_batches,
                                 const std::vector<std::string>& freeze) {
  auto counts = std::make_shared<Counts>();
  CountingGroup pg(world_pg, counts);
  const int rank = pg.rank();
  const int world = pg.size();
  const int64_t K = micro_batches, B = kRows / world / K;  // B rows per micro-batch
  EXPECT_EQ(K * B * world, kRows) << "micro_batches must divide the rank's rows";
  mingpt::GPT model(Tiny());
  if (!freeze.empty()) {
    absl::StatusOr<std::vector<std::string>> frozen = nn::FreezeParameters(model, freeze);
    if (!frozen.ok()) return frozen.status();
  }
  if (checkpointing) {
    const int flagged = nn::ApplyCheckpointing(
        model, [](const std::string&, nn::Module& m) { return m.class_name() == "Block"; });
    EXPECT_EQ(flagged, 2);
  }
  absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
      DataParallelModel::Create(model, pg, config, AdamW(), kSeed);
  if (!dp.ok()) return dp.status();
  Trace trace;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<int64_t> idx = RandomTokens(100 + step), tgt = RandomTokens(200 + step);
    const Tensor inputs = Rows(idx, rank, world).To(device);   // (K*B, kT)
    const Tensor targets = Rows(tgt, rank, world).To(device);  // (K*B, kT)
    const double local = AccumulateGradients(K, dp->get(), [&](int64_t m) {
      const int64_t reductions = counts->reductions, all_gathers = counts->all_gathers;
      const double l =
          model.ForwardBackward(inputs.Narrow(0, m * B, B), targets.Narrow(0, m * B, B), 1.0 / K);
      if (step == 0) {
        trace.reductions_per_micro_batch.push_back(counts->reductions - reductions);
        trace.all_gathers_per_micro_batch.push_back(counts->all_gathers - all_gathers);
      }
      return l;
    });
    absl::StatusOr<double> loss = dist::MeanOverRanks(pg, local);
    if (!loss.ok()) return loss.status();
    absl::Status st = (*dp)->FinishBackward();
    if (!st.ok()) return st;
    absl::StatusOr<double> norm = (*dp)->ClipGradNorm(kClip);
    if (!norm.ok()) return norm.status();
    st = (*dp)->Step();
    if (!st.ok()) return st;
    (*dp)->ZeroGrad();
    trace.losses.push_back(*loss);
    trace.norms.push_back(*norm);
  }
  return trace;
}

absl::StatusOr<std::vector<Trace>> TrainEveryRank(const DataParallelConfig& config,
                                                  tensor::Device device, bool checkpointing,
                                                  int64_t micro_batches,
                                                  const std::vector<std::string>& freeze) {
  std::vector<Trace> traces(config.world_size);
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    absl::StatusOr<Trace> trace =
        TrainSteps(config, rank.pg, device, checkpointing, micro_batches, freeze);
    if (!trace.ok()) return trace.status();
    traces[rank.rank] = *std::move(trace);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return traces;
}

void ExpectStepsNear(const std::vector<Trace>& traces, const Trace& reference, double tol) {
  for (size_t r = 0; r < traces.size(); ++r) {
    ASSERT_EQ(traces[r].losses.size(), reference.losses.size()) << "rank " << r;
    for (size_t step = 0; step < reference.losses.size(); ++step) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " step ", step));
      EXPECT_NEAR(traces[r].losses[step], reference.losses[step], tol);
      EXPECT_NEAR(traces[r].norms[step], reference.norms[step], tol);
    }
  }
}

}  // namespace dp_testing
}  // namespace train
