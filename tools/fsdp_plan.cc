// The FSDP planner: for a minGPT or T5 preset, the units a wrap policy gives
// and what one rank holds at each world size, from shapes alone (nothing is
// allocated: gpt-175b and gpt-1t plan in well under a second).
//
//   ./bazelw run //tools:fsdp_plan -- --preset=gpt-175b --world_sizes=64,512,1024
//   ./bazelw run //tools:fsdp_plan -- --preset=t5-11b --auto_wrap=transformer --json
//   ./bazelw run //tools:fsdp_plan -- --preset=gpt2-xl --freeze=transformer.wte,transformer.wpe
//
// Per world size: elements per rank, the sharded model state (fp32 parameter
// and gradient shards + optimizer state: (4 + 4 + K) Psi / N plus padding),
// and an upper bound of the unsharded peaks (dist::EstimateFsdpRank): the
// root unit plus, for the unit running, the units enclosing it (nested units:
// --auto_wrap=size:N wraps a module and modules inside it; FSDP keeps the
// outer unit gathered while the inner ones run) and --max_inflight_all_gathers
// units (it and those prefetched), in the compute dtype; fp32 gradients of
// the root, the enclosing units and two units. Without nesting: the root and
// --max_inflight_all_gathers of the largest units. Under --precision=bf16 or
// fp16 each module of a class the train binaries' policy keeps fp32
// (fp32_module_classes: BatchNorm1d, which no preset has) is a unit of its
// own, as FullyShard makes it, gathered and counted in fp32. Activations are
// not included, nor the communication buffers (the ledger's "comm": the
// gradients' reduction under bf16,
// HYBRID's all-reduce between replicas). --sample_every > 0 (the train
// binaries' flags, linked from //models/common:sample_flags: samples during
// training) with --sample_gather=model (their default) plans the sample too:
// the model state and every unit gathered at once (no unsharded gradient
// then), a "sample GiB" column, and the total is the larger of the step's and
// the sample's; not counted: the sample's key/value cache and logits, and the
// low-precision send copies of every unit's gather in flight at once (bf16:
// 2 bytes an element of a rank's shard); --sample_gather=unit holds no more
// than the step's forward does.
// --strategy as the train binaries' flag: shard_grad_op and
// hybrid_shard_zero2 keep every unit gathered from its forward to its
// backward; the hybrid strategies shard within groups of --world_sizes
// ranks. --vocab_size / --num_sentinels / --v1_1 as the train binaries'
// (whose vocabulary is the data's: 256 for byte text, 50257 otherwise).
// --units marks such units "(fp32 gather)" and nested ones "(inside <unit>)".
// --grad_accum_steps > 1: the unsharded gradients' peak is every trainable
// unit's (FSDP's no_sync keeps them between micro-batches). --prefetch_units=k
// (explicit prefetch of the k neighbours) puts k + 1 units in flight;
// --keep_last_unit holds the last trainable unit from its forward on.
// --freeze (the train binaries' patterns): frozen parameters, wrapped as the
// binaries wrap them (dist::WrapPolicy::FrozenLeavesApart); units of frozen
// parameters only hold no gradient shard and no optimizer state. A layout the
// train binaries refuse (T5's tied shared.weight outside the root unit, as
// --auto_wrap=size:N with a small N gives) is an error here too.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dist/fsdp_plan.h"
#include "dist/wrap_policy.h"
#include "models/common/command_line.h"
#include "models/common/data_parallel.h"
#include "models/common/memory_estimate.h"
#include "models/common/sample_flags.h"
#include "models/common/tied_weights.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "models/t5/config.h"
#include "models/t5/model.h"
#include "nn/freeze.h"
#include "precision/policy.h"
#include "tensor/dtype.h"

ABSL_FLAG(std::string, preset, "gpt-175b", "a minGPT preset (gpt-nano .. gpt-1t) or a T5 preset");
ABSL_FLAG(std::string, world_sizes, "8,64,512,1024", "comma-separated shard group sizes");
ABSL_FLAG(std::string, auto_wrap, "transformer", "none, transformer (Block / T5Block) or size:N");
ABSL_FLAG(std::string, strategy, "full_shard",
          "full_shard, shard_grad_op, hybrid_shard or hybrid_shard_zero2, as the train binaries' "
          "flag (the last two: --world_sizes are the shard groups' sizes, "
          "--hybrid_shard_group_size); shard_grad_op keeps every unit gathered from its forward "
          "to its backward");
ABSL_FLAG(std::string, precision, "fp32",
          "compute dtype of the unsharded parameters: fp32, bf16 or fp16 (the train binaries' "
          "flag and default)");
ABSL_FLAG(int64_t, vocab_size, 0,
          "the vocabulary, as the train binaries' flag (minGPT: the embedding's rows; T5: before "
          "--num_sentinels); 0: the preset's (minGPT 50257; T5 32128, Hugging Face's, sentinels "
          "included). Unlike the train binaries' 0, which is the data's (256 for byte text, a "
          "token file's tokenizer's): give that to plan their run");
ABSL_FLAG(std::optional<int64_t>, num_sentinels, std::nullopt,
          "T5, with --vocab_size: sentinel ids added above it (default 100, as the train "
          "binary's)");
ABSL_FLAG(bool, v1_1, false, "T5 v1.1 form of the preset: gated-GELU feed-forward, untied lm_head");
ABSL_FLAG(std::string, optimizer, "adamw",
          "adamw, sgd or sgd-nomomentum (sets K, optimizer bytes per element)");
ABSL_FLAG(int, max_inflight_all_gathers, 2, "units gathered at once besides the root");
ABSL_FLAG(int, grad_accum_steps, 1,
          "micro-batches a step, as the train binaries' flag: above 1 every trainable unit keeps "
          "its unsharded fp32 gradient between them (no_sync)");
ABSL_FLAG(int, prefetch_units, 0,
          "as the train binaries' flag: each unit gathers the next (previous, in backward) N "
          "units ahead, in place of --max_inflight_all_gathers (dist::PrefetchNeighbors)");
ABSL_FLAG(bool, keep_last_unit, false,
          "as the train binaries' flag: the last unit that trains stays gathered from its "
          "forward to its backward");
ABSL_FLAG(bool, json, false, "print one JSON object per world size instead of a table");
ABSL_FLAG(bool, units, false,
          "also list every unit (name, elements, padded, shard); with --json, as the "
          "object's \"unit_list\"");
ABSL_FLAG(std::string, freeze, "",
          "parameters kept frozen, as the train binaries' --freeze (comma-separated names, "
          "modules or globs)");

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int Fail(const std::string& message) {
  std::fprintf(stderr, "fsdp_plan: error: %s\n", message.c_str());
  return 2;
}

// ",\"unit_list\":[{...}, ...]": every unit as --units lists it.
std::string UnitsJson(const dist::ShardingPlan& plan, bool mixed) {
  std::vector<std::string> units;
  for (const dist::ShardingPlan::Unit& u : plan.units) {
    units.push_back(absl::StrCat(
        "{\"name\":\"", u.name, "\",\"params\":", u.num_params, ",\"elements\":", u.numel,
        ",\"padded\":", u.padded_numel, ",\"per_rank\":", u.shard_numel,
        ",\"trains\":", u.trains ? "true" : "false",
        ",\"fp32_gather\":", mixed && u.fp32_numel > 0 ? "true" : "false", ",\"inside\":\"",
        u.parent > 0 ? plan.units[u.parent].name : "", "\"}"));
  }
  return absl::StrCat(",\"unit_list\":[", absl::StrJoin(units, ","), "]");
}

}  // namespace

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(
      argc, argv, "FSDP units and per-rank memory of a preset, without allocating.");
  const std::string preset = absl::GetFlag(FLAGS_preset);
  const int64_t vocab_size = absl::GetFlag(FLAGS_vocab_size);
  const std::optional<int64_t> sentinels_flag = absl::GetFlag(FLAGS_num_sentinels);
  const int64_t num_sentinels = sentinels_flag.value_or(100);
  if (vocab_size < 0 || num_sentinels < 0) {
    return Fail(absl::StrCat("--vocab_size=", vocab_size, " and --num_sentinels=", num_sentinels,
                             " must be >= 0"));
  }
  if (sentinels_flag && (vocab_size == 0 || !absl::StartsWith(preset, "t5"))) {
    return Fail("--num_sentinels adds T5's sentinels to a --vocab_size given (a T5 preset's own "
                "vocabulary holds its sentinels; minGPT has none)");
  }
  std::unique_ptr<nn::Module> model;
  std::string block_class;
  if (absl::StartsWith(preset, "t5")) {
    absl::StatusOr<t5::T5Config> config = t5::Preset(preset);
    if (!config.ok()) return Fail(std::string(config.status().message()));
    if (absl::GetFlag(FLAGS_v1_1)) *config = t5::AsV1_1(*config);
    if (vocab_size > 0) config->vocab_size = vocab_size + num_sentinels;
    model = std::make_unique<t5::T5Model>(*config);
    block_class = "T5Block";
  } else {
    absl::StatusOr<mingpt::GptConfig> config = mingpt::Preset(preset);
    if (!config.ok()) {
      return Fail(absl::StrCat("--preset: unknown preset '", preset, "'; minGPT: ",
                               absl::StrJoin(mingpt::PresetNames(), ", "),
                               "; T5: ", absl::StrJoin(t5::PresetNames(), ", ")));
    }
    if (absl::GetFlag(FLAGS_v1_1)) return Fail("--v1_1 is a T5 form; --preset is minGPT's");
    if (vocab_size > 0) config->vocab_size = vocab_size;
    model = std::make_unique<mingpt::GPT>(*config);
    block_class = "Block";
  }
  const std::string strategy = absl::GetFlag(FLAGS_strategy);
  const bool reshard_after_forward = strategy == "full_shard" || strategy == "hybrid_shard";
  if (!reshard_after_forward && strategy != "shard_grad_op" && strategy != "hybrid_shard_zero2") {
    return Fail(absl::StrCat(
        "--strategy='", strategy, "' is not one of full_shard, shard_grad_op, hybrid_shard, "
        "hybrid_shard_zero2 (no_shard holds at most what shard_grad_op plans at --world_sizes=1; "
        "ddp and zero1 are not FSDP: //tools:bench_memory measures them)"));
  }
  const std::string wrap = absl::GetFlag(FLAGS_auto_wrap);
  dist::WrapPolicy policy = dist::WrapPolicy::None();
  if (wrap == "transformer") {
    policy = dist::WrapPolicy::Transformer({block_class});
  } else if (absl::StartsWith(wrap, "size:")) {
    int64_t min_params = 0;
    if (!absl::SimpleAtoi(wrap.substr(5), &min_params) || min_params < 1) {
      return Fail(absl::StrCat("--auto_wrap='", wrap, "': size:N needs an integer N >= 1"));
    }
    policy = dist::WrapPolicy::SizeBased(min_params);
  } else if (wrap != "none") {
    return Fail(absl::StrCat("--auto_wrap='", wrap, "' is not one of none, transformer, size:N"));
  }
  absl::StatusOr<std::vector<std::string>> patterns =
      nn::ParseFreezePatterns(absl::GetFlag(FLAGS_freeze));
  if (!patterns.ok()) return Fail(std::string(patterns.status().message()));
  // T5's tied shared.weight stays in the root unit, as //models/t5:train
  // requires (minGPT has none of that name).
  const std::vector<std::string> root_params = {"shared.weight"};
  if (!patterns->empty()) {
    absl::StatusOr<std::vector<std::string>> frozen = nn::FreezeParameters(*model, *patterns);
    if (!frozen.ok()) return Fail(absl::StrCat("--freeze: ", frozen.status().message()));
    policy = dist::WrapPolicy::FrozenLeavesApart(std::move(policy), *model, root_params);
  }
  const nn::TrainableCount count = nn::CountTrainable(*model);
  if (count.trainable == 0) {  // as the train binaries refuse it
    return Fail(absl::StrCat("--freeze='", absl::GetFlag(FLAGS_freeze),
                             "' freezes every parameter of the model: nothing would train"));
  }
  // The policy the train binaries build from --precision (the classes it
  // keeps fp32 are units of their own under bf16 and fp16), and its name.
  absl::StatusOr<precision::MixedPrecisionPolicy> mixed =
      precision::MixedPrecisionPolicy::FromName(absl::GetFlag(FLAGS_precision));
  if (!mixed.ok()) return Fail(absl::StrCat("--precision: ", mixed.status().message()));
  const std::string precision = mixed->param_dtype == tensor::Dtype::kBF16  ? "bf16"
                                : mixed->param_dtype == tensor::Dtype::kF16 ? "fp16"
                                                                             : "fp32";
  // FullyShard's units under that policy (modules kept fp32 apart under bf16 and fp16).
  absl::Status tied = train::CheckTiedWeightsInRoot(*model, policy.ForMixedPrecision(*mixed),
                                                    wrap, root_params, /*must_exist=*/false);
  if (!tied.ok()) return Fail(std::string(tied.message()));
  absl::StatusOr<int> k = train::OptimizerBytesPerParameter(absl::GetFlag(FLAGS_optimizer));
  if (!k.ok()) return Fail(std::string(k.status().message()));
  std::vector<int> worlds;
  absl::StatusOr<std::vector<std::string>> world_sizes =
      train::SplitListFlag("world_sizes", absl::GetFlag(FLAGS_world_sizes));
  if (!world_sizes.ok()) return Fail(std::string(world_sizes.status().message()));
  if (world_sizes->empty()) return Fail("--world_sizes is empty: give the shard group sizes");
  for (const std::string& w : *world_sizes) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1 || n > INT_MAX) {
      return Fail(absl::StrCat("--world_sizes: '", w, "' is not an integer in [1, ", INT_MAX,
                               "]"));
    }
    worlds.push_back(static_cast<int>(n));
  }
  const int max_inflight = absl::GetFlag(FLAGS_max_inflight_all_gathers);
  if (max_inflight < 1) {  // dist::FullyShard refuses it too
    return Fail(absl::StrCat("--max_inflight_all_gathers=", max_inflight,
                             " must be >= 1 (1: no prefetch)"));
  }
  const int grad_accum_steps = absl::GetFlag(FLAGS_grad_accum_steps);
  if (grad_accum_steps < 1) {
    return Fail(absl::StrCat("--grad_accum_steps=", grad_accum_steps, " must be >= 1"));
  }
  const int prefetch_units = absl::GetFlag(FLAGS_prefetch_units);
  if (prefetch_units < 0) {
    return Fail(absl::StrCat("--prefetch_units=", prefetch_units, " must be >= 0 (0: none)"));
  }
  if (prefetch_units > 0 && max_inflight != 2) {  // as the train binaries refuse it
    return Fail(absl::StrCat("--prefetch_units=", prefetch_units, " prefetches that many units "
                             "ahead in place of --max_inflight_all_gathers=", max_inflight,
                             ", which it would ignore: give one or the other"));
  }
  const bool keep_last_unit = absl::GetFlag(FLAGS_keep_last_unit);
  if (keep_last_unit && !reshard_after_forward) {  // as the train binaries refuse it
    return Fail(absl::StrCat("--keep_last_unit keeps a unit FULL_SHARD or HYBRID_SHARD would "
                             "reshard after its forward; --strategy=",
                             strategy, " reshards none"));
  }
  // --keep_last_unit's: the last unit in pre-order that trains and holds more
  // than modules kept fp32, as the train binaries pick it (the same units at
  // every world size).
  int kept_unit = 0;
  if (keep_last_unit) {
    const dist::ShardingPlan plan = dist::PlanSharding(*model, policy, 1, *mixed);
    kept_unit = static_cast<int>(plan.units.size()) - 1;
    while (kept_unit > 0 && (!plan.units[kept_unit].trains ||
                             plan.units[kept_unit].fp32_numel == plan.units[kept_unit].numel)) {
      --kept_unit;
    }
    if (kept_unit == 0) {
      return Fail(absl::StrCat("--keep_last_unit: --auto_wrap=", wrap,
                               " gives no unit but the root that trains (units of frozen "
                               "parameters or of modules kept fp32 only are passed over)"));
    }
  }
  // The train binaries' sampling flags (the same definitions), refused alike.
  absl::StatusOr<train::SampleSchedule> sampling = train::SampleScheduleFromCommandLine();
  if (!sampling.ok()) return Fail(std::string(sampling.status().message()));
  const bool whole_model_samples =
      sampling->every > 0 && sampling->gather == train::DataParallelModel::Gather::kWholeModel;
  dist::FsdpEstimateOptions options;
  options.no_sync = grad_accum_steps > 1;
  options.prefetch_units = prefetch_units;
  options.param_bytes = static_cast<int>(tensor::DtypeSize(mixed->param_dtype));
  options.optimizer_bytes = *k;
  options.max_inflight_all_gathers = max_inflight;
  options.reshard_after_forward = reshard_after_forward;
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("%s | %s%s | auto_wrap %s | %s compute, %s (K=%d) | parameters: %lld",
                preset.c_str(), strategy.c_str(),
                absl::StartsWith(strategy, "hybrid") ? " (world: the shard group)" : "",
                wrap.c_str(), precision.c_str(), absl::GetFlag(FLAGS_optimizer).c_str(), *k,
                static_cast<long long>(count.total));
    if (count.trainable < count.total) {
      std::printf(", %lld trainable", static_cast<long long>(count.trainable));
    }
    if (options.no_sync) {
      std::printf(" | %d micro-batches: every unit's gradient kept (no_sync)", grad_accum_steps);
    }
    if (prefetch_units > 0) {
      std::printf(" | explicit prefetch: %d units in flight", prefetch_units + 1);
    }
    if (keep_last_unit) std::printf(" | last unit kept gathered");
    if (whole_model_samples) {
      std::printf(" | a sample every %lld steps, the whole model gathered",
                  static_cast<long long>(sampling->every));
    }
    std::printf("\n");
    std::printf("%7s %6s %16s %12s %14s %14s%s %12s\n", "world", "units", "elements/rank",
                "state GiB", "unsh. params", "unsh. grads",
                whole_model_samples ? "   sample GiB" : "", "total GiB");
  }
  for (int world : worlds) {
    const dist::ShardingPlan plan =
        dist::PlanSharding(*model, policy, world, *mixed);
    if (keep_last_unit) options.kept_units = {kept_unit};
    const dist::FsdpRankBytes b = dist::EstimateFsdpRank(plan, options);
    // The step's peak, or a sample's with the whole model gathered when larger.
    const int64_t total =
        whole_model_samples ? std::max(b.peak(), b.whole_model_peak()) : b.peak();
    if (json) {
      std::printf(
          "{\"preset\":\"%s\",\"strategy\":\"%s\",\"precision\":\"%s\",\"auto_wrap\":\"%s\","
          "\"world_size\":%d,\"grad_accum_steps\":%d,\"sample_every\":%lld,"
          "\"sample_gather\":\"%s\","
          "\"prefetch_units\":%d,\"keep_last_unit\":%s,\"units\":%zu,"
          "\"parameters\":%lld,\"trainable\":%lld,\"elements_per_rank\":%lld,"
          "\"model_state_bytes\":%lld,"
          "\"unsharded_parameters_peak_bytes\":%lld,\"unsharded_gradients_peak_bytes\":%lld,"
          "%s\"peak_bytes\":%lld%s}\n",
          preset.c_str(), strategy.c_str(), precision.c_str(), wrap.c_str(), world,
          grad_accum_steps, static_cast<long long>(sampling->every),
          sampling->gather == train::DataParallelModel::Gather::kWholeModel ? "model" : "unit",
          prefetch_units,
          keep_last_unit ? "true" : "false", plan.units.size(),
          static_cast<long long>(plan.total_numel), static_cast<long long>(count.trainable),
          static_cast<long long>(plan.shard_numel), static_cast<long long>(b.model_state()),
          static_cast<long long>(b.unsharded_parameters_peak),
          static_cast<long long>(b.unsharded_gradients_peak),
          whole_model_samples
              ? absl::StrCat("\"sample_peak_bytes\":", b.whole_model_peak(), ",").c_str()
              : "",
          static_cast<long long>(total),
          absl::GetFlag(FLAGS_units) ? UnitsJson(plan, mixed->IsMixed()).c_str() : "");
    } else {
      std::printf("%7d %6zu %16lld %12.3f %14.3f %14.3f%s %12.3f\n", world, plan.units.size(),
                  static_cast<long long>(plan.shard_numel), b.model_state() / kGiB,
                  b.unsharded_parameters_peak / kGiB, b.unsharded_gradients_peak / kGiB,
                  whole_model_samples
                      ? absl::StrFormat(" %12.3f", b.whole_model_peak() / kGiB).c_str()
                      : "",
                  total / kGiB);
    }
    if (absl::GetFlag(FLAGS_units) && !json) {
      for (const dist::ShardingPlan::Unit& u : plan.units) {
        const bool fp32 = mixed->IsMixed() && u.fp32_numel > 0;
        const std::string inside =
            u.parent > 0 ? absl::StrCat(" (inside ", plan.units[u.parent].name, ")") : "";
        std::printf("    %-28s %4d params %16lld elements %16lld padded %14lld per rank%s%s%s\n",
                    u.name.empty() ? "<root>" : u.name.c_str(), u.num_params,
                    static_cast<long long>(u.numel), static_cast<long long>(u.padded_numel),
                    static_cast<long long>(u.shard_numel), u.trains ? "" : " (frozen)",
                    fp32 ? " (fp32 gather)" : "", inside.c_str());
      }
    }
  }
  return 0;
}
