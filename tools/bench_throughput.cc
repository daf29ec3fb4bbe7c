// Step time of DDP vs FSDP FULL_SHARD (transformer auto-wrap, one unit per
// "Block") without and with prefetch, and ZeRO-1, at one world size of the
// `threads` engine, AdamW, random tokens, in fp32 and in bf16 mixed precision
// (bf16 compute and gradient reduction over fp32 masters, as the train
// binaries' --precision=bf16), measured side by side in one process:
//
//   ./bazelw run //tools:bench_throughput -- --presets=gpt-mini --world_size=2
//
// The four strategies times the precisions are interleaved step by step: in
// each of --reps runs (a fresh world) every rank builds, per precision, a
// DDP-wrapped GPT, two FSDP-sharded GPTs and a ZeRO-1 GPT (each with its own
// AdamW) and steps all of them in turn, ABCD.. ..DCBA, on the same batch,
// --warmup untimed + --steps timed steps each, so slow drifts in machine load
// hit all alike. "FULL_SHARD+wrap" issues each unit's
// all-gather when the unit runs (backward_prefetch NONE, one all-gather in
// flight); "+prefetch" uses --backward_prefetch and --forward_prefetch with
// --max_inflight_all_gathers (reduce-scatters overlap the next unit's
// backward in both). DDP and ZeRO-1 use --bucket_cap_mb buckets. A step =
// forward + backward (incl. the gradient collectives) + AdamW step (ZeRO-1:
// on its slices bucket by bucket, each bucket's all-gather started after its
// step) + zero-grad, timed on every rank; the
// step's time is the max over ranks. Reported: median ms/step over all timed
// steps of a strategy, tokens/s (global: world * batch * seq_len / step time),
// the ratio to DDP (of the same precision) of the medians and the median of
// the per-step-pair ratios, and each strategy's bf16 / fp32 step time (medians
// and paired steps).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "dist/zero1.h"
#include "models/common/command_line.h"
#include "models/common/train_setup.h"
#include "models/data/lm_loader.h"
#include "models/data/random_tokens.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "precision/dtype_support.h"
#include "precision/policy.h"

ABSL_FLAG(std::string, presets, "gpt-mini", "comma-separated minGPT presets");
ABSL_FLAG(int, world_size, 2, "ranks of the threads engine");
ABSL_FLAG(std::string, precision, "fp32,bf16",
          "comma-separated subset of fp32, bf16 (bf16 compute and gradient reduction over fp32 "
          "masters, as --precision=bf16 of the train binaries)");
ABSL_FLAG(int64_t, vocab_size, 50257, "vocabulary size (random tokens)");
ABSL_FLAG(int64_t, batch_size, 4, "sequences per rank");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, warmup, 2, "untimed steps per run");
ABSL_FLAG(int64_t, steps, 6, "timed steps per run");
ABSL_FLAG(int, reps, 2, "independent runs (fresh world, models, optimizers)");
ABSL_FLAG(double, target_ratio, 1.15, "target FSDP/DDP step-time ratio (reported only)");
ABSL_FLAG(std::string, backward_prefetch, "pre", "the prefetching FSDP's: pre, post or none");
ABSL_FLAG(bool, forward_prefetch, true, "the prefetching FSDP's forward prefetch");
ABSL_FLAG(int, max_inflight_all_gathers, 2, "the prefetching FSDP's limit");
ABSL_FLAG(double, bucket_cap_mb, 25,
          "DDP's and ZeRO-1's gradient buckets (MiB of fp32 gradients); a cap above the model "
          "gives one bucket, reduced when backward ends (no overlap)");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string preset, strategy;
  bool mixed = false;
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

// DDP, FSDP without prefetch, FSDP with prefetch, ZeRO-1: the strategies of
// one precision. A run steps kNumStrategies * precisions variants, variant
// p * kNumStrategies + k being strategy k in precision p.
constexpr int kNumStrategies = 4;
constexpr int kDdp = 0, kPrefetch = 2, kZero1 = 3;
const char* const kStrategies[kNumStrategies] = {"ddp", "full_shard_wrap",
                                                 "full_shard_wrap_prefetch", "zero1"};

absl::StatusOr<dist::BackwardPrefetch> ParsePrefetch(const std::string& name) {
  if (name == "pre") return dist::BackwardPrefetch::kPre;
  if (name == "post") return dist::BackwardPrefetch::kPost;
  if (name == "none") return dist::BackwardPrefetch::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--backward_prefetch='", name, "' is not one of pre, post, none"));
}

// One world, every variant side by side on every rank: per precision a
// DDP-wrapped GPT, two FSDP-sharded GPTs and a ZeRO-1 GPT (separate modules,
// separate optimizers, the same batch), stepped in turn ABCD.. ..DCBA so that
// any drift in machine load hits all. res[v], v = p * kNumStrategies + k;
// pair_ratios[v]: per timed step, variant v's time over its precision's DDP's;
// precision_ratios[k]: per timed step, strategy k's bf16 time over its fp32
// time (when both precisions run).
absl::Status RunSet(const mingpt::GptConfig& config, int world, const std::vector<bool>& mixed,
                    std::vector<Result>& res, std::vector<std::vector<double>>& pair_ratios,
                    std::vector<double> precision_ratios[kNumStrategies]) {
  const int64_t B = absl::GetFlag(FLAGS_batch_size), T = absl::GetFlag(FLAGS_seq_len);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  absl::StatusOr<dist::BackwardPrefetch> prefetch =
      ParsePrefetch(absl::GetFlag(FLAGS_backward_prefetch));
  if (!prefetch.ok()) return prefetch.status();
  auto source = data::RandomTokenSource::Create(7, config.vocab_size);
  if (!source.ok()) return source.status();
  std::shared_ptr<const data::TokenSource> src(std::move(*source));
  const int num_variants = static_cast<int>(mixed.size()) * kNumStrategies;
  std::mutex mu;
  // times[rank][v]: timed steps of variant v on that rank.
  std::vector<std::vector<std::vector<double>>> times(
      world, std::vector<std::vector<double>>(num_variants));
  int units = 0;
  dist::ThreadWorld tw(world);
  absl::Status s = dist::RunRanks(tw, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
    auto loader = data::LmLoader::Create(src, {B, rank, world}, T);
    if (!loader.ok()) return loader.status();
    optim::AdamWOptions ao;
    ao.lr = 1e-4;
    std::vector<std::unique_ptr<optim::Optimizer>> opt(num_variants);
    for (auto& o : opt) {
      auto adamw = optim::AdamW::Create(ao);
      if (!adamw.ok()) return adamw.status();
      o = std::move(*adamw);
    }
    // Per variant: its model and what wraps it (one of ddp, zero1, sharded).
    std::vector<std::unique_ptr<mingpt::GPT>> models(num_variants);
    std::vector<std::unique_ptr<dist::DistributedDataParallel>> ddp(num_variants);
    std::vector<std::unique_ptr<dist::Zero1>> zero1(num_variants);
    std::vector<std::unique_ptr<dist::FullyShardedModel>> sharded(num_variants);
    const double cap = absl::GetFlag(FLAGS_bucket_cap_mb);
    for (int v = 0; v < num_variants; ++v) {
      const int k = v % kNumStrategies;
      const precision::MixedPrecisionPolicy policy = mixed[v / kNumStrategies]
                                                         ? precision::MixedPrecisionPolicy::Bf16()
                                                         : precision::MixedPrecisionPolicy::Fp32();
      models[v] = std::make_unique<mingpt::GPT>(config);
      if (k == kDdp) {
        models[v]->Materialize(1);
        dist::DdpOptions o;
        o.bucket_cap_mb = cap;
        o.mixed_precision = policy;
        ddp[v] = std::make_unique<dist::DistributedDataParallel>(*models[v], pg, o);
      } else if (k == kZero1) {
        models[v]->Materialize(1);
        dist::Zero1Options o;
        o.bucket_cap_mb = cap;
        o.mixed_precision = policy;
        zero1[v] = std::make_unique<dist::Zero1>(*models[v], pg, std::move(opt[v]), o);
      } else {
        dist::FsdpOptions o;
        o.strategy = dist::ShardingStrategy::kFullShard;
        o.policy = dist::WrapPolicy::Transformer({"Block"});
        o.seed = 1;
        o.mixed_precision = policy;
        if (k == kPrefetch) {
          o.backward_prefetch = *prefetch;
          o.forward_prefetch = absl::GetFlag(FLAGS_forward_prefetch);
          o.max_inflight_all_gathers = absl::GetFlag(FLAGS_max_inflight_all_gathers);
        } else {
          o.backward_prefetch = dist::BackwardPrefetch::kNone;
          o.max_inflight_all_gathers = 1;
        }
        sharded[v] = dist::FullyShard(*models[v], pg, o);
      }
    }
    std::vector<std::vector<double>> mine(num_variants);
    for (int64_t step = 0; step < warmup + steps; ++step) {
      data::LmBatch batch = loader->Next();
      for (int j = 0; j < num_variants; ++j) {
        const int v = (step % 2 == 0) ? j : num_variants - 1 - j;  // ABCD.. ..DCBA
        const auto t0 = Clock::now();
        models[v]->ForwardBackward(batch.inputs, batch.targets);
        if (ddp[v]) {
          absl::Status st = ddp[v]->FinishBackward();
          if (!st.ok()) return st;
          opt[v]->Step(optim::FromModule(*models[v]));
          ddp[v]->ZeroGrad();
        } else if (zero1[v]) {
          absl::Status st = zero1[v]->Step();  // waits for the bucketed reduce-scatters
          if (!st.ok()) return st;
          zero1[v]->ZeroGrad();
        } else {
          opt[v]->Step(sharded[v]->ParamRefs());
          sharded[v]->ZeroGrad();
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (step >= warmup) mine[v].push_back(ms);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int v = 0; v < num_variants; ++v) times[rank][v] = std::move(mine[v]);
    if (rank == 0) units = sharded[1]->num_units();
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  std::vector<std::vector<double>> run(num_variants);
  for (int v = 0; v < num_variants; ++v) {
    for (int64_t i = 0; i < steps; ++i) {
      double m = 0;
      for (int r = 0; r < world; ++r) m = std::max(m, times[r][v][i]);
      run[v].push_back(m);
    }
    res[v].run_median_ms.push_back(Median(run[v]));
    res[v].step_ms.insert(res[v].step_ms.end(), run[v].begin(), run[v].end());
  }
  for (int v = 0; v < num_variants; ++v) {
    const int k = v % kNumStrategies, ddp_v = v - k;
    for (int64_t i = 0; i < steps; ++i) pair_ratios[v].push_back(run[v][i] / run[ddp_v][i]);
    if (k == 1 || k == kPrefetch) res[v].units = units;
  }
  if (mixed.size() == 2 && !mixed[0] && mixed[1]) {
    for (int k = 0; k < kNumStrategies; ++k) {
      for (int64_t i = 0; i < steps; ++i) {
        precision_ratios[k].push_back(run[kNumStrategies + k][i] / run[k][i]);
      }
    }
  }
  return absl::OkStatus();
}

std::string Label(const std::string& s) {
  if (s == "ddp") return "DDP";
  if (s == "full_shard_wrap") return "FULL_SHARD+wrap";
  if (s == "zero1") return "ZeRO-1";
  return "FULL_SHARD+wrap+prefetch";
}

std::string JsonList(const std::vector<double>& v) {
  std::vector<std::string> items;
  for (double x : v) items.push_back(absl::StrCat(x));
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

int Main() {
  absl::StatusOr<std::vector<std::string>> listed_presets =
      train::SplitListFlag("presets", absl::GetFlag(FLAGS_presets));
  absl::StatusOr<std::vector<std::string>> listed_precisions =
      train::SplitListFlag("precision", absl::GetFlag(FLAGS_precision));
  for (const auto* listed : {&listed_presets, &listed_precisions}) {
    if (!listed->ok()) {
      std::fprintf(stderr, "bench_throughput: error: %s\n",
                   std::string(listed->status().message()).c_str());
      return 2;
    }
  }
  const std::vector<std::string>& presets = *listed_presets;
  const int world = absl::GetFlag(FLAGS_world_size);
  const int reps = absl::GetFlag(FLAGS_reps);
  const int64_t B = absl::GetFlag(FLAGS_batch_size), T = absl::GetFlag(FLAGS_seq_len);
  const double target = absl::GetFlag(FLAGS_target_ratio);
  if (world < 1 || reps < 1 || absl::GetFlag(FLAGS_steps) < 1) {
    std::fprintf(stderr, "bench_throughput: error: --world_size, --reps, --steps must be >= 1\n");
    return 2;
  }
  // fp32 before bf16 whatever the flag's order, each once.
  bool want_fp32 = false, want_bf16 = false;
  for (const std::string& p : *listed_precisions) {
    if (p == "fp32") {
      want_fp32 = true;
    } else if (p == "bf16") {
      want_bf16 = true;
    } else {
      std::fprintf(stderr,
                   "bench_throughput: error: unknown --precision entry '%s' (want fp32, bf16)\n",
                   p.c_str());
      return 2;
    }
  }
  if (want_bf16) {  // before any fp32 run (a refusal then lost its results)
    if (absl::Status bf16 = precision::CheckComputeDtype(tensor::Dtype::kBF16,
                                                         tensor::Device::Cpu());
        !bf16.ok()) {
      std::fprintf(stderr, "bench_throughput: error: --precision=%s: %s; --precision=fp32 runs "
                   "here\n", absl::GetFlag(FLAGS_precision).c_str(),
                   std::string(bf16.message()).c_str());
      return 2;
    }
  }
  // Every flag checked before the first line is printed.
  auto usage_error = [](const std::string& message) {
    std::fprintf(stderr, "bench_throughput: error: %s\n", message.c_str());
    return 2;
  };
  const std::string backward = absl::GetFlag(FLAGS_backward_prefetch);
  if (backward != "pre" && backward != "post" && backward != "none") {
    return usage_error(
        absl::StrCat("--backward_prefetch='", backward, "' is not one of pre, post, none"));
  }
  if (absl::GetFlag(FLAGS_max_inflight_all_gathers) < 1) {
    return usage_error(absl::StrCat("--max_inflight_all_gathers=",
                                    absl::GetFlag(FLAGS_max_inflight_all_gathers),
                                    " must be >= 1 (1: no prefetch)"));
  }
  if (!(absl::GetFlag(FLAGS_bucket_cap_mb) > 0) || absl::GetFlag(FLAGS_bucket_cap_mb) > 1e6) {
    return usage_error(absl::StrCat("--bucket_cap_mb=", absl::GetFlag(FLAGS_bucket_cap_mb),
                                    " must be in (0, 1e6]"));
  }
  if (B < 1 || T < 1 || absl::GetFlag(FLAGS_warmup) < 0) {
    return usage_error("--batch_size and --seq_len must be >= 1, --warmup >= 0");
  }
  if (absl::GetFlag(FLAGS_vocab_size) < 1 || absl::GetFlag(FLAGS_vocab_size) > (int64_t{1} << 31)) {
    return usage_error(absl::StrCat("--vocab_size=", absl::GetFlag(FLAGS_vocab_size),
                                    " must be in [1, 2^31]"));
  }
  if (presets.empty()) return usage_error("--presets is empty: name a preset");
  if (!want_fp32 && !want_bf16) return usage_error("--precision is empty: fp32, bf16 or both");
  for (const std::string& preset : presets) {
    absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset(preset);
    if (!config.ok()) return usage_error(std::string(config.status().message()));
    if (T > config->block_size) {
      return usage_error(absl::StrCat("--seq_len=", T, " exceeds the block_size ",
                                      config->block_size, " of ", preset));
    }
  }
  if (absl::Status writable = train::CheckWritableFile(absl::GetFlag(FLAGS_json_out));
      !writable.ok()) {
    return usage_error(absl::StrCat("--json_out: ", writable.message()));
  }
  std::vector<bool> mixed;
  if (want_fp32) mixed.push_back(false);
  if (want_bf16) mixed.push_back(true);
  const int num_variants = static_cast<int>(mixed.size()) * kNumStrategies;
  const double tokens_per_step = static_cast<double>(world) * B * T;
  std::printf(
      "step time, threads engine N=%d | %s, AdamW | batch %lld x %lld tokens per rank, vocab "
      "%lld | %d runs x (%lld warmup + %lld timed steps), all %d variants in turn (ABCD.. ..DCBA) "
      "per step | DDP and ZeRO-1 buckets of %g MiB\n",
      world, want_fp32 && want_bf16 ? "fp32 and bf16" : (want_bf16 ? "bf16" : "fp32"),
      static_cast<long long>(B), static_cast<long long>(T),
      static_cast<long long>(absl::GetFlag(FLAGS_vocab_size)), reps,
      static_cast<long long>(absl::GetFlag(FLAGS_warmup)),
      static_cast<long long>(absl::GetFlag(FLAGS_steps)), num_variants,
      absl::GetFlag(FLAGS_bucket_cap_mb));
  std::printf("%-10s %-5s %-25s %5s | %10s %10s %10s | %-20s\n", "preset", "prec", "strategy",
              "units", "median ms", "min ms", "tokens/s", "median ms per run");
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
    std::vector<Result> res(num_variants);
    std::vector<std::vector<double>> pair_ratios(num_variants);
    std::vector<double> precision_ratios[kNumStrategies];
    for (int v = 0; v < num_variants; ++v) {
      res[v].preset = preset;
      res[v].strategy = kStrategies[v % kNumStrategies];
      res[v].mixed = mixed[v / kNumStrategies];
    }
    for (int r = 0; r < reps; ++r) {
      absl::Status s = RunSet(*config, world, mixed, res, pair_ratios, precision_ratios);
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
      std::printf("%-10s %-5s %-25s %5s | %10.1f %10.1f %10.0f | %s\n", preset.c_str(),
                  r.mixed ? "bf16" : "fp32", Label(r.strategy).c_str(),
                  r.units ? absl::StrCat(r.units).c_str() : "-", r.median_ms,
                  *std::min_element(r.step_ms.begin(), r.step_ms.end()), r.tokens_per_s,
                  absl::StrJoin(per_run, " ").c_str());
    }
    std::vector<double> ratio(num_variants, 1.0), paired(num_variants, 1.0);
    for (int v = 0; v < num_variants; ++v) {
      const int k = v % kNumStrategies;
      if (k == kDdp) continue;
      ratio[v] = res[v].median_ms / res[v - k].median_ms;
      paired[v] = Median(pair_ratios[v]);
      std::printf("%-10s %s %s / DDP step time: %.3f of medians, %.3f median of paired steps\n",
                  preset.c_str(), res[v].mixed ? "bf16" : "fp32", Label(res[v].strategy).c_str(),
                  ratio[v], paired[v]);
    }
    // bf16 / fp32 of each strategy (when both ran), on the bf16 rows.
    std::vector<double> over_fp32(num_variants, 0.0), over_fp32_paired(num_variants, 0.0);
    if (num_variants == 2 * kNumStrategies) {
      for (int k = 0; k < kNumStrategies; ++k) {
        const int v = kNumStrategies + k;
        over_fp32[v] = res[v].median_ms / res[k].median_ms;
        over_fp32_paired[v] = Median(precision_ratios[k]);
        std::printf(
            "%-10s %s bf16 / fp32 step time: %.3f of medians, %.3f median of paired steps\n",
            preset.c_str(), Label(res[v].strategy).c_str(), over_fp32[v], over_fp32_paired[v]);
      }
    }
    for (int v = 0; v < num_variants; ++v) {
      if (v % kNumStrategies != kPrefetch) continue;
      const bool within = ratio[v] <= target;
      all_within = all_within && within;
      std::printf("%-10s %s FULL_SHARD with prefetch within %.2fx of DDP: %s\n", preset.c_str(),
                  res[v].mixed ? "bf16" : "fp32", target, within ? "yes" : "NO");
    }
    std::fflush(stdout);
    for (int v = 0; v < num_variants; ++v) {
      const Result& r = res[v];
      std::string fp32_ratio;
      if (over_fp32[v] > 0) {
        fp32_ratio = absl::StrCat(",\"over_fp32\":", over_fp32[v],
                                  ",\"over_fp32_paired_median\":", over_fp32_paired[v]);
      }
      json_rows.push_back(absl::StrCat(
          "{\"preset\":\"", preset, "\",\"precision\":\"", r.mixed ? "bf16" : "fp32",
          "\",\"strategy\":\"", Label(r.strategy), "\",\"units\":", r.units,
          ",\"median_ms\":", r.median_ms, ",\"tokens_per_s\":", r.tokens_per_s,
          ",\"run_median_ms\":", JsonList(r.run_median_ms), ",\"step_ms\":", JsonList(r.step_ms),
          ",\"over_ddp\":", ratio[v], ",\"over_ddp_paired_median\":", paired[v], fp32_ratio, "}"));
    }
  }
  std::printf(
      "Step time = max over ranks of fwd+bwd+collectives+AdamW+zero (bf16: bf16 compute and\n"
      "gradient reduction over fp32 masters and gradients). DDP overlaps bucketed\n"
      "all-reduce with backward, ZeRO-1 bucketed reduce-scatters (then steps 1/N of AdamW\n"
      "bucket by bucket, each bucket's all-gather overlapping the next bucket's step); FSDP "
      "overlaps each unit's reduce-scatter with the next unit's backward,\n"
      "and with prefetch its all-gathers with the previous unit's compute.\n");
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    errno = 0;
    std::ofstream out(json_out);
    out << "{\"world_size\":" << world << ",\"batch_size\":" << B << ",\"seq_len\":" << T
        << ",\"vocab_size\":" << absl::GetFlag(FLAGS_vocab_size)
        << ",\"warmup\":" << absl::GetFlag(FLAGS_warmup)
        << ",\"steps\":" << absl::GetFlag(FLAGS_steps) << ",\"reps\":" << reps
        << ",\"bucket_cap_mb\":" << absl::GetFlag(FLAGS_bucket_cap_mb)
        << ",\"target_ratio\":" << target
        << ",\"all_within_target\":" << (all_within ? "true" : "false") << ",\"rows\":["
        << absl::StrJoin(json_rows, ",") << "]}\n";
    out.close();  // a failed flush counts too
    if (!out) {
      std::fprintf(stderr, "bench_throughput: error: cannot write %s%s%s\n", json_out.c_str(),
                   errno != 0 ? ": " : "", errno != 0 ? std::strerror(errno) : "");
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv,
      "Step time of DDP vs FSDP FULL_SHARD (+auto-wrap) vs ZeRO-1, interleaved.");
  return Main();
}
