// Generation speed of minGPT and T5 with and without the key/value cache,
// measured side by side in one process:
//
//   ./bazelw run //tools:bench_generate -- --presets=gpt-mini,gpt2,t5-small --max_new_tokens=256
//
// Per preset: one randomly initialized model (weights do not change the
// work), --num_samples rows of --max_new_tokens new tokens (temperature 0.8,
// top-k 200, as minGPT's sample binary's defaults; or greedy beam search with
// --num_beams, the rows' beams reordering the cache at each step). minGPT continues a
// --prompt_len token prompt; T5 encodes a --prompt_len token input and
// decodes from its start token (no EOS: every row runs to the end). --reps runs of each,
// interleaved cached / uncached / uncached / cached ..., so slow drifts in machine load hit both
// alike. Reported: the median tokens/s of each (new tokens of all rows per second), their ratio,
// and whether both drew the same tokens (they should: the same logits up to
// rounding). A table, then one JSON object per preset (--json_out writes the
// JSON array to a file too).
//
// With --fsdp_world_size=N (threads engine, FSDP FULL_SHARD, one unit per
// block) every rank generates the same rows with the cache, and the two ways
// compared are how the ranks hold the parameters for it
// (DataParallelModel::ForwardOnly): the whole model gathered once, or unit
// by unit at each decoding step. Reported: the median tokens/s of each and
// rank 0's peak parameter MiB during generation (ledger), and whether both
// drew the same tokens.
//
//   ./bazelw run //tools:bench_generate -- --presets=gpt2,t5-small --fsdp_world_size=2
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/wrap_policy.h"
#include "models/common/command_line.h"
#include "models/common/data_parallel.h"
#include "models/common/train_setup.h"
#include "models/mingpt/config.h"
#include "models/mingpt/generate.h"
#include "models/mingpt/model.h"
#include "models/t5/config.h"
#include "models/t5/generate.h"
#include "models/t5/model.h"
#include "nn/mixed_precision.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/memory_ledger.h"

ABSL_FLAG(std::string, presets, "gpt-mini,gpt2", "comma-separated minGPT or T5 presets");
ABSL_FLAG(int64_t, num_samples, 1, "rows generated together (the batch)");
ABSL_FLAG(int64_t, prompt_len, 1, "prompt tokens per row (T5: encoder input tokens)");
ABSL_FLAG(int64_t, max_new_tokens, 128, "new tokens per row");
ABSL_FLAG(int64_t, reps, 2, "timed runs of each way (interleaved)");
ABSL_FLAG(int64_t, num_beams, 1,
          "beam search (greedy beams, as Hugging Face's default) with this many beams per row; "
          "1: rows sampled");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, precision, "fp32", "fp32, bf16 or fp16 compute");
ABSL_FLAG(std::string, json_out, "", "also write the JSON array to this file");
ABSL_FLAG(int, fsdp_world_size, 0,
          "0: one process, cached against uncached; N >= 1: N ranks of FSDP FULL_SHARD "
          "(threads), the whole model gathered once against unit by unit");

namespace {

using Rows = std::vector<std::vector<int64_t>>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A prompt or encoder input per row: (B, P) ids below V.
Rows Prompts(int64_t B, int64_t P, int64_t V) {
  Rows prompts(B, std::vector<int64_t>(P));
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < P; ++t) prompts[r][t] = (r * 131 + t * 17 + 1) % V;
  }
  return prompts;
}

// T5's encoder inputs: Prompts as a (B, P) tensor on `device`.
tensor::Tensor EncoderInputs(int64_t B, int64_t P, int64_t V, tensor::Device device) {
  std::vector<int64_t> flat;  // (B, P)
  for (const std::vector<int64_t>& row : Prompts(B, P, V)) {
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return tensor::Tensor::FromData<int64_t>(flat, {B, P}).To(device);
}

// N new tokens at temperature 0.8 and top-k 200 (minGPT's sample defaults),
// or by greedy beam search with --num_beams > 1.
template <typename Options>
Options SampleOptions(int64_t N) {
  Options options;
  options.max_new_tokens = N;
  options.temperature = 0.8;
  options.top_k = 200;
  options.num_beams = absl::GetFlag(FLAGS_num_beams);
  if (options.beams()) options.temperature = 0.0;
  return options;
}

// What the two ways gave: median new tokens/s and whether their tokens agree.
struct Timed {
  double cached = 0.0;
  double uncached = 0.0;
  bool same = false;
};

// --reps runs of `generate(kv_cache)` each way, interleaved AB BA AB ...;
// `new_tokens`: the tokens one run draws (all rows).
absl::StatusOr<Timed> TimeBothWays(int64_t reps, int64_t new_tokens,
                                   const std::function<absl::StatusOr<Rows>(bool)>& generate) {
  std::vector<double> seconds[2];  // [0] cached, [1] uncached
  Rows out[2];
  for (int64_t rep = 0; rep < reps; ++rep) {
    for (int i = 0; i < 2; ++i) {
      const int way = (rep % 2 == 0) ? i : 1 - i;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Rows> rows = generate(/*kv_cache=*/way == 0);
      if (!rows.ok()) return rows.status();
      seconds[way].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      out[way] = *std::move(rows);
    }
  }
  return Timed{static_cast<double>(new_tokens) / Median(seconds[0]),
               static_cast<double>(new_tokens) / Median(seconds[1]), out[0] == out[1]};
}

// minGPT: B prompts of P tokens continued by N tokens each.
absl::StatusOr<Timed> TimeMinGpt(mingpt::GptConfig config, const train::Compute& compute, int64_t B,
                                 int64_t P, int64_t N, int64_t reps) {
  config.dropout = 0.0f;
  if (P + N > config.block_size) {
    std::printf("%-12s | note: %lld tokens exceed block_size %lld: the last %lld run uncached\n",
                config.name.c_str(), static_cast<long long>(P + N),
                static_cast<long long>(config.block_size),
                static_cast<long long>(P + N - config.block_size));
  }
  mingpt::GPT model(config);
  model.Materialize(1, compute.device);
  nn::MixedPrecision mixed(model, compute.policy);
  mixed.CastForCompute();
  const Rows prompts = Prompts(B, P, config.vocab_size);
  mingpt::SamplingOptions options = SampleOptions<mingpt::SamplingOptions>(N);
  return TimeBothWays(reps, B * N, [&](bool kv_cache) {
    options.kv_cache = kv_cache;
    return mingpt::Generate(model, prompts, options, compute.device);
  });
}

// T5: B encoder inputs of P tokens, N decoded tokens each.
absl::StatusOr<Timed> TimeT5(t5::T5Config config, const train::Compute& compute, int64_t B,
                             int64_t P, int64_t N, int64_t reps) {
  config.dropout_rate = 0.0f;
  t5::T5Model model(config);
  model.Materialize(1, compute.device);
  nn::MixedPrecision mixed(model, compute.policy);
  mixed.CastForCompute();
  const tensor::Tensor inputs = EncoderInputs(B, P, config.vocab_size, compute.device);  // (B, P)
  t5::GenerateOptions options = SampleOptions<t5::GenerateOptions>(N);
  return TimeBothWays(reps, B * N, [&](bool kv_cache) {
    options.kv_cache = kv_cache;
    return t5::Generate(model, inputs, tensor::Tensor(), options);
  });
}

// Prints one JSON object per line, and writes them as an array to --json_out if set.
absl::Status PrintJson(const std::vector<std::string>& json) {
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << "[" << absl::StrJoin(json, ",\n") << "]\n";
    if (!f) return absl::InvalidArgumentError(absl::StrCat("--json_out: cannot write ", json_out));
  }
  return absl::OkStatus();
}

// ---- FSDP: the whole model gathered once, or unit by unit ----

using Gather = train::DataParallelModel::Gather;

// Per way: median tokens/s, rank 0's peak parameter bytes while generating,
// and the rows drawn.
struct FsdpTimed {
  double tokens_per_s[2] = {0, 0};  // [0] whole model, [1] unit by unit
  int64_t param_peak[2] = {0, 0};
  bool same = false;
};

// `generate` (forward only, every rank the same rows) --reps times each
// way, interleaved, on every rank of an FSDP FULL_SHARD world of `world`
// threads over the model `make_model` builds.
absl::StatusOr<FsdpTimed> TimeUnderFsdp(
    int world, const train::Compute& compute, int64_t reps, int64_t new_tokens,
    const std::vector<std::string>& root_params,
    const std::function<std::unique_ptr<nn::Module>()>& make_model,
    const std::function<absl::StatusOr<Rows>(nn::Module&)>& generate) {
  train::DataParallelConfig config;
  config.world_size = world;
  config.strategy = train::Strategy::kFullShard;
  config.policy = dist::WrapPolicy::Transformer({"Block", "T5Block"});
  config.mixed_precision = compute.policy;
  config.device = compute.device;
  FsdpTimed result;  // rank 0's
  absl::Status s = train::RunDataParallel(config, [&](train::RankContext& rank) -> absl::Status {
    std::unique_ptr<nn::Module> model = make_model();
    absl::StatusOr<std::unique_ptr<optim::SGD>> sgd = optim::SGD::Create({});
    if (!sgd.ok()) return sgd.status();
    absl::StatusOr<std::unique_ptr<train::DataParallelModel>> dp = train::DataParallelModel::Create(
        *model, rank.pg, config, *std::move(sgd), /*seed=*/1, root_params);
    if (!dp.ok()) return dp.status();
    std::vector<double> seconds[2];
    Rows out[2];
    absl::Status failed;
    for (int64_t rep = 0; rep < reps; ++rep) {
      for (int i = 0; i < 2; ++i) {
        const int way = (rep % 2 == 0) ? i : 1 - i;
        rank.ledger.ResetPeaks();
        const auto start = std::chrono::steady_clock::now();
        (*dp)->ForwardOnly(
            [&] {
              absl::StatusOr<Rows> rows = generate(*model);
              if (rows.ok()) {
                out[way] = *std::move(rows);
              } else {
                failed = rows.status();
              }
            },
            way == 0 ? Gather::kWholeModel : Gather::kPerUnit);
        seconds[way].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (!failed.ok()) return failed;
        const int64_t peak =
            rank.ledger.Stats(compute.device, tensor::MemoryCategory::kParameters).peak;
        if (rank.rank == 0) result.param_peak[way] = std::max(result.param_peak[way], peak);
      }
    }
    if (rank.rank == 0) {
      for (int way = 0; way < 2; ++way) {
        result.tokens_per_s[way] = static_cast<double>(new_tokens) / Median(seconds[way]);
      }
      result.same = out[0] == out[1];
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<FsdpTimed> MinGptUnderFsdp(int world, mingpt::GptConfig config,
                                          const train::Compute& compute, int64_t B, int64_t P,
                                          int64_t N, int64_t reps) {
  config.dropout = 0.0f;
  const Rows prompts = Prompts(B, P, config.vocab_size);
  mingpt::SamplingOptions options = SampleOptions<mingpt::SamplingOptions>(N);
  return TimeUnderFsdp(
      world, compute, reps, B * N, {}, [&] { return std::make_unique<mingpt::GPT>(config); },
      [&](nn::Module& model) {
        return mingpt::Generate(static_cast<mingpt::GPT&>(model), prompts, options, compute.device);
      });
}

absl::StatusOr<FsdpTimed> T5UnderFsdp(int world, t5::T5Config config, const train::Compute& compute,
                                      int64_t B, int64_t P, int64_t N, int64_t reps) {
  config.dropout_rate = 0.0f;
  const tensor::Tensor inputs = EncoderInputs(B, P, config.vocab_size, compute.device);  // (B, P)
  t5::GenerateOptions options = SampleOptions<t5::GenerateOptions>(N);
  return TimeUnderFsdp(
      world, compute, reps, B * N, {"shared.weight"},
      [&] { return std::make_unique<t5::T5Model>(config); },
      [&](nn::Module& model) {
        return t5::Generate(static_cast<t5::T5Model&>(model), inputs, tensor::Tensor(), options);
      });
}

absl::Status RunFsdp(int world, const std::vector<std::string>& presets,
                     const train::Compute& compute, int64_t B, int64_t P, int64_t N, int64_t reps) {
  std::printf(
      "generation under FSDP FULL_SHARD (one unit per block), %d rank(s) (threads), %lld row(s) "
      "x (%lld prompt + %lld new tokens), %s, %s, %lld reps\n",
      world, static_cast<long long>(B), static_cast<long long>(P), static_cast<long long>(N),
      compute.device.ToString().c_str(), absl::GetFlag(FLAGS_precision).c_str(),
      static_cast<long long>(reps));
  std::printf("%-12s | %12s %12s | %7s | %13s %13s | %s\n", "preset", "whole tok/s", "unit tok/s",
              "ratio", "whole params", "unit params", "same tokens");
  std::vector<std::string> json;
  constexpr double kMiB = 1024.0 * 1024.0;
  for (const std::string& preset : presets) {
    absl::StatusOr<mingpt::GptConfig> gpt = mingpt::Preset(preset);
    absl::StatusOr<FsdpTimed> t =
        gpt.ok() ? MinGptUnderFsdp(world, *gpt, compute, B, P, N, reps)
                 : T5UnderFsdp(world, *t5::Preset(preset), compute, B, P, N, reps);
    if (!t.ok()) return t.status();
    std::printf("%-12s | %12.1f %12.1f | %6.2fx | %9.1f MiB %9.1f MiB | %s\n", preset.c_str(),
                t->tokens_per_s[0], t->tokens_per_s[1], t->tokens_per_s[1] / t->tokens_per_s[0],
                t->param_peak[0] / kMiB, t->param_peak[1] / kMiB, t->same ? "yes" : "NO");
    json.push_back(absl::StrCat("{\"preset\":\"", preset, "\",\"fsdp_world_size\":", world,
                                ",\"device\":\"", compute.device.ToString(), "\",\"precision\":\"",
                                absl::GetFlag(FLAGS_precision), "\",\"num_samples\":", B,
                                ",\"prompt_len\":", P, ",\"new_tokens\":", N, ",\"reps\":", reps,
                                ",\"whole_tokens_per_s\":", t->tokens_per_s[0],
                                ",\"unit_tokens_per_s\":", t->tokens_per_s[1],
                                ",\"whole_param_peak_bytes\":", t->param_peak[0],
                                ",\"unit_param_peak_bytes\":", t->param_peak[1],
                                ",\"same_tokens\":", t->same ? "true" : "false", "}"));
  }
  return PrintJson(json);
}

absl::Status Run() {
  const int64_t B = absl::GetFlag(FLAGS_num_samples), P = absl::GetFlag(FLAGS_prompt_len);
  const int64_t N = absl::GetFlag(FLAGS_max_new_tokens), reps = absl::GetFlag(FLAGS_reps);
  const int64_t K = absl::GetFlag(FLAGS_num_beams);
  if (B < 1 || P < 1 || N < 1 || reps < 1 || K < 1) {
    return absl::InvalidArgumentError(
        "--num_samples, --prompt_len, --max_new_tokens, --reps and --num_beams must be >= 1");
  }
  absl::StatusOr<train::Compute> compute =
      train::ResolveCompute(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_precision));
  if (!compute.ok()) return compute.status();
  const tensor::Device& device = compute->device;
  absl::StatusOr<std::vector<std::string>> listed =
      train::SplitListFlag("presets", absl::GetFlag(FLAGS_presets));
  if (!listed.ok()) return listed.status();
  const std::vector<std::string>& presets = *listed;
  if (presets.empty()) return absl::InvalidArgumentError("--presets is empty: name a preset");
  for (const std::string& name : presets) {  // every name checked before any run
    if (!mingpt::Preset(name).ok() && !t5::Preset(name).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--presets: '", name, "' is neither a minGPT preset (",
                       absl::StrJoin(mingpt::PresetNames(), ", "), ") nor a T5 one (",
                       absl::StrJoin(t5::PresetNames(), ", "), ")"));
    }
  }

  const int world = absl::GetFlag(FLAGS_fsdp_world_size);
  if (world < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fsdp_world_size must be >= 0 (0: one process), got ", world));
  }
  if (world > 0) return RunFsdp(world, presets, *compute, B, P, N, reps);

  std::printf("generation, %lld row(s) x (%lld prompt + %lld new tokens), %s, %s, %s, %lld reps\n",
              static_cast<long long>(B), static_cast<long long>(P), static_cast<long long>(N),
              K > 1 ? absl::StrCat(K, " beams per row").c_str() : "sampled",
              device.ToString().c_str(), absl::GetFlag(FLAGS_precision).c_str(),
              static_cast<long long>(reps));
  std::printf("%-12s | %14s %14s | %7s | %s\n", "preset", "cached tok/s", "uncached tok/s", "ratio",
              "same tokens");
  std::vector<std::string> json;
  for (const std::string& preset : presets) {
    absl::StatusOr<mingpt::GptConfig> gpt = mingpt::Preset(preset);
    absl::StatusOr<Timed> timed = gpt.ok() ? TimeMinGpt(*gpt, *compute, B, P, N, reps)
                                           : TimeT5(*t5::Preset(preset), *compute, B, P, N, reps);
    if (!timed.ok()) return timed.status();
    std::printf("%-12s | %14.1f %14.1f | %6.2fx | %s\n", preset.c_str(), timed->cached,
                timed->uncached, timed->cached / timed->uncached, timed->same ? "yes" : "NO");
    json.push_back(absl::StrCat(
        "{\"preset\":\"", preset, "\",\"device\":\"", device.ToString(), "\",\"precision\":\"",
        absl::GetFlag(FLAGS_precision), "\",\"num_samples\":", B, ",\"prompt_len\":", P,
        ",\"new_tokens\":", N, ",\"num_beams\":", K, ",\"reps\":", reps,
        ",\"cached_tokens_per_s\":", timed->cached, ",\"uncached_tokens_per_s\":", timed->uncached,
        ",\"speedup\":", timed->cached / timed->uncached,
        ",\"same_tokens\":", timed->same ? "true" : "false", "}"));
  }
  return PrintJson(json);
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(
      argc, argv, "minGPT and T5 generation with and without the key/value cache.");
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "bench_generate: error: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
