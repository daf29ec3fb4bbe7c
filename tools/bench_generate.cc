// Generation speed of minGPT and T5 with and without the key/value cache,
// measured side by side in one process:
//
//   ./bazelw run //tools:bench_generate -- --presets=gpt-mini,gpt2,t5-small --max_new_tokens=256
//
// Per preset: one randomly initialized model (weights do not change the
// work), --num_samples rows of --max_new_tokens new tokens (temperature 0.8,
// top-k 200, as minGPT's sample binary's defaults). minGPT continues a
// --prompt_len token prompt; T5 encodes a --prompt_len token input and
// decodes from its start token (no EOS: every row runs to the end). --reps runs of each,
// interleaved cached / uncached / uncached / cached ..., so slow drifts in machine load hit both
// alike. Reported: the median tokens/s of each (new tokens of all rows per second), their ratio,
// and whether both drew the same tokens (they should: the same logits up to
// rounding). A table, then one JSON object per preset (--json_out writes the
// JSON array to a file too).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
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
#include "models/t5/config.h"
#include "models/t5/generate.h"
#include "models/t5/model.h"
#include "nn/mixed_precision.h"
#include "precision/policy.h"

ABSL_FLAG(std::string, presets, "gpt-mini,gpt2", "comma-separated minGPT or T5 presets");
ABSL_FLAG(int64_t, num_samples, 1, "rows generated together (the batch)");
ABSL_FLAG(int64_t, prompt_len, 1, "prompt tokens per row (T5: encoder input tokens)");
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

// A prompt or encoder input per row: (B, P) ids below V.
Rows Prompts(int64_t B, int64_t P, int64_t V) {
  Rows prompts(B, std::vector<int64_t>(P));
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < P; ++t) prompts[r][t] = (r * 131 + t * 17 + 1) % V;
  }
  return prompts;
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
  mingpt::SamplingOptions options;
  options.max_new_tokens = N;
  options.temperature = 0.8;
  options.top_k = 200;
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
  std::vector<int64_t> flat;  // (B, P)
  for (const std::vector<int64_t>& row : Prompts(B, P, config.vocab_size)) {
    flat.insert(flat.end(), row.begin(), row.end());
  }
  const tensor::Tensor inputs = tensor::Tensor::FromData<int64_t>(flat, {B, P}).To(compute.device);
  t5::GenerateOptions options;
  options.max_new_tokens = N;
  options.temperature = 0.8;
  options.top_k = 200;
  return TimeBothWays(reps, B * N, [&](bool kv_cache) {
    options.kv_cache = kv_cache;
    return t5::Generate(model, inputs, tensor::Tensor(), options);
  });
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
  const std::vector<std::string> presets = absl::StrSplit(absl::GetFlag(FLAGS_presets), ',');
  for (const std::string& name : presets) {  // every name checked before any run
    if (!mingpt::Preset(name).ok() && !t5::Preset(name).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--presets: '", name, "' is neither a minGPT preset (",
                       absl::StrJoin(mingpt::PresetNames(), ", "), ") nor a T5 one (",
                       absl::StrJoin(t5::PresetNames(), ", "), ")"));
    }
  }

  std::printf("generation, %lld row(s) x (%lld prompt + %lld new tokens), %s, %s, %lld reps\n",
              static_cast<long long>(B), static_cast<long long>(P), static_cast<long long>(N),
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
        ",\"new_tokens\":", N, ",\"reps\":", reps, ",\"cached_tokens_per_s\":", timed->cached,
        ",\"uncached_tokens_per_s\":", timed->uncached, ",\"speedup\":",
        timed->cached / timed->uncached, ",\"same_tokens\":", timed->same ? "true" : "false", "}"));
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
  absl::SetProgramUsageMessage("minGPT and T5 generation with and without the key/value cache.");
  absl::ParseCommandLine(argc, argv);
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "bench_generate: error: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
