// Per-rank memory of data-parallel training, from the memory ledgers: DDP,
// ZeRO-1, FSDP SHARD_GRAD_OP (~ZeRO-2), FSDP FULL_SHARD (~ZeRO-3) without
// auto-wrap and FULL_SHARD with the transformer auto-wrap (one unit per
// "Block"), at several world sizes of the `threads` engine, fp32 + AdamW.
//
//   ./bazelw run //tools:bench_memory -- --presets=gpt-mini,gopher-44m --world_sizes=2,4,8
//
// For each run: every rank builds the model, wraps it, and trains --steps
// steps on its rows of a random-token batch. Peaks are reset after the set-up
// (wrapping copies parameters once), so peaks are those of the training steps.
// Reported per rank (rank 0; all ranks are symmetric up to padding):
//   peak MiB per category and the peak of the total;
//   "state": parameters + gradients + optimizer_state *current* after the last
//   step (steady state), compared with the ZeRO paper's formulas for fp32 and
//   AdamW (K = 8 bytes per parameter):
//     DDP     (4+4+K) Psi          ZeRO-1  (4+4) Psi + K Psi/N
//     ZeRO-2  4 Psi + (4+K) Psi/N  ZeRO-3  (4+4+K) Psi/N
//   "in-step": the sum of the three categories' peaks during the steps (an
//   upper bound of what was held at once), against the formula of what the
//   strategy holds inside a step (ZeRO-2 for SHARD_GRAD_OP, whose parameters
//   stay unsharded from forward through backward).
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dist/ddp.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "dist/zero1.h"
#include "models/data/lm_loader.h"
#include "models/data/random_tokens.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "optim/param_ref.h"
#include "tensor/memory_ledger.h"

ABSL_FLAG(std::string, presets, "gpt-mini,gopher-44m", "comma-separated minGPT presets");
ABSL_FLAG(std::string, world_sizes, "2,4,8", "comma-separated world sizes");
ABSL_FLAG(std::string, strategies, "ddp,zero1,shard_grad_op,full_shard,full_shard_wrap",
          "comma-separated subset of ddp, zero1, shard_grad_op, full_shard (no auto-wrap), "
          "full_shard_wrap (transformer auto-wrap, class Block)");
ABSL_FLAG(int64_t, vocab_size, 50257, "vocabulary size (random tokens)");
ABSL_FLAG(int64_t, batch_size, 1, "sequences per rank");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, steps, 2, "training steps per run");
ABSL_FLAG(std::string, json_out, "", "write the results as JSON to this file");

namespace {

using tensor::MemoryCategory;
constexpr double kMiB = 1048576.0;
constexpr int kK = 8;  // AdamW: exp_avg + exp_avg_sq, fp32

struct Row {
  std::string preset, strategy, state_formula, step_formula;
  int world = 0;
  int64_t psi = 0;
  int64_t peak[tensor::kNumMemoryCategories] = {};
  int64_t peak_total = 0;
  int64_t steady = 0;          // params + grads + optim current after the last step
  double formula_steady = 0;   // bytes
  double formula_step = 0;
  int64_t step_state_peak = 0;  // sum of the three categories' peaks
  int units = 0;
};

double Formula(const std::string& which, double psi, int n) {
  if (which == "DDP") return (4 + 4 + kK) * psi;
  if (which == "ZeRO-1") return 8 * psi + kK * psi / n;
  if (which == "ZeRO-2") return 4 * psi + (4 + kK) * psi / n;
  return (4 + 4 + kK) * psi / n;  // ZeRO-3
}

absl::Status RunOne(const std::string& preset, int world, const std::string& strategy, Row& row) {
  absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset(preset);
  if (!config.ok()) return config.status();
  config->vocab_size = absl::GetFlag(FLAGS_vocab_size);
  config->dropout = 0;
  const int64_t B = absl::GetFlag(FLAGS_batch_size), T = absl::GetFlag(FLAGS_seq_len);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (T > config->block_size) return absl::InvalidArgumentError("--seq_len exceeds block_size");
  auto source = data::RandomTokenSource::Create(7, config->vocab_size);
  if (!source.ok()) return source.status();
  std::shared_ptr<const data::TokenSource> src(std::move(*source));
  row.preset = preset;
  row.strategy = strategy;
  row.world = world;
  row.psi = mingpt::CountParameters(*config).total;
  std::mutex mu;
  std::vector<int64_t> steady(world, 0);
  dist::ThreadWorld tw(world);
  absl::Status s = dist::RunRanks(tw, [&](int rank, dist::ProcessGroup& pg) -> absl::Status {
    auto loader = data::LmLoader::Create(src, {B, rank, world}, T);
    if (!loader.ok()) return loader.status();
    optim::AdamWOptions ao;
    ao.lr = 1e-4;
    auto adamw = optim::AdamW::Create(ao);
    if (!adamw.ok()) return adamw.status();
    std::unique_ptr<optim::Optimizer> opt(std::move(*adamw));
    mingpt::GPT model(*config);
    std::unique_ptr<dist::DistributedDataParallel> ddp;
    std::unique_ptr<dist::Zero1> zero;
    std::unique_ptr<dist::FullyShardedModel> fsdp;
    if (strategy == "ddp") {
      model.Materialize(1);
      ddp = std::make_unique<dist::DistributedDataParallel>(model, pg);
    } else if (strategy == "zero1") {
      model.Materialize(1);
      zero = std::make_unique<dist::Zero1>(model, pg, std::move(opt));
    } else {
      dist::FsdpOptions o;
      o.strategy = strategy == "shard_grad_op" ? dist::ShardingStrategy::kShardGradOp
                                               : dist::ShardingStrategy::kFullShard;
      if (strategy == "full_shard_wrap") o.policy = dist::WrapPolicy::Transformer({"Block"});
      o.seed = 1;
      fsdp = dist::FullyShard(model, pg, o);
      if (rank == 0) row.units = fsdp->num_units();
    }
    tensor::MemoryLedger& ledger = tw.ledger(rank);
    ledger.ResetPeaks();  // measure the training steps, not the one-time set-up
    for (int64_t step = 0; step < steps; ++step) {
      data::LmBatch batch = loader->Next();
      model.ForwardBackward(batch.inputs, batch.targets);
      if (ddp) {
        opt->Step(optim::FromModule(model));
        ddp->ZeroGrad();
      } else if (zero) {
        absl::Status st = zero->Step();
        if (!st.ok()) return st;
        zero->ZeroGrad();
      } else {
        opt->Step(fsdp->ParamRefs());
        fsdp->ZeroGrad();
      }
    }
    int64_t state = 0;
    for (MemoryCategory c : {MemoryCategory::kParameters, MemoryCategory::kGradients,
                             MemoryCategory::kOptimizerState}) {
      state += ledger.Stats(tensor::Device::Cpu(), c).current;
    }
    std::lock_guard<std::mutex> lock(mu);
    steady[rank] = state;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  const tensor::MemoryLedger& l0 = tw.ledger(0);
  for (int c = 0; c < tensor::kNumMemoryCategories; ++c) {
    row.peak[c] = l0.Stats(tensor::Device::Cpu(), static_cast<MemoryCategory>(c)).peak;
  }
  row.peak_total = l0.Total(tensor::Device::Cpu()).peak;
  row.steady = steady[0];
  row.step_state_peak = row.peak[0] + row.peak[1] + row.peak[2];
  if (strategy == "ddp") {
    row.state_formula = row.step_formula = "DDP";
  } else if (strategy == "zero1") {
    row.state_formula = row.step_formula = "ZeRO-1";
  } else if (strategy == "shard_grad_op") {
    row.state_formula = "ZeRO-3";  // after the step every unit is resharded
    row.step_formula = "ZeRO-2";
  } else {
    row.state_formula = row.step_formula = "ZeRO-3";
  }
  row.formula_steady = Formula(row.state_formula, row.psi, world);
  row.formula_step = Formula(row.step_formula, row.psi, world);
  return absl::OkStatus();
}

std::string Label(const std::string& s) {
  if (s == "ddp") return "DDP";
  if (s == "zero1") return "ZeRO-1";
  if (s == "shard_grad_op") return "SHARD_GRAD_OP";
  if (s == "full_shard") return "FULL_SHARD";
  return "FULL_SHARD+wrap";
}

int Main() {
  std::vector<std::string> presets = absl::StrSplit(absl::GetFlag(FLAGS_presets), ',');
  std::vector<std::string> strategies = absl::StrSplit(absl::GetFlag(FLAGS_strategies), ',');
  std::vector<int> worlds;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_world_sizes), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1) {
      std::fprintf(stderr, "bench_memory: error: bad --world_sizes entry '%s'\n",
                   std::string(w).c_str());
      return 2;
    }
    worlds.push_back(n);
  }
  for (const std::string& s : strategies) {
    if (s != "ddp" && s != "zero1" && s != "shard_grad_op" && s != "full_shard" &&
        s != "full_shard_wrap") {
      std::fprintf(stderr, "bench_memory: error: unknown strategy '%s'\n", s.c_str());
      return 2;
    }
  }
  std::printf(
      "per-rank memory (rank 0, MiB) | fp32, AdamW (K=8) | batch %lld x %lld tokens per rank, "
      "vocab %lld, %lld steps\n",
      static_cast<long long>(absl::GetFlag(FLAGS_batch_size)),
      static_cast<long long>(absl::GetFlag(FLAGS_seq_len)),
      static_cast<long long>(absl::GetFlag(FLAGS_vocab_size)),
      static_cast<long long>(absl::GetFlag(FLAGS_steps)));
  std::printf(
      "%-10s %2s %-15s %5s | %8s %8s %8s %8s %6s %6s %8s | %8s %6s %8s %6s | %8s %6s %8s %6s\n",
      "preset", "N", "strategy", "units", "params", "grads", "optim", "activ", "comm", "temp",
      "TOTAL", "state", "form", "MiB", "ratio", "in-step", "form", "MiB", "ratio");
  std::vector<Row> rows;
  bool ordering_ok = true;
  for (const std::string& preset : presets) {
    for (int n : worlds) {
      int64_t ddp_total = -1, nowrap_total = -1, wrap_total = -1;
      for (const std::string& strategy : strategies) {
        Row row;
        absl::Status s = RunOne(preset, n, strategy, row);
        if (!s.ok()) {
          std::fprintf(stderr, "bench_memory: error: %s N=%d %s: %s\n", preset.c_str(), n,
                       strategy.c_str(), std::string(s.message()).c_str());
          return 1;
        }
        std::printf(
            "%-10s %2d %-15s %5s | %8.2f %8.2f %8.2f %8.2f %6.2f %6.2f %8.2f | %8.2f %6s %8.2f "
            "%6.3f | %8.2f %6s %8.2f %6.3f\n",
            preset.c_str(), n, Label(strategy).c_str(),
            row.units ? absl::StrCat(row.units).c_str() : "-", row.peak[0] / kMiB,
            row.peak[1] / kMiB, row.peak[2] / kMiB, row.peak[3] / kMiB, row.peak[4] / kMiB,
            row.peak[5] / kMiB, row.peak_total / kMiB, row.steady / kMiB,
            row.state_formula.c_str(), row.formula_steady / kMiB, row.steady / row.formula_steady,
            row.step_state_peak / kMiB, row.step_formula.c_str(), row.formula_step / kMiB,
            row.step_state_peak / row.formula_step);
        std::fflush(stdout);
        if (strategy == "ddp") ddp_total = row.peak_total;
        if (strategy == "full_shard") nowrap_total = row.peak_total;
        if (strategy == "full_shard_wrap") wrap_total = row.peak_total;
        rows.push_back(row);
      }
      if (ddp_total >= 0 && nowrap_total >= 0 && wrap_total >= 0) {
        const bool ok = ddp_total > nowrap_total && nowrap_total > wrap_total;
        ordering_ok = ordering_ok && ok;
        std::printf("%-10s %2d peak total: DDP %.2f > FULL_SHARD %.2f > FULL_SHARD+wrap %.2f: %s\n",
                    preset.c_str(), n, ddp_total / kMiB, nowrap_total / kMiB, wrap_total / kMiB,
                    ok ? "yes" : "NO");
      }
    }
  }
  std::printf(
      "state = params+grads+optim current after the last step; in-step = sum of their peaks.\n"
      "ZeRO-1 keeps an fp32 master copy of its shard besides the full parameters: +4 Psi/N.\n"
      "FSDP pads each unit's flat parameter to a multiple of N; in-step peaks above the formula\n"
      "are the unsharded units (parameters and gradients) held transiently during forward/backward.\n"
      "FULL_SHARD without auto-wrap holds, at its peak, 4Psi/N + 4Psi + 4Psi/N + 4Psi + K Psi/N:\n"
      "at N=2 exactly DDP's 16 Psi, so the ordering is strict only from N=3.\n");
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::vector<std::string> items;
    for (const Row& r : rows) {
      std::string cats;
      for (int c = 0; c < tensor::kNumMemoryCategories; ++c) {
        absl::StrAppend(&cats, c ? "," : "", "\"",
                        tensor::MemoryCategoryName(static_cast<MemoryCategory>(c)), "\":", r.peak[c]);
      }
      items.push_back(absl::StrCat(
          "{\"preset\":\"", r.preset, "\",\"world_size\":", r.world, ",\"strategy\":\"",
          Label(r.strategy), "\",\"units\":", r.units, ",\"psi\":", r.psi, ",\"peak_bytes\":{",
          cats, ",\"total\":", r.peak_total, "},\"steady_state_bytes\":", r.steady,
          ",\"steady_formula\":\"", r.state_formula, "\",\"steady_formula_bytes\":",
          static_cast<int64_t>(r.formula_steady), ",\"steady_ratio\":",
          r.steady / r.formula_steady, ",\"in_step_state_peak_bytes\":", r.step_state_peak,
          ",\"in_step_formula\":\"", r.step_formula, "\",\"in_step_formula_bytes\":",
          static_cast<int64_t>(r.formula_step), ",\"in_step_ratio\":",
          r.step_state_peak / r.formula_step, "}"));
    }
    std::ofstream out(json_out);
    out << "{\"ordering_ddp_gt_fsdp_gt_fsdp_wrap\":" << (ordering_ok ? "true" : "false")
        << ",\"rows\":[" << absl::StrJoin(items, ",") << "]}\n";
    if (!out) {
      std::fprintf(stderr, "bench_memory: error: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  std::printf("ordering DDP > FULL_SHARD > FULL_SHARD+wrap in peak total at every N: %s\n",
              ordering_ok ? "yes" : "no (see the rows above)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Per-rank peak memory of DDP, ZeRO-1, FSDP SHARD_GRAD_OP / FULL_SHARD (+auto-wrap).");
  absl::ParseCommandLine(argc, argv);
  return Main();
}
