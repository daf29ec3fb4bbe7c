// Token sources, optimizers and LR schedules from train flags.
#include "models/common/train_setup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/data/byte_text.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/random_tokens.h"
#include "models/data/token_file.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/cuda_backend.h"
#include "tensor/guarded.h"

namespace train {

absl::StatusOr<tensor::Device> ResolveDevice(const std::string& flag) {
  absl::StatusOr<tensor::Device> device = tensor::ParseDevice(flag);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat("--device=", flag, ": ", device.status().message()));
  }
  if (!device->is_cuda()) return device;
  if (!tensor::cuda::Built()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", flag, ": this binary was built without CUDA; rebuild with "
                     "--config=cuda"));
  }
  if (device->index >= tensor::cuda::DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", flag, ": ", tensor::cuda::DeviceCount(), " CUDA devices are visible"));
  }
  return device;
}

absl::StatusOr<Compute> ResolveCompute(const std::string& device_flag,
                                       const std::string& precision_flag) {
  absl::StatusOr<precision::MixedPrecisionPolicy> policy =
      precision::MixedPrecisionPolicy::FromName(precision_flag);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--precision: ", policy.status().message()));
  }
  absl::StatusOr<tensor::Device> device = ResolveDevice(device_flag);
  if (!device.ok()) return device.status();
  absl::Status valid = policy->Validate(*device);
  if (!valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat("--precision: ", valid.message()));
  }
  return Compute{*device, *policy};
}

absl::StatusOr<std::shared_ptr<const data::TokenSource>> OpenTokenSource(const std::string& spec,
                                                                         uint64_t seed,
                                                                         int64_t vocab_size,
                                                                         absl::string_view flag) {
  const int64_t vocab = vocab_size > 0 ? vocab_size : data::kGpt2VocabSize;
  absl::StatusOr<std::shared_ptr<const data::TokenSource>> source;
  if (spec == "shipped") {
    source = data::ByteTextSource::OpenDefault(seed);
  } else if (spec == "random") {
    source = data::RandomTokenSource::Create(seed, vocab);
  } else if (absl::EndsWith(spec, ".bin")) {
    // The record tools/tokenize wrote beside it, if any: its tokenizer's
    // vocabulary, and a check that it describes this file.
    absl::StatusOr<std::optional<data::TokenFileMeta>> meta = data::ReadTokenFileMeta(spec);
    if (!meta.ok()) {
      source = meta.status();
    } else {
      absl::StatusOr<std::unique_ptr<data::TokenFileSource>> file = data::TokenFileSource::Open(
          spec, seed, vocab_size > 0 || !meta->has_value() ? vocab : (*meta)->vocab_size);
      if (file.ok() && meta->has_value() && (*meta)->num_tokens != (*file)->file().num_tokens()) {
        source = absl::InvalidArgumentError(absl::StrCat(
            data::TokenFileMetaPath(spec), " records ", (*meta)->num_tokens, " tokens but ", spec,
            " holds ", (*file)->file().num_tokens(),
            ": a record of another file; remove it or write both again with //tools:tokenize"));
      } else if (file.ok()) {
        source = std::shared_ptr<const data::TokenSource>(*std::move(file));
      } else {
        source = file.status();
      }
    }
  } else {
    source = data::ByteTextSource::Open(spec, seed);
  }
  if (source.ok()) return source;
  // A flag's value that does not work: exit status 2, naming the flag.
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", spec, ": ", source.status().message()));
}

namespace {

// shipped or a text file: every byte a token.
bool IsByteText(const std::string& data) {
  return data != "random" && !absl::EndsWith(data, ".bin");
}

}  // namespace

absl::StatusOr<std::optional<std::string>> RecordedTokenizer(const std::string& data) {
  if (!absl::EndsWith(data, ".bin")) return std::optional<std::string>();
  absl::StatusOr<std::optional<data::TokenFileMeta>> read = data::ReadTokenFileMeta(data);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", read.status().message()));
  }
  if (!read->has_value()) return std::optional<std::string>();
  return std::optional<std::string>((*read)->tokenizer);
}

absl::StatusOr<std::string> ResolveTokenizer(const std::string& flag, const std::string& data,
                                             const std::string& from_weights, int64_t model_vocab) {
  const bool byte_text = IsByteText(data);
  std::string name;
  if (flag == "auto") {
    if (byte_text) return std::string();
    absl::StatusOr<std::optional<std::string>> recorded = RecordedTokenizer(data);
    if (!recorded.ok()) return recorded.status();
    name = recorded->has_value() ? **recorded : from_weights;
    if (name.empty()) return std::string();
  } else if (flag == "none") {
    return std::string();
  } else {
    if (byte_text) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer=", flag, " with --data=", data,
          ": text data is read as bytes (a vocabulary of 256); encode it with //tools:tokenize "
          "and train on the .bin file"));
    }
    name = data::Gpt2Tokenizer::RecordName(flag);
  }
  absl::StatusOr<data::Gpt2Tokenizer> tokenizer =
      data::Gpt2Tokenizer::OpenForModel(name, model_vocab);
  if (!tokenizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer=", flag, flag == name ? "" : " (" + name + ")", ": ",
                     tokenizer.status().message(),
                     flag == "auto" ? " (--tokenizer=none trains without recording one)" : ""));
  }
  return name;
}

absl::Status CheckInitFromData(const std::string& tokenizer_flag, const std::string& data,
                               const std::string& init_from, const std::string& weights_tokenizer,
                               bool hugging_face, int64_t model_vocab) {
  if (tokenizer_flag == "none" || !IsByteText(data)) return absl::OkStatus();
  std::string why;
  if (!weights_tokenizer.empty()) {
    why = absl::StrCat("the weights' ids are tokens of the tokenizer ", weights_tokenizer,
                       " they record");
  } else if (hugging_face && model_vocab != data::kByteVocabSize) {
    why =
        absl::StrCat("the weights are a Hugging Face model of ", model_vocab,
                     " token ids (GPT-2's BPE has 50257), not of ", data::kByteVocabSize, " bytes");
  } else {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--init_from=", init_from, " with --data=", data, ": ", why,
      ", but --data is byte-level text (its ids are byte values 0..255, not those tokens): "
      "encode it with //tools:tokenize (text -> GPT-2 token ids) and train on the .bin file, "
      "or give --tokenizer=none to train on the bytes anyway"));
}

std::string EvalFlags::SourceFlag() const {
  return data.empty() && val_fraction > 0
             ? absl::StrCat("--val_fraction=", absl::StrFormat("%.10g", val_fraction))
             : "--eval_data";
}

absl::Status CheckGradClip(double grad_clip) {
  if (grad_clip >= 0 && std::isfinite(grad_clip)) return absl::OkStatus();  // NaN fails too
  return absl::InvalidArgumentError(absl::StrCat(
      "--grad_clip=", grad_clip, " must be finite and >= 0 (0 disables clipping)"));
}

bool OffDefault(const absl::CommandLineFlag& flag) {
  return flag.CurrentValue() != flag.DefaultValue();
}

absl::Status CheckGradAccumSteps(int64_t grad_accum_steps) {
  if (grad_accum_steps >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--grad_accum_steps=", grad_accum_steps,
                                                 " must be >= 1 (1: no gradient accumulation)"));
}

absl::Status CheckLoopFlags(int64_t steps, int64_t log_every, int64_t checkpoint_every,
                            const std::string& checkpoint_dir) {
  if (steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps=", steps, " must be >= 0"));
  }
  if (log_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_every=", log_every, " must be >= 1 (the first and last steps always print)"));
  }
  if (checkpoint_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint_every=", checkpoint_every,
                                                   " must be >= 0 (0: at the end only)"));
  }
  if (checkpoint_every > 0 && checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_every=", checkpoint_every, " needs --checkpoint_dir to save into"));
  }
  return absl::OkStatus();
}

std::string AccumulationPrefix(int64_t grad_accum_steps) {
  if (grad_accum_steps == 1) return "";
  return absl::StrCat(grad_accum_steps, " micro-batches x ");
}

namespace {

// --eval_every >= 0 and --eval_batches >= 1.
absl::Status CheckEvalSchedule(const EvalFlags& flags) {
  if (flags.every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval_every=", flags.every, " must be >= 0 (0: after the last step)"));
  }
  if (flags.batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval_batches=", flags.batches, " must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const data::TokenSource>> OpenEvalSource(const EvalFlags& flags,
                                                                        uint64_t seed,
                                                                        int64_t vocab_size) {
  absl::Status schedule = CheckEvalSchedule(flags);
  if (!schedule.ok()) return schedule;
  if (flags.data.empty()) return std::shared_ptr<const data::TokenSource>();
  return OpenTokenSource(flags.data, seed + 1, vocab_size, "--eval_data");
}

absl::StatusOr<DataSources> OpenDataSources(const std::string& data, const EvalFlags& flags,
                                            uint64_t seed, int64_t vocab_size) {
  absl::StatusOr<std::shared_ptr<const data::TokenSource>> source =
      OpenTokenSource(data, seed, vocab_size);
  if (!source.ok()) return source.status();
  const double f = flags.val_fraction;
  if (f == 0.0) {
    absl::StatusOr<std::shared_ptr<const data::TokenSource>> eval =
        OpenEvalSource(flags, seed, vocab_size);
    if (!eval.ok()) return eval.status();
    if (*eval == nullptr && (flags.every_given || flags.batches_given)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flags.every_given ? absl::StrCat("--eval_every=", flags.every)
                            : absl::StrCat("--eval_batches=", flags.batches),
          " without evaluation data: give --eval_data, or --val_fraction to hold out part of "
          "--data (without either nothing is evaluated)"));
    }
    return DataSources{*std::move(source), *std::move(eval)};
  }
  auto error = [f](absl::string_view why) {  // f as given (0.9999999 is not said as 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--val_fraction=", absl::StrFormat("%.10g", f), ": ", why));
  };
  if (!(f > 0.0 && f < 1.0)) return error("must be in [0, 1) (0: no held-out part)");
  if (!flags.data.empty()) {
    return error(absl::StrCat("holds out part of --data for evaluation, and --eval_data=",
                              flags.data, " names other data: give one of them"));
  }
  absl::Status schedule = CheckEvalSchedule(flags);
  if (!schedule.ok()) return schedule;
  const int64_t total = (*source)->max_sequence_length();
  if (total == data::kUnlimitedLength) {
    return error(absl::StrCat((*source)->Describe(),
                              " has no fixed tokens to hold out (use a file, or shipped)"));
  }
  const int64_t held_out = static_cast<int64_t>(std::llround(f * static_cast<double>(total)));
  if (held_out < 1 || held_out >= total) {
    return error(absl::StrCat("holds out ", held_out, " of the ", total, " tokens of ",
                              (*source)->Describe(), ": both parts need tokens"));
  }
  absl::StatusOr<std::unique_ptr<data::TokenSource>> eval =
      (*source)->Slice(total - held_out, total, seed + 1);
  if (!eval.ok()) return error(eval.status().message());
  absl::StatusOr<std::unique_ptr<data::TokenSource>> train =
      (*source)->Slice(0, total - held_out, seed);
  if (!train.ok()) return error(train.status().message());
  return DataSources{*std::move(train), *std::move(eval)};
}

absl::Status TrainDataFailure(const absl::Status& failure, const EvalFlags& flags) {
  // The loaders' "... is too small: a sample needs N tokens": the held-out
  // tail may be why; their other checks (batch, layout) are not.
  if (failure.ok() || !(flags.val_fraction > 0) ||
      !absl::StrContains(failure.message(), "is too small")) {
    return failure;
  }
  return absl::Status(failure.code(),
                      absl::StrCat("--val_fraction=", absl::StrFormat("%.10g", flags.val_fraction),
                                   ": the training part (the first ", 1.0 - flags.val_fraction,
                                   " of --data): ", failure.message()));
}

bool EvalAfter(const EvalFlags& flags, int64_t step_done, int64_t steps) {
  return step_done == steps || (flags.every > 0 && step_done % flags.every == 0);
}

std::string EvalLine(const data::TokenSource& eval, const EvalFlags& flags) {
  return absl::StrCat("eval: ", eval.Describe(), " | ", flags.batches,
                      flags.batches == 1 ? " batch " : " batches ",
                      flags.every == 1  ? "every step and "
                      : flags.every > 1 ? absl::StrCat("every ", flags.every, " steps and ")
                                        : "",
                      "after the last");
}

absl::Status CheckWritableFile(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st {};
  const bool existed = ::lstat(path.c_str(), &st) == 0;  // a link (even dangling) is kept
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsWriter>> OpenMetrics(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MetricsWriter>> w = MetricsWriter::Open(path);
  if (w.ok()) return w;
  return absl::InvalidArgumentError(absl::StrCat("--metrics_out: ", w.status().message()));
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const OptimizerSpec& spec) {
  if (spec.name == "adamw") {
    if (spec.momentum.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--momentum=", *spec.momentum,
          " is an SGD option; --optimizer=adamw has none (its first moment decays with "
          "beta1 = 0.9): drop --momentum or use --optimizer=sgd"));
    }
    optim::AdamWOptions o;
    o.lr = spec.lr;
    o.beta2 = spec.beta2;
    o.weight_decay = spec.weight_decay;
    auto opt = optim::AdamW::Create(o);
    if (!opt.ok()) return opt.status();
    return std::unique_ptr<optim::Optimizer>(std::move(*opt));
  }
  if (spec.name == "sgd") {
    // optim::SGD takes any momentum >= 0, as PyTorch's does; a training run
    // with 1 or more never forgets a gradient and its steps grow without end.
    if (spec.momentum.has_value() && !(*spec.momentum >= 0 && *spec.momentum < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--momentum=", *spec.momentum,
          " must be in [0, 1): the momentum buffer keeps that fraction of itself each step"));
    }
    optim::SgdOptions o;
    o.lr = spec.lr;
    o.momentum = spec.momentum.value_or(0.9);
    o.weight_decay = spec.weight_decay;
    auto opt = optim::SGD::Create(o);
    if (!opt.ok()) return opt.status();
    return std::unique_ptr<optim::Optimizer>(std::move(*opt));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer='", spec.name, "' is not one of adamw, sgd"));
}

absl::StatusOr<std::unique_ptr<optim::LrSchedule>> MakeLrSchedule(const std::string& spec,
                                                                  double lr, int64_t steps,
                                                                  bool lr_set) {
  absl::StatusOr<std::unique_ptr<optim::LrSchedule>> schedule;
  std::vector<std::string> filled;  // the keys --lr and --steps gave a spec
  const absl::string_view kind = absl::StripAsciiWhitespace(spec);  // as the parser reads it
  if (kind == "constant") {
    schedule = optim::ParseLrSchedule(absl::StrCat("constant:lr=", lr));
  } else if (kind == "cosine") {
    // 10% warmup, at least a step (none for --steps=0, which trains nothing).
    const int64_t warmup = std::min(steps, std::max<int64_t>(1, steps / 10));
    schedule = optim::ParseLrSchedule(absl::StrCat("cosine:max_lr=", lr, ",min_lr=", lr / 10,
                                                   ",warmup_steps=", warmup,
                                                   ",total_steps=", steps));
  } else if (absl::StatusOr<optim::LrSpec> parsed = optim::ParseLrSpec(spec); !parsed.ok()) {
    schedule = parsed.status();
  } else {
    // What the spec leaves out: its rate is --lr's and a cosine decays over --steps.
    optim::LrScheduleOptions& o = parsed->options;
    if (parsed->keys.count("total_steps") > 0 && o.total_steps < 1) {
      // A decay over no step: every step would run at min_lr (0 unless given).
      return absl::InvalidArgumentError(absl::StrCat(
          "--lr_schedule='", spec, "': total_steps=", o.total_steps, " must be >= 1 (the steps "
          "the decay lasts; leave it out to decay over --steps)"));
    }
    const bool constant = o.kind == "constant";
    const char* rate_key = constant ? "lr" : "max_lr";
    if (parsed->keys.count(rate_key) > 0 && lr_set) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--lr=", lr, " with --lr_schedule='", spec, "': the spec sets its own ", rate_key,
          ", so --lr would be ignored; drop one of them"));
    }
    if (parsed->keys.count(rate_key) == 0) {
      (constant ? o.lr : o.max_lr) = lr;
      filled.push_back(absl::StrCat(rate_key, " from --lr"));
    }
    if (!constant && parsed->keys.count("total_steps") == 0) {
      o.total_steps = steps;
      filled.push_back("total_steps from --steps");
    }
    schedule = optim::MakeLrSchedule(o);
  }
  if (schedule.ok()) return schedule;
  return absl::Status(
      schedule.status().code(),
      absl::StrCat("--lr_schedule='", spec, "' (--lr=", lr, ", --steps=", steps,
                   filled.empty() ? "" : absl::StrCat("; ", absl::StrJoin(filled, ", ")),
                   "): ", schedule.status().message()));
}

void RecordRunSettings(const optim::LrSchedule& schedule, const optim::Optimizer& optimizer,
                       const std::string& precision, std::map<std::string, std::string>& extra) {
  extra["lr_schedule"] = schedule.ToString();
  extra["optimizer_settings"] = optimizer.Settings();
  if (!precision.empty()) extra["precision"] = precision;
}

void NoteRunSettingsChanges(const TrainState& resumed, const optim::LrSchedule& schedule,
                            const optim::Optimizer& optimizer, const std::string& config,
                            const std::string& precision) {
  const auto note = [&](const char* key, const char* what, const std::string& now) {
    auto it = resumed.extra.find(key);
    if (it == resumed.extra.end() || it->second == now) return;
    std::fprintf(stderr, "train: note: the checkpoint was trained with %s %s; continuing with %s\n",
                 what, it->second.c_str(), now.c_str());
  };
  note("lr_schedule", "lr schedule", schedule.ToString());
  note("optimizer_settings", "optimizer", optimizer.Settings());
  if (!precision.empty()) note("precision", "precision", precision);
  if (auto it = resumed.extra.find("config"); !config.empty() && it != resumed.extra.end()) {
    for (const std::string& change : ResumedModelChanges(it->second, config)) {
      std::fprintf(stderr, "train: note: %s\n", change.c_str());
    }
  }
}

void DropMetricsAfter(MetricsWriter& metrics, int64_t step) {
  absl::Status s = metrics.DropAfter(step);
  if (s.ok()) return;
  std::fprintf(stderr,
               "train: warning: --metrics_out: %s; it may hold the steps after %lld twice\n",
               std::string(s.message()).c_str(), static_cast<long long>(step));
}

int RunTrainMain(const std::function<absl::Status()>& train,
                 const std::function<void(const absl::Status&)>& on_failure) {
  const absl::Status s = tensor::Guarded(train);
  if (s.ok()) return 0;
  std::fprintf(stderr, "train: error: %s\n", std::string(s.message()).c_str());
  std::fflush(stderr);
  if (on_failure) {
    try {
      on_failure(s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train: note: after the error: %s\n", e.what());
    }
  }
  // (A sample's own error already names what holds less: --sample_gather=unit.)
  if (s.code() == absl::StatusCode::kResourceExhausted &&
      absl::StrContains(s.message(), "out of memory") &&
      !absl::StrContains(s.message(), "--sample_gather=unit")) {
    std::fprintf(stderr,
                 "train: a rank needs less memory with a smaller --batch_size (--grad_accum_steps "
                 "keeps the global batch), --activation_checkpointing, --precision=bf16 on a GPU, "
                 "or its state sharded over more ranks (--strategy=full_shard "
                 "--auto_wrap=transformer; --cpu_offload keeps the optimizer state on the host)\n");
  }
  if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    std::fprintf(stderr,
                 "train: a rank waited longer than --timeout_s for another (one that hung, "
                 "exited or runs far slower); raise --timeout_s where steps or saves are that "
                 "slow\n");
  }
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace train
