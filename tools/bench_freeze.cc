// Fine-tuning with frozen parameters: step time and memory of minGPT with
// nothing frozen and with each --freeze set, side by side in one process:
//
//   ./bazelw run //tools:bench_freeze -- --preset=gpt-mini
//   ./bazelw run //tools:bench_freeze -- --preset=gpt-mini --world_size=2   # FSDP FULL_SHARD
//
// --world_size=1 trains one process (no wrapper); N > 1: FSDP FULL_SHARD with
// one unit per Block over N ranks of the threads engine, and frozen leaf
// modules outside the Blocks in units of their own, as the train binaries
// (dist::WrapPolicy::FrozenLeavesApart). Every variant (one
// per --freeze_sets entry, "none" first) has its own model, AdamW and memory
// ledger; each step runs every variant in turn on the same batch, ABC.. then
// ..CBA, so drifts in machine load hit all alike. A step = forward + backward
// (FSDP: with its collectives) + AdamW step + zero-grad, timed on rank 0
// between barriers. Reported per variant: its trainable parameters, median
// ms/step, the median of its per-step ratios to the first variant ("paired"),
// rank 0's peak MiB of parameters, gradients, optimizer state and activations
// from its ledger, and (FSDP) its all-gathers per step. What freezing saves:
// the weight gradients of frozen layers, the backward below the lowest
// trainable block (with the embeddings frozen), gradient memory, optimizer
// state, and under FSDP the reduce-scatters of frozen units and the backward
// all-gathers of the units the backward skips.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "models/common/command_line.h"
#include "models/data/lm_loader.h"
#include "models/data/random_tokens.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "nn/freeze.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "tensor/memory_ledger.h"

ABSL_FLAG(std::string, preset, "gpt-mini", "minGPT preset");
ABSL_FLAG(int64_t, batch_size, 8, "rows per rank and step");
ABSL_FLAG(int64_t, seq_len, 128, "tokens per row");
ABSL_FLAG(int64_t, steps, 6, "timed steps of each variant");
ABSL_FLAG(int64_t, warmup, 1, "untimed steps of each variant first");
ABSL_FLAG(int, world_size, 1, "1: one process; N > 1: FSDP FULL_SHARD over N thread ranks");
ABSL_FLAG(std::string, freeze_sets, "",
          "'|'-separated variants, each a --freeze value of the train binaries ('none': nothing "
          "frozen, the reference of the ratios); empty: none | the embeddings | the embeddings "
          "and the lower half of the preset's blocks | the whole transformer");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct Variant {
  std::string freeze;  // "none" or patterns
  int64_t trainable = 0, total = 0;
  std::vector<double> step_ms;  // rank 0's timed steps
  double median_ms = 0, paired = 0;
  double params_mib = 0, grads_mib = 0, optim_mib = 0, activ_mib = 0;
  double all_gathers_per_step = 0;
  int units = 0;  // FSDP
};

absl::Status Run(const mingpt::GptConfig& config, std::vector<Variant>& variants) {
  const int world = absl::GetFlag(FLAGS_world_size);
  const int64_t B = absl::GetFlag(FLAGS_batch_size), T = absl::GetFlag(FLAGS_seq_len);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  for (const auto& [flag, value, least] :
       {std::tuple<const char*, int64_t, int64_t>{"--world_size", world, 1},
        {"--batch_size", B, 1}, {"--seq_len", T, 1}, {"--steps", steps, 1},
        {"--warmup", warmup, 0}}) {
    if (value < least) {
      return absl::InvalidArgumentError(absl::StrCat(flag, "=", value, " must be >= ", least));
    }
  }
  if (T > config.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("--seq_len=", T, " exceeds the block_size ",
                                                   config.block_size, " of ", config.name));
  }
  auto source = data::RandomTokenSource::Create(7, config.vocab_size);
  if (!source.ok()) return source.status();
  std::shared_ptr<const data::TokenSource> src(std::move(*source));
  const int n = static_cast<int>(variants.size());
  std::mutex mu;
  dist::ThreadWorld tw(world);
  return dist::RunRanks(tw, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
    auto loader = data::LmLoader::Create(src, {B, rank, world}, T);
    if (!loader.ok()) return loader.status();
    // Per variant: a ledger, a model (FSDP-sharded when world > 1) and an AdamW.
    std::vector<std::unique_ptr<tensor::MemoryLedger>> ledgers(n);
    std::vector<std::unique_ptr<mingpt::GPT>> models(n);
    std::vector<std::unique_ptr<dist::FullyShardedModel>> sharded(n);
    std::vector<std::unique_ptr<optim::Optimizer>> opt(n);
    for (int v = 0; v < n; ++v) {
      ledgers[v] = std::make_unique<tensor::MemoryLedger>();
      tensor::ScopedLedger scoped(ledgers[v].get());
      models[v] = std::make_unique<mingpt::GPT>(config);
      if (variants[v].freeze != "none") {
        absl::StatusOr<std::vector<std::string>> patterns =
            nn::ParseFreezePatterns(variants[v].freeze);
        if (!patterns.ok()) return patterns.status();
        absl::StatusOr<std::vector<std::string>> frozen =
            nn::FreezeParameters(*models[v], *patterns);
        if (!frozen.ok()) return frozen.status();
      }
      const nn::TrainableCount count = nn::CountTrainable(*models[v]);
      if (rank == 0) {
        variants[v].trainable = count.trainable;
        variants[v].total = count.total;
      }
      if (world == 1) {
        models[v]->Materialize(1);
      } else {
        dist::FsdpOptions o;
        o.strategy = dist::ShardingStrategy::kFullShard;
        // As the train binaries: frozen embeddings etc. in units of their own.
        o.policy = dist::WrapPolicy::FrozenLeavesApart(dist::WrapPolicy::Transformer({"Block"}));
        o.seed = 1;
        sharded[v] = dist::FullyShard(*models[v], pg, o);
      }
      optim::AdamWOptions ao;
      ao.lr = 1e-4;
      ao.weight_decay = 0.1;
      auto adamw = optim::AdamW::Create(ao);
      if (!adamw.ok()) return adamw.status();
      opt[v] = std::move(*adamw);
    }
    std::vector<std::vector<double>> mine(n);
    std::vector<int64_t> gathers(n, 0);
    for (int64_t step = 0; step < warmup + steps; ++step) {
      const data::LmBatch batch = loader->Next();
      for (int j = 0; j < n; ++j) {
        const int v = (step % 2 == 0) ? j : n - 1 - j;  // ABC.. ..CBA
        tensor::ScopedLedger scoped(ledgers[v].get());
        if (step == warmup) ledgers[v]->ResetPeaks();  // the timed steps' peaks
        absl::Status s = pg.BarrierSync();
        if (!s.ok()) return s;
        const int64_t gathers_before = sharded[v] ? sharded[v]->all_gathers() : 0;
        const auto t0 = Clock::now();
        models[v]->ForwardBackward(batch.inputs, batch.targets);
        if (sharded[v]) {
          opt[v]->Step(sharded[v]->ParamRefs());
          sharded[v]->ZeroGrad();
        } else {
          opt[v]->Step(optim::FromModule(*models[v]));
          models[v]->ZeroGrad();
        }
        s = pg.BarrierSync();
        if (!s.ok()) return s;
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (step >= warmup) {
          mine[v].push_back(ms);
          if (sharded[v]) gathers[v] += sharded[v]->all_gathers() - gathers_before;
        }
      }
    }
    if (rank != 0) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu);
    const tensor::Device cpu = tensor::Device::Cpu();
    for (int v = 0; v < n; ++v) {
      Variant& r = variants[v];
      r.step_ms = mine[v];
      r.median_ms = Median(mine[v]);
      std::vector<double> ratios;
      for (size_t i = 0; i < mine[v].size(); ++i) ratios.push_back(mine[v][i] / mine[0][i]);
      r.paired = Median(ratios);
      using tensor::MemoryCategory;
      r.params_mib = MiB(ledgers[v]->Stats(cpu, MemoryCategory::kParameters).peak);
      r.grads_mib = MiB(ledgers[v]->Stats(cpu, MemoryCategory::kGradients).peak);
      r.optim_mib = MiB(ledgers[v]->Stats(cpu, MemoryCategory::kOptimizerState).peak);
      r.activ_mib = MiB(ledgers[v]->Stats(cpu, MemoryCategory::kActivations).peak);
      r.all_gathers_per_step = static_cast<double>(gathers[v]) / steps;
      r.units = sharded[v] ? sharded[v]->num_units() : 0;
    }
    return absl::OkStatus();
  });
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv,
      "Step time and memory of minGPT with parameters frozen, side by side: "
      "bench_freeze [--preset=gpt-mini] [--world_size=N] [--freeze_sets='none|a,b|...']");
  absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::fprintf(stderr, "bench_freeze: --preset: %s\n", config.status().ToString().c_str());
    return 2;
  }
  config->dropout = 0.0f;
  std::vector<Variant> variants;
  std::string sets = absl::GetFlag(FLAGS_freeze_sets);
  if (sets.empty()) {  // the lower half of this preset's blocks (gpt-mini: 0-2 of 6)
    std::string lower = "transformer.wte,transformer.wpe";
    for (int64_t b = 0; b < config->n_layer / 2; ++b) absl::StrAppend(&lower, ",transformer.h.", b);
    sets = absl::StrCat("none|transformer.wte,transformer.wpe|", lower, "|transformer");
  }
  for (absl::string_view set : absl::StrSplit(sets, '|')) {
    if (set.empty()) {
      std::fprintf(stderr, "bench_freeze: --freeze_sets='%s' has an empty set (between two '|', "
                   "or at an end); 'none' names the unfrozen one\n", sets.c_str());
      return 2;
    }
    variants.push_back({std::string(set)});
  }
  if (variants.empty() || variants[0].freeze != "none") {
    std::fprintf(stderr, "bench_freeze: --freeze_sets must start with 'none' (the reference)\n");
    return 2;
  }
  const absl::Status s = Run(*config, variants);
  if (!s.ok()) {
    std::fprintf(stderr, "bench_freeze: %s\n", s.ToString().c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const int world = absl::GetFlag(FLAGS_world_size);
  std::printf("%s, batch %lld x %lld tokens per rank, AdamW, %s, rank 0's peaks (MiB)\n",
              config->ToString().c_str(), static_cast<long long>(absl::GetFlag(FLAGS_batch_size)),
              static_cast<long long>(absl::GetFlag(FLAGS_seq_len)),
              world == 1
                  ? "one process"
                  : absl::StrCat("FSDP FULL_SHARD per Block over ", world, " ranks").c_str());
  int width = 6;  // the "frozen" column fits the longest set
  for (const Variant& r : variants) width = std::max(width, static_cast<int>(r.freeze.size()));
  std::printf("%-*s %9s %9s %7s %8s %8s %8s %8s %6s %8s\n", width, "frozen", "train M", "ms/step",
              "paired", "params", "grads", "optim", "activ", "units", "gathers");
  std::string json = "[";
  for (size_t v = 0; v < variants.size(); ++v) {
    const Variant& r = variants[v];
    std::printf("%-*s %9.2f %9.1f %7.3f %8.2f %8.2f %8.2f %8.2f %6d %8.1f\n", width,
                r.freeze.c_str(), r.trainable / 1e6, r.median_ms, r.paired, r.params_mib,
                r.grads_mib, r.optim_mib, r.activ_mib, r.units, r.all_gathers_per_step);
    absl::StrAppendFormat(
        &json,
        "%s{\"freeze\":\"%s\",\"trainable\":%d,\"total\":%d,\"world_size\":%d,\"median_ms\":%.3f,"
        "\"paired_ratio\":%.4f,\"params_mib\":%.3f,\"grads_mib\":%.3f,\"optim_mib\":%.3f,"
        "\"activ_mib\":%.3f,\"units\":%d,\"all_gathers_per_step\":%.2f}",
        v ? "," : "", r.freeze, r.trainable, r.total, world, r.median_ms, r.paired, r.params_mib,
        r.grads_mib, r.optim_mib, r.activ_mib, r.units, r.all_gathers_per_step);
  }
  json += "]\n";
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    out << json;
    if (!out) {
      std::fprintf(stderr, "bench_freeze: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}
