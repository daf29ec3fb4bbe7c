// Generation speed of minGPT with and without the key/value cache, measured
// side by side in one process:
//
//   ./bazelw run //tools:bench_generate -- --presets=gpt-mini,gpt2 --max_new_tokens=256
//
// Per preset: one randomly initialized model (weights do not change the
// work), --num_samples rows continuing a --prompt_len token prompt by
// --max_new_tokens tokens (temperature 0.8, top-k 200, as the sample binary's
// defaults); --reps runs of each, interleaved cached / uncached / uncached /
// cached ..., so slow drifts in machine load hit both alike. Reported: the
// median tokens/s of each (new tokens of all rows per second), their ratio,
// and whether both drew the same tokens (they should: the same logits up to
// rounding). A table, then one JSON object per preset (--json_out writes the
// JSON array to a file too).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/common/train_setup.h"
#include "models/mingpt/config.h"
#include "models/mingpt/generate.h"
#include "models/mingpt/model.h"
#include "nn/mixed_precision.h"
#include "precision/policy.h"

ABSL_FLAG(std::string, presets, "gpt-mini,gpt2", "comma-separated minGPT presets");
ABSL_FLAG(int64_t, num_samples, 1, "rows generated together (the batch)");
ABSL_FLAG(int64_t, prompt_len, 1, "prompt tokens per row");
ABSL_FLAG(int64_t, max_new_tokens, 128, "new tokens per row");
ABSL_FLAG(int64_t, reps, 2, "timed runs of each way (interleaved)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, precision, "fp32", "fp32, bf16 or fp16 compute");
ABSL_FLAG(std::string, json_out, "", "also write the JSON array to this file");

namespace {

using Rows = std::vector<std::vector<int64_t>>;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

absl::Status Run() {
  const int64_t B = absl::GetFlag(FLAGS_num_samples), P = absl::GetFlag(FLAGS_prompt_len);
  const int64_t N = absl::GetFlag(FLAGS_max_new_tokens), reps = absl::GetFlag(FLAGS_reps);
  if (B < 1 || P < 1 || N < 1 || reps < 1) {
    return absl::InvalidArgumentError(
        "--num_samples, --prompt_len, --max_new_tokens and --reps must be >= 1");
  }
  absl::StatusOr<train::Compute> compute =
      train::ResolveCompute(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_precision));
  if (!compute.ok()) return compute.status();
  const tensor::Device& device = compute->device;

  std::printf("generation, %lld row(s) x (%lld prompt + %lld new tokens), %s, %s, %lld reps\n",
              static_cast<long long>(B), static_cast<long long>(P), static_cast<long long>(N),
              device.ToString().c_str(), absl::GetFlag(FLAGS_precision).c_str(),
              static_cast<long long>(reps));
  std::printf("%-12s | %14s %14s | %7s | %s\n", "preset", "cached tok/s", "uncached tok/s", "ratio",
              "same tokens");
  std::vector<std::string> json;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',')) {
    absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset(name);
    if (!config.ok()) return config.status();
    config->dropout = 0.0f;
    if (P + N > config->block_size) {
      std::printf("%-12s | note: %lld tokens exceed block_size %lld: the last %lld run uncached\n",
                  config->name.c_str(), static_cast<long long>(P + N),
                  static_cast<long long>(config->block_size),
                  static_cast<long long>(P + N - config->block_size));
    }
    mingpt::GPT model(*config);
    model.Materialize(1, device);
    nn::MixedPrecision mixed(model, compute->policy);
    mixed.CastForCompute();
    Rows prompts(B, std::vector<int64_t>(P));
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t t = 0; t < P; ++t) prompts[r][t] = (r * 131 + t * 17 + 1) % config->vocab_size;
    }
    mingpt::SamplingOptions options;
    options.max_new_tokens = N;
    options.temperature = 0.8;
    options.top_k = 200;
    std::vector<double> seconds[2];  // [0] cached, [1] uncached
    Rows out[2];
    for (int64_t rep = 0; rep < reps; ++rep) {
      for (int i = 0; i < 2; ++i) {
        const int way = (rep % 2 == 0) ? i : 1 - i;  // AB BA AB ...
        options.kv_cache = way == 0;
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<Rows> rows = mingpt::Generate(model, prompts, options, device);
        if (!rows.ok()) return rows.status();
        seconds[way].push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        out[way] = *std::move(rows);
      }
    }
    const double cached = static_cast<double>(B * N) / Median(seconds[0]);
    const double uncached = static_cast<double>(B * N) / Median(seconds[1]);
    const bool same = out[0] == out[1];
    std::printf("%-12s | %14.1f %14.1f | %6.2fx | %s\n", config->name.c_str(), cached, uncached,
                cached / uncached, same ? "yes" : "NO");
    json.push_back(absl::StrCat(
        "{\"preset\":\"", config->name, "\",\"device\":\"", device.ToString(),
        "\",\"precision\":\"", absl::GetFlag(FLAGS_precision), "\",\"num_samples\":", B,
        ",\"prompt_len\":", P, ",\"new_tokens\":", N, ",\"reps\":", reps,
        ",\"cached_tokens_per_s\":", cached, ",\"uncached_tokens_per_s\":", uncached,
        ",\"speedup\":", cached / uncached, ",\"same_tokens\":", same ? "true" : "false", "}"));
  }
  for (const std::string& line : json) std::printf("%s\n", line.c_str());
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << "[" << absl::StrJoin(json, ",\n") << "]\n";
    if (!f) return absl::InvalidArgumentError(absl::StrCat("--json_out: cannot write ", json_out));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("minGPT generation with and without the key/value cache.");
  absl::ParseCommandLine(argc, argv);
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "bench_generate: error: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
