// Step time of DDP vs FSDP FULL_SHARD (transformer auto-wrap, one unit per
// "Block") at one world size of the `threads` engine, fp32 + AdamW, random
// tokens, measured side by side in one process:
//
//   ./bazelw run //tools:bench_throughput -- --presets=gpt-mini --world_size=2
//
// The two strategies are interleaved step by step: in each of --reps runs (a
// fresh world) every rank builds a DDP-wrapped GPT and an FSDP-sharded GPT
// (each with its own AdamW) and steps them alternately, ABBA ABBA..., on the
// same batch, --warmup untimed + --steps timed steps each, so slow drifts in
// machine load hit both alike. A step = forward + backward (incl. the
// gradient collectives) + AdamW step + zero-grad, timed on every rank; the
// step's time is the max over ranks. Reported: median ms/step over all timed
// steps of a strategy, tokens/s (global: world * batch * seq_len / step time),
// the FSDP/DDP ratio of the medians and the median of the per-step-pair ratios.
//
// Note: FSDP here issues its all-gathers / reduce-scatters synchronously (no
// prefetch, no overlap), while DDP overlaps its bucketed all-reduces with
// backward.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "models/data/lm_loader.h"
#include "models/data/random_tokens.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"

ABSL_FLAG(std::string, presets, "gpt-mini", "comma-separated minGPT presets");
ABSL_FLAG(int, world_size, 2, "ranks of the threads engine");
ABSL_FLAG(int64_t, vocab_size, 50257, "vocabulary size (random tokens)");
ABSL_FLAG(int64_t, batch_size, 4, "sequences per rank");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, warmup, 2, "untimed steps per run");
ABSL_FLAG(int64_t, steps, 6, "timed steps per run");
ABSL_FLAG(int, reps, 2, "independent runs (fresh world, models, optimizers)");
ABSL_FLAG(double, target_ratio, 1.15, "target FSDP/DDP step-time ratio (reported only)");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string preset, strategy;
  int units = 0;
  std::vector<double> step_ms;  // all timed steps of all runs (max over ranks)
  std::vector<double> run_median_ms;
  double median_ms = 0, tokens_per_s = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One world, both strategies side by side on every rank: a DDP-wrapped GPT and
// an FSDP-sharded GPT (separate modules, separate optimizers, the same batch),
// stepped alternately ABBA ABBA ... so that any drift in machine load hits both.
absl::Status RunPair(const mingpt::GptConfig& config, int world, Result res[2],
                     std::vector<double>& pair_ratios) {
  const int64_t B = absl::GetFlag(FLAGS_batch_size), T = absl::GetFlag(FLAGS_seq_len);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  auto source = data::RandomTokenSource::Create(7, config.vocab_size);
  if (!source.ok()) return source.status();
  std::shared_ptr<const data::TokenSource> src(std::move(*source));
  std::mutex mu;
  // times[rank][k]: timed steps of strategy k (0 DDP, 1 FSDP) on that rank.
  std::vector<std::vector<std::vector<double>>> times(world, std::vector<std::vector<double>>(2));
  int units = 0;
  dist::ThreadWorld tw(world);
  absl::Status s = dist::RunRanks(tw, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
    auto loader = data::LmLoader::Create(src, {B, rank, world}, T);
    if (!loader.ok()) return loader.status();
    optim::AdamWOptions ao;
    ao.lr = 1e-4;
    std::unique_ptr<optim::Optimizer> opt[2];
    for (auto& o : opt) {
      auto adamw = optim::AdamW::Create(ao);
      if (!adamw.ok()) return adamw.status();
      o = std::move(*adamw);
    }
    mingpt::GPT model_ddp(config), model_fsdp(config);
    model_ddp.Materialize(1);
    dist::DistributedDataParallel ddp(model_ddp, pg);
    dist::FsdpOptions o;
    o.strategy = dist::ShardingStrategy::kFullShard;
    o.policy = dist::WrapPolicy::Transformer({"Block"});
    o.seed = 1;
    std::unique_ptr<dist::FullyShardedModel> fsdp = dist::FullyShard(model_fsdp, pg, o);
    std::vector<double> mine[2];
    for (int64_t step = 0; step < warmup + steps; ++step) {
      data::LmBatch batch = loader->Next();
      for (int j = 0; j < 2; ++j) {
        const int k = (step % 2 == 0) ? j : 1 - j;  // ABBA
        const auto t0 = Clock::now();
        if (k == 0) {
          model_ddp.ForwardBackward(batch.inputs, batch.targets);
          absl::Status st = ddp.FinishBackward();
          if (!st.ok()) return st;
          opt[0]->Step(optim::FromModule(model_ddp));
          ddp.ZeroGrad();
        } else {
          model_fsdp.ForwardBackward(batch.inputs, batch.targets);
          opt[1]->Step(fsdp->ParamRefs());
          fsdp->ZeroGrad();
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (step >= warmup) mine[k].push_back(ms);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    times[rank][0] = std::move(mine[0]);
    times[rank][1] = std::move(mine[1]);
    if (rank == 0) units = fsdp->num_units();
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  std::vector<double> run[2];
  for (int k = 0; k < 2; ++k) {
    for (int64_t i = 0; i < steps; ++i) {
      double m = 0;
      for (int r = 0; r < world; ++r) m = std::max(m, times[r][k][i]);
      run[k].push_back(m);
    }
    res[k].run_median_ms.push_back(Median(run[k]));
    res[k].step_ms.insert(res[k].step_ms.end(), run[k].begin(), run[k].end());
  }
  for (int64_t i = 0; i < steps; ++i) pair_ratios.push_back(run[1][i] / run[0][i]);
  res[1].units = units;
  return absl::OkStatus();
}

std::string Label(const std::string& s) { return s == "ddp" ? "DDP" : "FULL_SHARD+wrap"; }

std::string JsonList(const std::vector<double>& v) {
  std::vector<std::string> items;
  for (double x : v) items.push_back(absl::StrCat(x));
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

int Main() {
  const std::vector<std::string> presets = absl::StrSplit(absl::GetFlag(FLAGS_presets), ',');
  const int world = absl::GetFlag(FLAGS_world_size);
  const int reps = absl::GetFlag(FLAGS_reps);
  const int64_t B = absl::GetFlag(FLAGS_batch_size), T = absl::GetFlag(FLAGS_seq_len);
  const double target = absl::GetFlag(FLAGS_target_ratio);
  if (world < 1 || reps < 1 || absl::GetFlag(FLAGS_steps) < 1) {
    std::fprintf(stderr, "bench_throughput: error: --world_size, --reps, --steps must be >= 1\n");
    return 2;
  }
  const double tokens_per_step = static_cast<double>(world) * B * T;
  std::printf(
      "step time, threads engine N=%d | fp32, AdamW | batch %lld x %lld tokens per rank, vocab "
      "%lld | %d runs x (%lld warmup + %lld timed steps), ABBA per step\n",
      world, static_cast<long long>(B), static_cast<long long>(T),
      static_cast<long long>(absl::GetFlag(FLAGS_vocab_size)), reps,
      static_cast<long long>(absl::GetFlag(FLAGS_warmup)),
      static_cast<long long>(absl::GetFlag(FLAGS_steps)));
  std::printf("%-10s %-15s %5s | %10s %10s %10s | %-20s\n", "preset", "strategy", "units",
              "median ms", "min ms", "tokens/s", "median ms per run");
  std::vector<std::string> json_rows;
  bool all_within = true;
  for (const std::string& preset : presets) {
    absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset(preset);
    if (!config.ok()) {
      std::fprintf(stderr, "bench_throughput: error: %s\n",
                   std::string(config.status().message()).c_str());
      return 2;
    }
    config->vocab_size = absl::GetFlag(FLAGS_vocab_size);
    config->dropout = 0;
    if (T > config->block_size) {
      std::fprintf(stderr, "bench_throughput: error: --seq_len exceeds block_size of %s\n",
                   preset.c_str());
      return 2;
    }
    Result res[2];
    const std::string strategies[2] = {"ddp", "full_shard_wrap"};
    std::vector<double> pair_ratios;
    for (int r = 0; r < 2; ++r) {
      res[r].preset = preset;
      res[r].strategy = strategies[r];
    }
    for (int r = 0; r < reps; ++r) {
      absl::Status s = RunPair(*config, world, res, pair_ratios);
      if (!s.ok()) {
        std::fprintf(stderr, "bench_throughput: error: %s: %s\n", preset.c_str(),
                     std::string(s.message()).c_str());
        return 1;
      }
    }
    for (Result& r : res) {
      r.median_ms = Median(r.step_ms);
      r.tokens_per_s = tokens_per_step / (r.median_ms / 1000.0);
      std::vector<std::string> per_run;
      for (double m : r.run_median_ms) per_run.push_back(absl::StrFormat("%.1f", m));
      std::printf("%-10s %-15s %5s | %10.1f %10.1f %10.0f | %s\n", preset.c_str(),
                  Label(r.strategy).c_str(), r.units ? absl::StrCat(r.units).c_str() : "-",
                  r.median_ms, *std::min_element(r.step_ms.begin(), r.step_ms.end()),
                  r.tokens_per_s, absl::StrJoin(per_run, " ").c_str());
    }
    const double ratio = res[1].median_ms / res[0].median_ms;
    const double paired = Median(pair_ratios);
    const bool within = ratio <= target;
    all_within = all_within && within;
    std::printf(
        "%-10s FSDP/DDP step-time ratio: %.3f of medians, %.3f median of paired steps "
        "(target <= %.2f: %s)\n",
        preset.c_str(), ratio, paired, target, within ? "yes" : "NO");
    std::fflush(stdout);
    for (const Result& r : res) {
      json_rows.push_back(absl::StrCat(
          "{\"preset\":\"", preset, "\",\"strategy\":\"", Label(r.strategy), "\",\"units\":",
          r.units, ",\"median_ms\":", r.median_ms, ",\"tokens_per_s\":", r.tokens_per_s,
          ",\"run_median_ms\":", JsonList(r.run_median_ms), ",\"step_ms\":", JsonList(r.step_ms),
          ",\"fsdp_over_ddp\":", ratio,
          ",\"fsdp_over_ddp_paired_median\":", paired, "}"));
    }
  }
  std::printf(
      "FSDP issues its collectives synchronously (no prefetch/overlap); DDP overlaps bucketed\n"
      "all-reduce with backward. Step time = max over ranks of fwd+bwd+collectives+AdamW+zero.\n");
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    out << "{\"world_size\":" << world << ",\"batch_size\":" << B << ",\"seq_len\":" << T
        << ",\"vocab_size\":" << absl::GetFlag(FLAGS_vocab_size)
        << ",\"warmup\":" << absl::GetFlag(FLAGS_warmup)
        << ",\"steps\":" << absl::GetFlag(FLAGS_steps) << ",\"reps\":" << reps
        << ",\"target_ratio\":" << target
        << ",\"all_within_target\":" << (all_within ? "true" : "false") << ",\"rows\":["
        << absl::StrJoin(json_rows, ",") << "]}\n";
    if (!out) {
      std::fprintf(stderr, "bench_throughput: error: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Step time of DDP vs FSDP FULL_SHARD (+auto-wrap), interleaved.");
  absl::ParseCommandLine(argc, argv);
  return Main();
}
