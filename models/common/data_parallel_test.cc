// models/common:data_parallel at run time: the exact mean over ranks, running
// ranks as threads, and every strategy's step (clip included) against one
// process training the global batch. The flags and the configuration:
// data_parallel_config_test.cc.
#include "models/common/data_parallel.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/thread_group.h"
#include "gtest/gtest.h"
#include "models/common/data_parallel_testing.h"
#include "models/mingpt/model.h"
#include "nn/freeze.h"
#include "nn/state_dict.h"
#include "precision/policy.h"
#include "tensor/error.h"
#include "optim/adamw.h"
#include "tensor/cuda_backend.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace train {
namespace {

using tensor::Tensor;
using namespace dp_testing;  // NOLINT: the shared step fixtures

// ---- Running ranks, the mean over ranks ----

DataParallelConfig ThreadsConfig(const std::string& strategy, int world_size,
                                 const std::string& auto_wrap = "transformer",
                                 int hybrid_shard_group_size = 0,
                                 const std::string& device = "cpu") {
  DataParallelFlags f = Flags("threads", strategy, world_size);
  f.auto_wrap = auto_wrap;
  f.hybrid_shard_group_size = hybrid_shard_group_size;
  f.device = device;
  absl::StatusOr<DataParallelConfig> c = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(RunDataParallelTest, ThreadsRunEveryRankWithItsLedger) {
  std::vector<int> seen(3, 0);
  std::vector<const tensor::MemoryLedger*> ledgers(3, nullptr);
  absl::Status s = RunDataParallel(ThreadsConfig("ddp", 3), [&](RankContext& rank) {
    EXPECT_EQ(rank.world_size, 3);
    EXPECT_EQ(rank.pg.rank(), rank.rank);
    EXPECT_EQ(rank.logs(), rank.rank == 0);
    EXPECT_EQ(&rank.ledger, &tensor::MemoryLedger::Current());
    seen[rank.rank] += 1;
    ledgers[rank.rank] = &rank.ledger;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1}));
  EXPECT_NE(ledgers[0], ledgers[1]);
  EXPECT_NE(ledgers[1], ledgers[2]);

  s = RunDataParallel(ThreadsConfig("ddp", 2), [](RankContext& rank) {
    return rank.rank == 1 ? absl::InvalidArgumentError("bad rows") : absl::OkStatus();
  });
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1: bad rows")) << s;
}

TEST(MeanOverRanksTest, ExactToDoubleRoundingAndEqualOnEveryRank) {
  // Values a float cannot hold: the mean must keep their low bits.
  const std::vector<double> values = {1.0 + 1e-12, 2.0 / 3.0, 1e6 + 1.0 / 7.0, -0.1};
  double expected = 0;
  for (double v : values) expected += v;
  std::vector<double> means(4), sums(4);
  absl::Status s = dist::RunRanks(4, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
    absl::StatusOr<double> mean = MeanOverRanks(pg, values[rank]);
    if (!mean.ok()) return mean.status();
    absl::StatusOr<double> sum = SumOverRanks(pg, values[rank]);
    if (!sum.ok()) return sum.status();
    means[rank] = *mean;
    sums[rank] = *sum;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(means[r], means[0]);
    EXPECT_NEAR(means[r], expected / 4, 1e-15 * std::fabs(expected));
    EXPECT_NEAR(sums[r], expected, 1e-15 * std::fabs(expected));
  }
  // A float-only mean would be off by far more than that.
  EXPECT_GT(std::fabs(static_cast<float>(values[2]) - values[2]), 1e-3);
}

// A squared gradient norm past f32's range (a norm of 1e20, finite in f32)
// sums as it is, so clipping still sees a finite total; an infinite one
// stays infinite (not NaN). The sum is the rank-order double sum, exactly.
TEST(SumOverRanksTest, ValuesPastFloatRangeAndInfinityAddAsTheyAre) {
  const std::vector<double> values = {1e40, 3e300, 2.0 / 3.0, 1e39};
  const double expected = ((values[0] + values[1]) + values[2]) + values[3];
  std::vector<double> sums(4), infinite(4);
  absl::Status s = dist::RunRanks(4, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
    absl::StatusOr<double> sum = SumOverRanks(pg, values[rank]);
    if (!sum.ok()) return sum.status();
    sums[rank] = *sum;
    sum = SumOverRanks(pg, rank == 2 ? HUGE_VAL : 1.0);
    if (!sum.ok()) return sum.status();
    infinite[rank] = *sum;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(sums[r], expected) << "rank " << r;
    EXPECT_EQ(infinite[r], HUGE_VAL) << "rank " << r;
  }
}

TEST(AnyOverRanksTest, TrueOnEveryRankWhenAnyRankSaysSo) {
  for (int raiser : {-1, 0, 2}) {
    std::vector<int> got(3, -1);
    absl::Status s = dist::RunRanks(3, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
      absl::StatusOr<bool> any = dist::AnyOverRanks(pg, rank == raiser);
      if (!any.ok()) return any.status();
      got[rank] = *any ? 1 : 0;
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(got, std::vector<int>(3, raiser >= 0 ? 1 : 0)) << "rank " << raiser << " raises";
  }
}

// ---- Each strategy's step against one process on the global batch ----

// (strategy, device): "cpu", or "cuda:0" (ranks sharing the GPU; skipped
// without one; the reference runs on the GPU too).
class StrategyStepTest : public testing::TestWithParam<std::tuple<std::string, std::string>> {};

// hybrid_shard(_zero2): 4 ranks in 2 shard groups of 2; the others: 2
// ranks. With and without activation checkpointing of every Block. The FSDP
// strategies' all-gathers per micro-batch: a unit's each time it runs, but
// SHARD_GRAD_OP's keep their forward's gather for the backward and
// FULL_SHARD's root is kept from its forward to its backward.
TEST_P(StrategyStepTest, RanksEqualOneProcessOnTheGlobalBatch) {
  const auto& [strategy, device_name] = GetParam();
  const tensor::Device device = *tensor::ParseDevice(device_name);
  if (device.is_cuda() && tensor::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Trace reference = SingleProcess(device);
  ASSERT_GT(reference.norms[0], kClip);  // clipping is exercised
  const bool hybrid = IsHybrid(*ParseStrategy(strategy));
  const int world = hybrid ? 4 : 2;
  constexpr int64_t kUnits = 3;  // the root and 2 Blocks
  const std::map<std::string, int64_t> all_gathers = {
      {"ddp", 0},
      {"zero1", 0},  // its all-gather follows the optimizer step
      {"no_shard", 0},
      {"full_shard", 2 * kUnits - 1},
      {"hybrid_shard", 2 * kUnits - 1},
      {"shard_grad_op", kUnits},
      {"hybrid_shard_zero2", kUnits}};
  // GPU reductions sum in other orders than one process on the GPU does.
  const double tol = device.is_cuda() ? 1e-4 : 1e-5;
  // Activation checkpointing of every Block; gradient accumulation over 2
  // micro-batches, where only the last one's backward reduces gradients.
  for (auto [checkpointing, micro_batches] : {std::pair{false, 1}, {true, 1}, {false, 2}}) {
    SCOPED_TRACE(absl::StrCat(checkpointing ? "activation checkpointing" : "no checkpointing", ", ",
                              micro_batches, " micro-batches"));
    const DataParallelConfig config =
        ThreadsConfig(strategy, world, "transformer", hybrid ? 2 : 0, device_name);
    absl::StatusOr<std::vector<Trace>> trained =
        TrainEveryRank(config, device, checkpointing, micro_batches);
    ASSERT_TRUE(trained.ok()) << trained.status();
    const std::vector<Trace>& traces = *trained;
    ExpectStepsNear(traces, reference, tol);
    for (int r = 0; r < world; ++r) {
      const std::vector<int64_t>& reductions = traces[r].reductions_per_micro_batch;
      ASSERT_EQ(reductions.size(), static_cast<size_t>(micro_batches));
      for (int m = 0; m + 1 < micro_batches; ++m) {
        EXPECT_EQ(reductions[m], 0) << "rank " << r << " reduced gradients in micro-batch " << m;
      }
      EXPECT_GT(reductions.back(), 0) << "rank " << r;
      // Checkpointing recomputes a Block's forward inside its backward, with
      // the unit gathered there already.
      for (int64_t gathers : traces[r].all_gathers_per_micro_batch) {
        EXPECT_EQ(gathers, all_gathers.at(strategy)) << "rank " << r;
      }
    }
  }
}

// Fine-tuning with frozen parameters under every strategy equals one process
// with the same parameters frozen. First: a whole Block (an FSDP unit of
// frozen parameters only: no gradient, no reduce-scatter, no optimizer
// state), the token embedding (frozen beside trainable parameters in the root
// unit) and one Linear's weight (its bias trains). AdamW with weight decay
// would move a frozen parameter that reached the optimizer, and a gradient
// that reached one would change the clipped norm. FSDP puts the frozen
// embeddings in units of their own (FrozenLeavesApart), which gather for
// their forward only: a frozen embedding runs no backward. Second: both
// embeddings and the first Block, below which the backward stops: FULL_SHARD
// and HYBRID_SHARD gather only the second Block again for the backward (6
// all-gathers a micro-batch: 5 units forward, 1 backward).
TEST_P(StrategyStepTest, FrozenParametersTrainAsInOneProcess) {
  const auto& [strategy, device_name] = GetParam();
  const tensor::Device device = *tensor::ParseDevice(device_name);
  if (device.is_cuda() && tensor::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Trace unfrozen = SingleProcess(device);
  const bool hybrid = IsHybrid(*ParseStrategy(strategy));
  const int world = hybrid ? 4 : 2;
  const double tol = device.is_cuda() ? 1e-4 : 1e-5;
  const bool gathers_twice = strategy == "full_shard" || strategy == "hybrid_shard";
  const bool gathers_once = strategy == "shard_grad_op" || strategy == "hybrid_shard_zero2";
  struct Case {
    std::vector<std::string> freeze;
    int64_t all_gathers_twice;  // per micro-batch, FULL_SHARD and HYBRID_SHARD
    int64_t all_gathers_once;   // SHARD_GRAD_OP and HYBRID_SHARD_ZERO2: the units
  };
  for (const Case& k : {Case{{"transformer.h.0", "transformer.wte",
                              "transformer.h.1.attn.c_attn.weight"}, 6, 4},
                        Case{{"transformer.wte", "transformer.wpe", "transformer.h.0"}, 6, 5}}) {
    SCOPED_TRACE(absl::StrJoin(k.freeze, ","));
    const Trace reference = SingleProcess(device, k.freeze);
    ASSERT_GT(std::abs(reference.norms[0] - unfrozen.norms[0]), 1e-3);  // freezing matters
    const DataParallelConfig config =
        ThreadsConfig(strategy, world, "transformer", hybrid ? 2 : 0, device_name);
    absl::StatusOr<std::vector<Trace>> trained = TrainEveryRank(config, device, false, 1, k.freeze);
    ASSERT_TRUE(trained.ok()) << trained.status();
    const std::vector<Trace>& traces = *trained;
    ExpectStepsNear(traces, reference, tol);
    for (int r = 0; r < world; ++r) {
      const int64_t want = gathers_twice ? k.all_gathers_twice
                           : gathers_once ? k.all_gathers_once
                                          : 0;
      EXPECT_EQ(traces[r].all_gathers_per_micro_batch, std::vector<int64_t>{want}) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, StrategyStepTest,
                         testing::Combine(testing::Values("ddp", "zero1", "shard_grad_op",
                                                          "full_shard", "no_shard", "hybrid_shard",
                                                          "hybrid_shard_zero2"),
                                          testing::Values("cpu", "cuda:0")));

// --prefetch_units and --keep_last_unit reach FSDP: the same losses and
// norms bit for bit, one all-gather fewer a micro-batch with the last Block
// kept (4 instead of the root's 1 and each Block's 2), and the strategy's
// description names them; the root alone cannot be kept.
TEST(DataParallelModelTest, PrefetchUnitsAndKeepLastUnitTrainTheSame) {
  auto run = [](int prefetch_units, bool keep_last_unit, const std::string& auto_wrap,
                std::string* describe) -> absl::StatusOr<Trace> {
    DataParallelFlags f = Flags("threads", "full_shard", 2);
    f.auto_wrap = auto_wrap;
    f.prefetch_units = prefetch_units;
    f.keep_last_unit = keep_last_unit;
    absl::StatusOr<DataParallelConfig> config = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
    if (!config.ok()) return config.status();
    std::vector<Trace> traces(2);
    absl::Status s = RunDataParallel(*config, [&](RankContext& rank) -> absl::Status {
      if (describe != nullptr) {  // every rank builds one (creation may communicate)
        mingpt::GPT model(Tiny());
        absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
            DataParallelModel::Create(model, rank.pg, *config, AdamW(), kSeed);
        if (!dp.ok()) return dp.status();
        if (rank.rank == 0) *describe = (*dp)->Describe();
      }
      absl::StatusOr<Trace> trace = TrainSteps(*config, rank.pg, tensor::Device::Cpu());
      if (!trace.ok()) return trace.status();
      traces[rank.rank] = *std::move(trace);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return traces[0];
  };
  absl::StatusOr<Trace> plain = run(0, false, "transformer", nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::string describe;
  absl::StatusOr<Trace> tuned = run(1, true, "transformer", &describe);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(tuned->losses, plain->losses);
  EXPECT_EQ(tuned->norms, plain->norms);
  EXPECT_EQ(plain->all_gathers_per_micro_batch, std::vector<int64_t>{5});
  EXPECT_EQ(tuned->all_gathers_per_micro_batch, std::vector<int64_t>{4});
  EXPECT_TRUE(absl::StrContains(describe,
                                "3 units (auto_wrap transformer, prefetch_units 1, last "
                                "unit transformer.h.1 kept)"))
      << describe;
  absl::StatusOr<Trace> root_only = run(0, true, "none", nullptr);
  ASSERT_FALSE(root_only.ok());
  EXPECT_TRUE(absl::StrContains(root_only.status().message(),
                                "--keep_last_unit: --auto_wrap=none gives no unit but the root"))
      << root_only.status();
}

// --keep_last_unit keeps the last unit that trains: not a frozen leaf that
// FrozenLeavesApart put after the Blocks (the final LayerNorm), nor a frozen
// last Block, nor, under bf16 with LayerNorm kept fp32, the final LayerNorm's
// own fp32 unit; the runs train as one process. With no trainable unit but
// the root it is an error.
TEST(DataParallelModelTest, KeepLastUnitKeepsTheLastUnitThatTrains) {
  struct Case {
    std::vector<std::string> freeze;
    std::string kept;  // empty: an error
  };
  for (const Case& k : {Case{{"transformer.ln_f"}, "transformer.h.1"},
                        Case{{"transformer.h.1"}, "transformer.h.0"},
                        Case{{"transformer.h.0", "transformer.h.1"}, ""}}) {
    SCOPED_TRACE(absl::StrJoin(k.freeze, ","));
    DataParallelFlags f = Flags("threads", "full_shard", 2);
    f.auto_wrap = "transformer";
    f.keep_last_unit = true;
    absl::StatusOr<DataParallelConfig> config = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
    ASSERT_TRUE(config.ok()) << config.status();
    std::string describe;
    absl::Status s = RunDataParallel(*config, [&](RankContext& rank) -> absl::Status {
      mingpt::GPT model(Tiny());
      absl::StatusOr<std::vector<std::string>> frozen = nn::FreezeParameters(model, k.freeze);
      if (!frozen.ok()) return frozen.status();
      absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
          DataParallelModel::Create(model, rank.pg, *config, AdamW(), kSeed);
      if (!dp.ok()) return dp.status();
      if (rank.rank == 0) describe = (*dp)->Describe();
      return absl::OkStatus();
    });
    if (k.kept.empty()) {
      ASSERT_FALSE(s.ok());
      EXPECT_TRUE(absl::StrContains(s.message(), "--keep_last_unit: no unit but the root trains"))
          << s;
      continue;
    }
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(absl::StrContains(describe, "last unit " + k.kept + " kept")) << describe;
    const Trace reference = SingleProcess(tensor::Device::Cpu(), k.freeze);
    absl::StatusOr<std::vector<Trace>> trained =
        TrainEveryRank(*config, tensor::Device::Cpu(), false, 1, k.freeze);
    ASSERT_TRUE(trained.ok()) << trained.status();
    ExpectStepsNear(*trained, reference, 1e-5);
  }
  DataParallelFlags f = Flags("threads", "full_shard", 2);
  f.keep_last_unit = true;
  absl::StatusOr<DataParallelConfig> config = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
  ASSERT_TRUE(config.ok()) << config.status();
  config->mixed_precision = precision::MixedPrecisionPolicy::Bf16();
  config->mixed_precision.fp32_module_classes = {"LayerNorm"};
  std::string describe;
  absl::Status s = RunDataParallel(*config, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
        DataParallelModel::Create(model, rank.pg, *config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    if (rank.rank == 0) describe = (*dp)->Describe();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(absl::StrContains(describe, "last unit transformer.h.1 kept")) << describe;
}

// --bucket_cap_mb reaches DDP's and ZeRO-1's buckets.
TEST(DataParallelModelTest, BucketCapSetsTheGradientBuckets) {
  for (const char* strategy : {"ddp", "zero1"}) {
    DataParallelFlags f = Flags("threads", strategy, 2);
    f.bucket_cap_mb = 0.002;
    absl::StatusOr<DataParallelConfig> small = ConfigureDataParallel(f, {"Block"}, FakeEnv({}));
    ASSERT_TRUE(small.ok()) << small.status();
    const DataParallelConfig one = ThreadsConfig(strategy, 2);  // 25 MiB
    const std::string name = std::string(strategy) == "ddp" ? "DDP" : "ZeRO-1";
    absl::Status s = RunDataParallel(one, [&](RankContext& rank) -> absl::Status {
      mingpt::GPT a(Tiny()), b(Tiny());
      auto many = DataParallelModel::Create(a, rank.pg, *small, AdamW(), kSeed);
      auto single = DataParallelModel::Create(b, rank.pg, one, AdamW(), kSeed);
      EXPECT_TRUE(many.ok() && single.ok());
      EXPECT_TRUE(absl::StartsWith((*many)->Describe(), name + ", ")) << (*many)->Describe();
      EXPECT_TRUE(absl::EndsWith((*many)->Describe(), " gradient buckets"));
      EXPECT_FALSE(absl::StrContains((*many)->Describe(), ", 1 gradient"));
      EXPECT_EQ((*single)->Describe(), name + ", 1 gradient bucket");
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// An --init_from value one rank cannot read fails every rank at once: that
// rank with its own error, the others naming it (not waiting for it in the
// wrapper's first collective until their timeout).
class FailingSource final : public nn::InitSource {
 public:
  explicit FailingSource(tensor::Shape shape) : shape_(std::move(shape)) {}
  const tensor::Shape& shape() const override { return shape_; }
  void Read(int64_t, Tensor&) const override {
    tensor::ThrowOpError("init_from", "cannot read this rank's copy");
  }

 private:
  tensor::Shape shape_;
};

TEST(DataParallelModelTest, AnInitValueOneRankCannotReadFailsEveryRankNamingIt) {
  for (const char* strategy : {"ddp", "zero1", "full_shard"}) {
    const DataParallelConfig config = ThreadsConfig(strategy, 2);
    std::vector<absl::Status> got(2);
    absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
      mingpt::GPT model(Tiny());
      if (rank.rank == 1) {
        nn::NamedInitSources sources;
        for (const auto& [name, p] : model.NamedParameters()) {
          sources.emplace_back(name, std::make_shared<FailingSource>(p->shape));
        }
        const absl::Status init = nn::InitFromSources(model, sources);
        EXPECT_TRUE(init.ok()) << init;
      }
      got[rank.rank] = DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed).status();
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(absl::StrContains(got[1].message(), "cannot read this rank's copy"))
        << strategy << ": " << got[1];
    const std::string expected = std::string(strategy) == "full_shard"
                                     ? "initializing its FSDP units failed on rank(s) 1"
                                     : "materializing the model failed on rank(s) 1";
    EXPECT_TRUE(absl::StrContains(got[0].message(), expected)) << strategy << ": " << got[0];
  }
}

// --resume=latest read through each rank's view of the checkpoint directory
// (another host's, unshared) may name different steps: every rank refuses
// naming each rank's step, before any shard is read.
TEST(AgreeOnStepFolderTest, RanksThatResolvedDifferentStepsAllRefuse) {
  const DataParallelConfig config = ThreadsConfig("full_shard", 2);
  std::vector<absl::Status> same(2), differ(2);
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    same[rank.rank] = AgreeOnStepFolder(rank.pg, "/ck/step_000100/", "latest");
    differ[rank.rank] = AgreeOnStepFolder(
        rank.pg, rank.rank == 0 ? "/ck/step_000100" : "/other/ck/step_000090", "latest");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(same[r].ok()) << same[r];
    EXPECT_EQ(differ[r].code(), absl::StatusCode::kFailedPrecondition) << differ[r];
    EXPECT_TRUE(absl::StrContains(differ[r].message(),
                                  "--resume=latest: the ranks resolved different step folders "
                                  "(rank 0: step 100, rank 1: step 90; this rank: "))
        << differ[r];
  }
}

// --resume=auto resolved differently (a folder one rank does not see): every
// rank stops, the ones that would resume too.
TEST(AgreeOnResumingTest, RanksThatDisagreeAllStop) {
  const DataParallelConfig config = ThreadsConfig("full_shard", 2);
  std::vector<absl::Status> all(2), none(2), mixed(2);
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    all[rank.rank] = AgreeOnResuming(rank.pg, "latest", "/ck");
    none[rank.rank] = AgreeOnResuming(rank.pg, "", "/ck");
    mixed[rank.rank] = AgreeOnResuming(rank.pg, rank.rank == 0 ? "latest" : "", "/ck");
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(all[r].ok()) << all[r];
    EXPECT_TRUE(none[r].ok()) << none[r];
    EXPECT_EQ(mixed[r].code(), absl::StatusCode::kFailedPrecondition) << mixed[r];
    EXPECT_TRUE(absl::StrContains(mixed[r].message(),
                                  absl::StrCat("--resume=auto: some ranks found a checkpoint in "
                                               "/ck and others did not (this one ",
                                               r == 0 ? "did)" : "did not)")))
        << mixed[r];
  }
}

// A check of the resumed step that fails on one rank alone (here, the
// renamed-folder check: only rank 0's --checkpoint_dir holds the folder)
// stops every rank; the others used to go on into the first step and wait.
// A rank whose data loader refuses the checkpoint's state (its host's copy
// of the data differs) stops every rank before the first step.
TEST(DataParallelModelTest, ARestoreThatFailsOnOneRankFailsEveryRank) {
  const DataParallelConfig config = ThreadsConfig("ddp", 2);
  std::vector<absl::Status> got(2);
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    auto dp = DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    got[rank.rank] = (*dp)->AgreeOnRestore(
        rank.rank == 1 ? absl::InvalidArgumentError("the data differs") : absl::OkStatus());
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got[1].code(), absl::StatusCode::kInvalidArgument) << got[1];
  EXPECT_EQ(got[0].code(), absl::StatusCode::kAborted) << got[0];
  EXPECT_TRUE(absl::StrContains(got[0].message(),
                                "restoring the data loader and loss scale failed on rank(s) 1"))
      << got[0];
}

// A fresh start planned before rank 0 locked --checkpoint_dir: a run that
// saved into the folder meanwhile (here the first model, then gone) is
// refused on every rank, not replaced.
TEST(DataParallelModelTest, AFreshStartIsCheckedAgainUnderTheLock) {
  const std::string dir = ::testing::TempDir() + "/dp_saved_meanwhile";
  std::filesystem::remove_all(dir);
  const DataParallelConfig config = ThreadsConfig("full_shard", 2);
  std::vector<absl::Status> fresh(2);
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    {
      auto other = DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed);
      if (!other.ok()) return other.status();
      absl::Status ready = (*other)->PrepareToTrain(dir, "", false, false);
      if (!ready.ok()) return ready;
      TrainState state;
      state.step = 1;
      absl::Status saved = (*other)->SaveCheckpoint(dir, state);
      if (!saved.ok()) return saved;
    }
    mingpt::GPT again(Tiny());
    auto dp = DataParallelModel::Create(again, rank.pg, config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    fresh[rank.rank] = (*dp)->PrepareToTrain(dir, "", false, false);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(fresh[0].code(), absl::StatusCode::kInvalidArgument) << fresh[0];
  EXPECT_TRUE(absl::StrContains(fresh[0].message(),
                                "holds an earlier run's checkpoints (latest: step_000001)"))
      << fresh[0];
  EXPECT_FALSE(fresh[1].ok());
  EXPECT_TRUE(absl::StrContains(fresh[1].message(), "rank(s) 0")) << fresh[1];
}

// Ranks whose data loaders are configured differently (another copy of the
// data on one host) all stop at the start, naming the ranks that differ.
TEST(DataParallelModelTest, RanksWithOtherDataStopAtTheStart) {
  const DataParallelConfig config = ThreadsConfig("ddp", 3);
  for (const bool same : {true, false}) {
    std::vector<absl::Status> got(3);
    absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
      mingpt::GPT model(Tiny());
      auto dp = DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed);
      if (!dp.ok()) return dp.status();
      const std::string content = !same && rank.rank == 2 ? "bb" : "aa";
      got[rank.rank] = (*dp)->AgreeOnData("lm(byte_text(bytes=10,content=" + content + "))");
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < 3; ++r) {
      if (same) {
        EXPECT_TRUE(got[r].ok()) << got[r];
        continue;
      }
      EXPECT_EQ(got[r].code(), absl::StatusCode::kFailedPrecondition) << got[r];
      EXPECT_TRUE(absl::StrContains(got[r].message(),
                                    "the data loader of rank 2 is not configured as rank 0's"))
          << got[r];
    }
  }
}

TEST(DataParallelModelTest, AResumeCheckThatFailsOnOneRankStopsEveryRank) {
  const std::string root = ::testing::TempDir() + "/dp_resume_check";
  std::filesystem::remove_all(root);
  const DataParallelConfig config = ThreadsConfig("ddp", 2);
  std::vector<absl::Status> got(2);
  for (const bool resume : {false, true}) {
    absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
      mingpt::GPT model(Tiny());
      auto dp = DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed);
      if (!dp.ok()) return dp.status();
      if (!resume) {
        TrainState state;
        state.step = 1;
        state.loader_state = "step=1;test";
        absl::Status ready = (*dp)->PrepareCheckpointDir(root + "/ck");
        return ready.ok() ? (*dp)->SaveCheckpoint(root + "/ck", state) : ready;
      }
      got[rank.rank] = (*dp)->Resume(root + "/ck/step_000005",
                                     rank.rank == 0 ? root + "/ck" : root + "/other", "")
                           .status();
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    if (!resume) {
      std::filesystem::rename(root + "/ck/step_000001", root + "/ck/step_000005");
    }
  }
  EXPECT_EQ(got[0].code(), absl::StatusCode::kFailedPrecondition) << got[0];
  EXPECT_TRUE(absl::StrContains(got[0].message(), "holds step 1, but its folder is named "
                                                  "step_000005"))
      << got[0];
  EXPECT_EQ(got[1].code(), absl::StatusCode::kAborted) << got[1];
  EXPECT_TRUE(absl::StrContains(got[1].message(), "step_000005 failed on rank(s) 0")) << got[1];

  // The step's model alone (optimizer.safetensors removed): FSDP names
  // --init_from at once, not `checkpoint shard` (which refuses it too).
  std::filesystem::create_directories(root + "/alone");
  std::filesystem::copy(root + "/ck/step_000005", root + "/alone/step_000001");
  std::filesystem::remove(root + "/alone/step_000001/optimizer.safetensors");
  const DataParallelConfig fsdp = ThreadsConfig("full_shard", 2);
  absl::Status s = RunDataParallel(fsdp, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    auto dp = DataParallelModel::Create(model, rank.pg, fsdp, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    got[rank.rank] = (*dp)->Resume(root + "/alone/step_000001", "", "").status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (const absl::Status& rank : got) {
    EXPECT_EQ(rank.code(), absl::StatusCode::kDataLoss) << rank;
    EXPECT_TRUE(absl::StrContains(rank.message(), "holds the model alone")) << rank;
    EXPECT_FALSE(absl::StrContains(rank.message(), "checkpoint shard")) << rank;
  }
}

// ZeRO-1's clip sums the ranks' squares: a peer that is gone fails it with
// the collective's own code (as FSDP's clip), not an Internal error that
// hides a timeout from train's exit code and hint.
TEST(DataParallelModelTest, AZero1ClipWhosePeerIsGoneKeepsTheCollectivesCode) {
  const DataParallelConfig config = ThreadsConfig("zero1", 2);
  absl::Status got;
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    mingpt::GPT model(Tiny());
    auto dp = DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    if (rank.rank == 0) got = (*dp)->ClipGradNorm(1.0).status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(got.ok());
  EXPECT_NE(got.code(), absl::StatusCode::kInternal) << got;
  EXPECT_TRUE(absl::StrContains(got.message(), "[zero1] clip_grad_norm all_gather: ")) << got;
}

TEST(DataParallelModelTest, TiedWeightsMustStayInTheRootUnit) {
  const DataParallelConfig transformer = ThreadsConfig("full_shard", 1);
  const DataParallelConfig small_units = ThreadsConfig("full_shard", 1, "size:50");
  absl::Status s = RunDataParallel(transformer, [&](RankContext& rank) -> absl::Status {
    {
      mingpt::GPT model(Tiny());
      auto dp = DataParallelModel::Create(model, rank.pg, transformer, AdamW(), kSeed,
                                          {"transformer.wte.weight"});
      EXPECT_TRUE(dp.ok()) << dp.status();
      EXPECT_EQ((*dp)->Describe(), "FSDP FULL_SHARD, 3 units (auto_wrap transformer)");
    }
    {
      mingpt::GPT model(Tiny());
      auto dp = DataParallelModel::Create(model, rank.pg, small_units, AdamW(), kSeed,
                                          {"transformer.wte.weight"});
      EXPECT_FALSE(dp.ok());
      EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(dp.status().message(),
                                    "--auto_wrap=size:50 puts 'transformer.wte.weight' into the "
                                    "FSDP unit 'transformer.wte', but it must stay in the root"))
          << dp.status();
    }
    {  // Under bf16 a kept class's modules become units of their own.
      DataParallelConfig kept_embeddings = transformer;
      kept_embeddings.mixed_precision = precision::MixedPrecisionPolicy::Bf16();
      kept_embeddings.mixed_precision.fp32_module_classes = {"Embedding"};
      mingpt::GPT model(Tiny());
      auto dp = DataParallelModel::Create(model, rank.pg, kept_embeddings, AdamW(), kSeed,
                                          {"transformer.wte.weight"});
      EXPECT_FALSE(dp.ok());
      EXPECT_TRUE(absl::StrContains(dp.status().message(),
                                    "puts 'transformer.wte.weight' into the FSDP unit "
                                    "'transformer.wte'"))
          << dp.status();
    }
    {
      mingpt::GPT model(Tiny());
      auto dp = DataParallelModel::Create(model, rank.pg, transformer, AdamW(), kSeed,
                                          {"no.such.weight"});
      EXPECT_FALSE(dp.ok());
      EXPECT_TRUE(absl::StrContains(dp.status().message(), "no parameter 'no.such.weight'"));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// `body` on every rank of a threads world with a tiny minGPT under each
// strategy's DataParallelModel (the hybrid ones at world 4 in shard groups of
// 2, the others at world 2).
void ForEachStrategy(const std::function<absl::Status(RankContext&, mingpt::GPT&,
                                                      std::unique_ptr<DataParallelModel>&)>& body) {
  for (const std::string strategy : {"ddp", "zero1", "shard_grad_op", "full_shard", "no_shard",
                                     "hybrid_shard", "hybrid_shard_zero2"}) {
    SCOPED_TRACE(strategy);
    const bool hybrid = IsHybrid(*ParseStrategy(strategy));
    const DataParallelConfig config =
        ThreadsConfig(strategy, hybrid ? 4 : 2, "transformer", hybrid ? 2 : 0);
    absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
      mingpt::GPT model(Tiny());
      absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
          DataParallelModel::Create(model, rank.pg, config, AdamW(), kSeed, {});
      if (!dp.ok()) return dp.status();
      return body(rank, model, *dp);
    });
    ASSERT_TRUE(s.ok()) << s;
  }
}

// Evaluation holds no more memory afterwards than the strategy holds between
// steps: FSDP reshards the units a forward-only pass left gathered (the root;
// every unit under SHARD_GRAD_OP), DDP and ZeRO-1 keep what they always hold.
// Their parameter bytes after Evaluate equal those after a training step.
TEST(DataParallelModelTest, EvaluateLeavesTheMemoryOfATrainingStep) {
  ForEachStrategy([&](RankContext& rank, mingpt::GPT& model,
                      std::unique_ptr<DataParallelModel>& dp) -> absl::Status {
    const tensor::Tensor idx = Rows(RandomTokens(8), rank.rank, rank.world_size);  // (B, T)
    auto params = [&] {
      return rank.ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters).current;
    };
    const double loss = model.ForwardBackward(idx, idx);
    if (absl::Status st = dp->Step(); !st.ok()) return st;
    dp->ZeroGrad();
    const int64_t after_step = params();
    absl::StatusOr<double> eval = dp->Evaluate([&] { return model.Loss(idx, idx); });
    if (!eval.ok()) return eval.status();
    EXPECT_EQ(params(), after_step) << "rank " << rank.rank;
    EXPECT_NE(*eval, loss);  // evaluated with the stepped parameters
    return absl::OkStatus();
  });
}

// Generation during training: inside ForwardOnly every rank's DecodeLogits
// (through the units' hooks) over a prompt and two more tokens gives the
// logits of the forward over the whole sequence (LastLogits) at the stepped
// parameters, the same on every rank and bit for bit the same whether FSDP
// gathers the whole model once or unit by unit at each step; afterwards the
// model trains again, in training mode, with the parameter memory of a
// training step. Unit by unit holds less at its peak under the sharded
// strategies (the root and one block of the two; SHARD_GRAD_OP too, which
// keeps units from their forward to their backward in training, but frees
// them after a forward-only pass's forward), as much elsewhere (DDP, ZeRO-1
// and NO_SHARD hold the whole model).
TEST(DataParallelModelTest, ForwardOnlyDecodesTheSteppedModelWholeOrUnitByUnit) {
  using Gather = DataParallelModel::Gather;
  ForEachStrategy([&](RankContext& rank, mingpt::GPT& model,
                      std::unique_ptr<DataParallelModel>& dp) -> absl::Status {
    const tensor::Tensor idx = Rows(RandomTokens(8), rank.rank, rank.world_size);  // (B, T)
    // The same sequence on every rank (rank 0's rows): the same logits.
    const tensor::Tensor sequence =
        Rows(RandomTokens(8), 0, rank.world_size).Narrow(1, 0, 5).Contiguous();  // (B, 5)
    auto params = [&] {
      return rank.ledger.Stats(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters);
    };
    model.ForwardBackward(idx, idx);
    if (absl::Status st = dp->Step(); !st.ok()) return st;
    dp->ZeroGrad();
    const int64_t after_step = params().current;
    std::map<Gather, tensor::Tensor> decoded;  // (B, V)
    std::map<Gather, int64_t> peak;
    for (Gather gather : {Gather::kWholeModel, Gather::kPerUnit}) {
      rank.ledger.ResetPeaks();
      tensor::Tensor forward;  // (B, V)
      dp->ForwardOnly(
          [&] {
            EXPECT_FALSE(model.is_training());
            std::vector<nn::KvCache> caches;
            model.DecodeLogits(sequence.Narrow(1, 0, 3).Contiguous(), caches);  // the prompt
            model.DecodeLogits(sequence.Narrow(1, 3, 1).Contiguous(), caches);
            decoded[gather] = model.DecodeLogits(sequence.Narrow(1, 4, 1).Contiguous(), caches);
            forward = model.LastLogits(sequence);
          },
          gather);
      peak[gather] = params().peak;
      EXPECT_TRUE(model.is_training());
      EXPECT_EQ(params().current, after_step) << "rank " << rank.rank;
      EXPECT_TRUE(tensor::testing::AllClose(decoded[gather], forward, 1e-5, 1e-5))
          << "rank " << rank.rank;
    }
    EXPECT_TRUE(tensor::testing::AllClose(decoded[Gather::kPerUnit], decoded[Gather::kWholeModel],
                                          0.0, 0.0));
    const dist::FullyShardedModel* fsdp = dp->fsdp();
    if (fsdp != nullptr && fsdp->strategy() != dist::ShardingStrategy::kNoShard) {
      EXPECT_LT(peak[Gather::kPerUnit], peak[Gather::kWholeModel]) << "rank " << rank.rank;
    } else {
      EXPECT_EQ(peak[Gather::kPerUnit], peak[Gather::kWholeModel]) << "rank " << rank.rank;
    }
    double sum = 0.0;
    for (float v : decoded[Gather::kPerUnit].ToVector<float>()) sum += v;
    absl::StatusOr<double> mean = dist::MeanOverRanks(rank.pg, sum);
    if (!mean.ok()) return mean.status();
    EXPECT_NEAR(*mean, sum, 1e-6 * (1.0 + std::abs(sum))) << "rank " << rank.rank;
    EXPECT_TRUE(std::isfinite(model.ForwardBackward(idx, idx)));  // training goes on
    return dp->Step();
  });
}

// What ForwardOnly communicates under FULL_SHARD (the root and one unit per
// block, 2 blocks): gathering the whole model is one all-gather per unit
// and the forwards add none; unit by unit gathers the root once and each
// block at each forward (three decoding steps and a LastLogits: 1 + 4 x 2),
// not the root again at each.
TEST(DataParallelModelTest, ForwardOnlyAllGathersWholeOnceOrTheBlocksPerForward) {
  using Gather = DataParallelModel::Gather;
  const DataParallelConfig config = ThreadsConfig("full_shard", 2);
  absl::Status s = RunDataParallel(config, [&](RankContext& rank) -> absl::Status {
    auto counts = std::make_shared<dp_testing::Counts>();
    dp_testing::CountingGroup pg(rank.pg, counts);
    mingpt::GPT model(Tiny());
    absl::StatusOr<std::unique_ptr<DataParallelModel>> dp =
        DataParallelModel::Create(model, pg, config, AdamW(), kSeed);
    if (!dp.ok()) return dp.status();
    EXPECT_EQ((*dp)->fsdp()->num_units(), 3);
    const tensor::Tensor sequence =
        Rows(RandomTokens(8), 0, rank.world_size).Narrow(1, 0, 5).Contiguous();  // (B, 5)
    for (Gather gather : {Gather::kWholeModel, Gather::kPerUnit}) {
      const int64_t before = counts->all_gathers;
      (*dp)->ForwardOnly(
          [&] {
            std::vector<nn::KvCache> caches;
            model.DecodeLogits(sequence.Narrow(1, 0, 3).Contiguous(), caches);
            model.DecodeLogits(sequence.Narrow(1, 3, 1).Contiguous(), caches);
            model.DecodeLogits(sequence.Narrow(1, 4, 1).Contiguous(), caches);
            model.LastLogits(sequence);
          },
          gather);
      EXPECT_EQ(counts->all_gathers - before, gather == Gather::kWholeModel ? 3 : 1 + 4 * 2)
          << (gather == Gather::kWholeModel ? "whole model" : "unit by unit");
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// ---- Memory ----

TEST(MemoryTest, TableAndLine) {
  tensor::MemoryLedger a, b;
  a.RecordAlloc(tensor::Device::Cpu(), tensor::MemoryCategory::kParameters, 1 << 20);
  a.RecordAlloc(tensor::Device::Cpu(), tensor::MemoryCategory::kActivations, 3 << 19);
  b.RecordAlloc(tensor::Device::Cpu(), tensor::MemoryCategory::kOptimizerState, 2 << 20);
  b.RecordFree(tensor::Device::Cpu(), tensor::MemoryCategory::kOptimizerState, 2 << 20);
  EXPECT_EQ(PerRankMemoryTable({&a, &b}),
            "rank       params       grads       optim       activ        comm        temp       "
            "total\n"
            "0            1.00        0.00        0.00        1.50        0.00        0.00        "
            "2.50\n"
            "1            0.00        0.00        2.00        0.00        0.00        0.00        "
            "2.00\n");
  EXPECT_EQ(RankMemoryLine(1, b),
            "peak memory of rank 1 by category (MiB, ledger): params 0.00 grads 0.00 optim 2.00 "
            "activ 0.00 comm 0.00 temp 0.00 total 2.00");
}

}  // namespace
}  // namespace train
