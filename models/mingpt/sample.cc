// Samples text from a trained minGPT (nanoGPT's sample.py):
//   ./bazelw run //models/mingpt:train -- --checkpoint_dir=/tmp/ck --steps=2000
//   ./bazelw run //models/mingpt:sample -- --checkpoint=/tmp/ck --prompt="Light is"
// --checkpoint is a step folder or a --checkpoint_dir (its latest step), of
// either kind: single-process / DDP, or sharded (FSDP, ZeRO-1, any world
// size), or a Hugging Face GPT-2 folder (config.json + model.safetensors, e.g.
// the hub's gpt2; see pretrained.h). The model's configuration comes from it.
//
// Byte-level models (vocabulary 256: trained on text or the shipped data)
// take --prompt as text and print text. Models of token ids do the same with
// a tokenizer: by default the one that goes with the checkpoint (train
// records the tokenizer //tools:tokenize recorded beside its data; a Hugging
// Face folder's own vocab.json + merges.txt), or --tokenizer=gpt2 (GPT-2's) or
// a folder with vocab.json + merges.txt; without one they take
// --prompt_tokens=id,id,... and print ids. Samples go to stdout, separated by a dashed line;
// what was loaded and the speed go to stderr. A context longer than the
// model's block_size is cropped to its last block_size tokens. Until then
// each new token runs one position against the cached keys and values of the
// earlier ones (--kv_cache, the default). --prompts_file continues several
// prompts, one per line, in one batch (--num_samples rows each; shorter
// prompts are left-padded and masked, generate.h), printed in the file's order.
// --num_beams > 1 is beam search (Hugging Face's generate(num_beams=K)): each
// prompt's --num_samples best hypotheses, printed when the search ends;
// --eos_id ends a row, not before --min_new_tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/common/command_line.h"
#include "models/common/decoding_flags.h"
#include "models/common/tool_main.h"
#include "models/common/train_setup.h"
#include "models/data/gpt2_tokenizer.h"
#include "models/data/mapped_file.h"
#include "models/data/runfiles.h"
#include "models/mingpt/config.h"
#include "models/mingpt/generate.h"
#include "models/mingpt/model.h"
#include "models/mingpt/pretrained.h"
#include "models/mingpt/text.h"
#include "nn/mixed_precision.h"
#include "nn/state_dict.h"
#include "precision/policy.h"

ABSL_FLAG(std::string, checkpoint, "",
          "a step folder, a --checkpoint_dir (its latest step), or a Hugging Face GPT-2 folder");
constexpr char kDefaultPrompt[] = "\n";
ABSL_FLAG(std::string, prompt, kDefaultPrompt,
          "text to continue (byte-level models, or with a tokenizer)");
ABSL_FLAG(std::string, prompt_tokens, "",
          "token ids to continue, comma-separated (instead of --prompt)");
ABSL_FLAG(std::string, prompts_file, "",
          "a file of prompts, one per line (empty lines skipped; as --prompt each), continued in "
          "one batch, --num_samples rows each; instead of --prompt / --prompt_tokens");
ABSL_FLAG(int64_t, num_samples, 1,
          "samples drawn per prompt (one batch); with --num_beams, the prompt's best hypotheses "
          "(at most --num_beams)");
ABSL_FLAG(int64_t, max_new_tokens, 256, "tokens generated per sample");
ABSL_FLAG(double, temperature, 0.8, "divides the logits; 0: greedy");
ABSL_FLAG(int64_t, top_k, 200, "keep the k most likely tokens; 0: all");
ABSL_FLAG(double, top_p, 1.0, "keep the most likely tokens up to this probability; 1: all");
ABSL_FLAG(uint64_t, seed, 1, "seed of the draws");
ABSL_FLAG(int64_t, eos_id, -1,
          "a sample stops after this id (GPT-2's <|endoftext|>: 50256); -1: none");
ABSL_FLAG(bool, kv_cache, true,
          "keep earlier positions' keys and values (while the sequence fits in block_size)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, precision, "fp32", "fp32, bf16 or fp16 compute");
ABSL_FLAG(std::string, print, "auto",
          "text, tokens, or auto (text for byte-level models and with a tokenizer)");
ABSL_FLAG(std::string, tokenizer, "auto",
          "auto (the one the checkpoint records, which train takes from tokenize's record of "
          "its data, or a Hugging Face folder's own vocab.json + merges.txt), none, gpt2 (the "
          "repository's copy of GPT-2's), or a folder with vocab.json + merges.txt");

namespace mingpt {
namespace {

// The tokenizer --tokenizer names, if any, checked against the model. auto:
// the one that goes with the weights (the checkpoint's record, or the Hugging
// Face folder's own files).
absl::StatusOr<std::optional<data::Gpt2Tokenizer>> LoadTokenizer(const PretrainedSources& weights) {
  const std::string flag = absl::GetFlag(FLAGS_tokenizer);
  if (flag == "none" || (flag == "auto" && weights.tokenizer.empty())) return std::nullopt;
  const std::string name = flag == "auto" ? weights.tokenizer : flag;
  // How errors name it: the flag, and for auto where it came from.
  const std::string named =
      flag == "auto" ? absl::StrCat("the tokenizer ", name, " that ", weights.source, " records")
                     : absl::StrCat("--tokenizer=", flag);
  absl::StatusOr<data::Gpt2Tokenizer> tokenizer =
      data::Gpt2Tokenizer::OpenForModel(name, weights.config.vocab_size);
  if (!tokenizer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        named, ": ", tokenizer.status().message(),
        flag == "auto" ? " (--tokenizer=none prints token ids; or name another)" : ""));
  }
  return *std::move(tokenizer);
}

// The ids of one text prompt (`what` names it in errors: "--prompt", ...).
absl::StatusOr<std::vector<int64_t>> EncodePrompt(
    const std::string& text, const std::string& what, const GptConfig& config,
    const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  absl::StatusOr<std::vector<int64_t>> ids = EncodeText(text, what, config.vocab_size, tokenizer);
  if (!ids.ok() && !tokenizer.has_value() && config.vocab_size != kByteVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.status().message(), " or give the prompt as --prompt_tokens=id,id,..."));
  }
  return ids;
}

// The prompts of --prompts_file, one per nonempty line.
absl::StatusOr<std::vector<std::vector<int64_t>>> FilePrompts(
    const std::string& path, const GptConfig& config,
    const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  if (!absl::GetFlag(FLAGS_prompt_tokens).empty() ||
      absl::GetFlag(FLAGS_prompt) != kDefaultPrompt) {
    return absl::InvalidArgumentError(
        "--prompts_file takes the place of --prompt and --prompt_tokens: give one of them");
  }
  absl::StatusOr<std::shared_ptr<const data::MappedFile>> file = data::MappedFile::Open(path);
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts_file=", path, ": cannot read it: ", file.status().message()));
  }
  std::vector<std::vector<int64_t>> prompts;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit((*file)->bytes(), '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    absl::StatusOr<std::vector<int64_t>> ids = EncodePrompt(
        std::string(line), absl::StrCat("--prompts_file line ", line_number), config, tokenizer);
    if (!ids.ok()) return ids.status();
    prompts.push_back(*std::move(ids));
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts_file=", path, " holds no prompt (one per line)"));
  }
  return prompts;
}

absl::StatusOr<std::vector<int64_t>> PromptIds(
    const GptConfig& config, const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  const std::string tokens = absl::GetFlag(FLAGS_prompt_tokens);
  std::vector<int64_t> ids;
  if (!tokens.empty()) {
    if (absl::GetFlag(FLAGS_prompt) != kDefaultPrompt) {
      return absl::InvalidArgumentError(
          "--prompt_tokens takes the place of --prompt (the prompt as ids, not text): give one "
          "of them");
    }
    absl::StatusOr<std::vector<std::string>> listed = train::SplitListFlag("prompt_tokens", tokens);
    if (!listed.ok()) return listed.status();
    if (listed->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt_tokens='", tokens, "' names no token id"));
    }
    for (const std::string& s : *listed) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(s, &id) || id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompt_tokens: '", s, "' is not a token id in [0, ", config.vocab_size,
                         ") of the model's vocabulary"));
      }
      ids.push_back(id);
    }
    return ids;
  }
  return EncodePrompt(absl::GetFlag(FLAGS_prompt), "--prompt", config, tokenizer);
}

// The prompts of the flags: --prompts_file's, or the one of --prompt /
// --prompt_tokens.
absl::StatusOr<std::vector<std::vector<int64_t>>> Prompts(
    const GptConfig& config, const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  const std::string file = absl::GetFlag(FLAGS_prompts_file);
  if (!file.empty()) return FilePrompts(file, config, tokenizer);
  absl::StatusOr<std::vector<int64_t>> ids = PromptIds(config, tokenizer);
  if (!ids.ok()) return ids.status();
  return std::vector<std::vector<int64_t>>{*std::move(ids)};
}

absl::StatusOr<bool> PrintsText(const GptConfig& config,
                                const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  const std::string print = absl::GetFlag(FLAGS_print);
  if (print == "auto") return config.vocab_size == kByteVocab || tokenizer.has_value();
  if (print == "tokens") return false;
  if (print != "text") {
    return absl::InvalidArgumentError(
        absl::StrCat("--print=", print, ": expected text, tokens or auto"));
  }
  if (!CanDecodeText(config.vocab_size, tokenizer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--print=text needs a byte-level model (vocabulary <= ", kByteVocab,
                     ") or a tokenizer; "
                     "this one has ",
                     config.vocab_size, " ids: use --print=tokens or --tokenizer"));
  }
  return true;
}

// Text (DecodeText), or the ids.
void PrintTokens(absl::Span<const int64_t> ids, bool text,
                 const std::optional<data::Gpt2Tokenizer>& tokenizer) {
  if (text) {
    const std::string bytes = DecodeText(ids, tokenizer);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  } else {
    for (int64_t id : ids) std::printf("%lld ", static_cast<long long>(id));
  }
  std::fflush(stdout);
}

absl::Status Sample() {
  // ---- Checkpoint and model ----
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (checkpoint.empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint is required: a step folder, the --checkpoint_dir of a training run, or a "
        "Hugging Face GPT-2 folder");
  }
  // Read by slices into the model's own parameters: no second copy.
  absl::StatusOr<PretrainedSources> pretrained = OpenPretrained(checkpoint);
  if (!pretrained.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint: ", pretrained.status().message()));
  }
  const GptConfig& config = pretrained->config;
  absl::StatusOr<train::Compute> compute =
      train::ResolveCompute(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_precision));
  if (!compute.ok()) return compute.status();
  const tensor::Device& device = compute->device;

  SamplingOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.top_p = absl::GetFlag(FLAGS_top_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.eos_id = absl::GetFlag(FLAGS_eos_id);
  options.kv_cache = absl::GetFlag(FLAGS_kv_cache);
  train::DecodingFromCommandLine(&options);
  absl::Status valid = options.Validate(config.vocab_size);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("--", valid.message()));
  valid = train::CheckDecodingFlagsApply(options);
  if (!valid.ok()) return valid;
  const int64_t num_samples = absl::GetFlag(FLAGS_num_samples);
  if (num_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_samples must be >= 1, got ", num_samples));
  }
  if (options.beams()) {  // a prompt's samples: its best hypotheses
    if (num_samples > options.num_beams) {
      return absl::InvalidArgumentError(
          absl::StrCat("--num_samples=", num_samples, " with beam search must be <= --num_beams=",
                       options.num_beams, " (a prompt's samples are its best hypotheses)"));
    }
    options.num_return_sequences = num_samples;
  }
  absl::StatusOr<std::optional<data::Gpt2Tokenizer>> tokenizer = LoadTokenizer(*pretrained);
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<std::vector<std::vector<int64_t>>> given = Prompts(config, *tokenizer);
  if (!given.ok()) return given.status();
  absl::StatusOr<bool> text = PrintsText(config, *tokenizer);
  if (!text.ok()) return text.status();
  size_t shortest = (*given)[0].size(), longest = shortest;  // prompt lengths, in tokens
  for (const std::vector<int64_t>& p : *given) {
    shortest = std::min(shortest, p.size());
    longest = std::max(longest, p.size());
  }
  // Every row decodes at once (each prompt's samples, or its beams), each
  // holding its prompt and new tokens: past 2^31 token positions the count
  // is refused here rather than failing as an allocation.
  {
    const int64_t rows = options.beams() ? options.num_beams : num_samples;
    const double length = static_cast<double>(longest) +
                          static_cast<double>(options.max_new_tokens);  // no int overflow
    const double positions = static_cast<double>(given->size()) * static_cast<double>(rows) * length;
    if (positions >= 2147483648.0) {
      const std::string rows_flag =
          absl::StrCat(options.beams() ? "--num_beams=" : "--num_samples=", rows);
      const std::string length_flag = absl::StrCat("--max_new_tokens=", options.max_new_tokens);
      return absl::InvalidArgumentError(absl::StrCat(
          length >= 2147483648.0 ? length_flag : absl::StrCat(rows_flag, " with ", length_flag),
          ": ", given->size(), " prompt(s) x ", rows, " row(s) x up to ",
          absl::StrFormat("%.0f", length), " tokens is 2^31 token positions or more, decoded at "
          "once; ask for fewer", options.beams() ? "" : " (another --seed gives more samples)"));
    }
  }

  GPT model(config);
  absl::Status loaded = nn::InitFromSources(model, pretrained->sources);
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(pretrained->source, " does not fit ",
                                                   config.ToString(), ": ", loaded.message()));
  }
  model.Materialize(0, device);  // reads the weights
  nn::ReleaseInitValues(model);
  pretrained->sources.clear();
  nn::MixedPrecision mixed(model, compute->policy);
  mixed.CastForCompute();
  std::fprintf(stderr, "%s from %s | %s | precision %s | %s\n", config.ToString().c_str(),
               pretrained->source.c_str(), device.ToString().c_str(),
               compute->policy.ToString().c_str(), options.Describe().c_str());
  const std::string lengths =
      given->size() == 1
          ? absl::StrCat("prompt: ", longest, " token(s)")
          : absl::StrCat(given->size(), " prompts: ", shortest, " to ", longest, " tokens");
  if (tokenizer->has_value()) {
    std::fprintf(stderr, "tokenizer: GPT-2 BPE from %s (%lld ids) | %s\n",
                 (*tokenizer)->source().c_str(), static_cast<long long>((*tokenizer)->vocab_size()),
                 lengths.c_str());
  } else if (given->size() > 1) {
    std::fprintf(stderr, "%s\n", lengths.c_str());
  }

  // ---- Generation: one sample streams as it is drawn, several (or beams) print at the end ----
  // Each given prompt num_samples times, in order (beam search: once; its
  // num_samples best hypotheses come back in the same order).
  std::vector<std::vector<int64_t>> prompts;
  for (const std::vector<int64_t>& p : *given) {
    prompts.insert(prompts.end(), options.beams() ? 1 : num_samples, p);
  }
  const bool stream = prompts.size() == 1 && !options.beams();
  if (stream) PrintTokens(prompts[0], *text, *tokenizer);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::vector<int64_t>>> rows =
      Generate(model, prompts, options, device, [&](int64_t, absl::Span<const int64_t> tokens) {
        if (stream) PrintTokens(tokens, *text, *tokenizer);
      });
  if (!rows.ok()) return rows.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t r = 0; r < rows->size(); ++r) {
    if (!stream) PrintTokens((*rows)[r], *text, *tokenizer);
    std::printf(r + 1 < rows->size() ? "\n---------------\n" : "\n");
  }
  int64_t generated = 0;  // fewer than rows x max_new_tokens where rows stopped at eos_id
  const size_t per_prompt = rows->size() / prompts.size();
  for (size_t r = 0; r < rows->size(); ++r) {
    generated += (*rows)[r].size() - prompts[r / per_prompt].size();
  }
  std::fprintf(stderr, "generated %lld tokens, %lld rows, in %.0f ms (%.1f tokens/s)\n",
               static_cast<long long>(generated), static_cast<long long>(rows->size()),
               seconds * 1e3, seconds > 0 ? generated / seconds : 0.0);
  return absl::OkStatus();
}

}  // namespace
}  // namespace mingpt

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv,
      "Samples from a trained minGPT: --checkpoint=<checkpoint_dir or step folder>.");
  data::SetProgramPath(argv[0]);
  return train::RunToolMain(
      "sample", mingpt::Sample,
      "every row decodes at once (--num_samples of each prompt, or its --num_beams beams; "
      "every prompt's rows), each with a key/value cache of the model's block_size positions: "
      "ask for fewer samples, beams or prompts at a time (--precision=bf16 halves it on a "
      "GPU)");
}
