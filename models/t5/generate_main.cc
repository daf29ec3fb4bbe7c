// Generates with a trained T5 (t5::Generate; Hugging Face's generate):
// greedy by default, sampled with --temperature > 0 (and --top_k, --top_p,
// --seed), or beam search with --num_beams > 1 (and --length_penalty,
// --early_stopping; sampled beams with --temperature > 0); with the decoder's key/value cache
// unless --nokv_cache:
//   ./bazelw run //models/t5:generate -- --init_from=/path/t5-small
//       --prompt="translate English to German: The house is wonderful."
// --init_from is a checkpoint of //models/t5:train (either kind) or a
// Hugging Face T5 folder, as train's --init_from. The examples are text:
// --prompt, or --prompts_file's lines, each encoded with T5's SentencePiece
// tokenizer (t5::SpieceTokenizer; "<extra_id_k>" is sentinel k) and ended
// with its </s>, as Hugging Face's T5Tokenizer does; or ids: --input's
// lines, token ids separated by spaces (tools/spm_tokenize.py --output_lines
// writes them). --tokenizer=auto is the SentencePiece model the checkpoint
// records (//models/t5:train's .bin data's) or the folder's spiece.model.
// The examples run in one batch (shorter ones padded with --pad_id and
// masked); each line of stdout is one example's new tokens, as text for text
// examples, else as ids (--print; --num_return_sequences lines each with
// beams, best first; ids text lacks, the rows a vocabulary is padded with,
// as <|id N|>). Lines without text or ids are refused (spm_tokenize.py
// --output_lines skips them), so that each output line answers its input
// line; so is text that is not UTF-8. What was loaded, the first text
// example as ids, and the speed go to stderr.
// Exit 2 on bad flags or input (named).
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "models/common/command_line.h"
#include "models/common/decoding_flags.h"
#include "models/common/tool_main.h"
#include "models/common/train_setup.h"
#include "models/t5/generate.h"
#include "models/t5/model.h"
#include "models/t5/pretrained.h"
#include "models/t5/spiece_files.h"
#include "models/t5/spiece_tokenizer.h"
#include "nn/mixed_precision.h"
#include "nn/state_dict.h"

ABSL_FLAG(std::string, init_from, "",
          "a checkpoint of //models/t5:train (a step folder or a --checkpoint_dir) or a Hugging "
          "Face T5 folder");
ABSL_FLAG(std::string, prompt, "", "one example, as text (T5's input, e.g. \"summarize: ...\")");
ABSL_FLAG(std::string, prompts_file, "",
          "a file of examples as text, one per line; - reads stdin");
ABSL_FLAG(std::string, input, "",
          "a file of examples, one per line: token ids separated by spaces or tabs; - reads "
          "stdin");
ABSL_FLAG(std::string, tokenizer, "auto",
          "for text: auto (the SentencePiece model the checkpoint records, or the Hugging Face "
          "folder's spiece.model), none, or a spiece.model or a folder holding one");
ABSL_FLAG(std::string, print, "auto",
          "text, ids, or auto (text for --prompt and --prompts_file, ids for --input)");
ABSL_FLAG(int64_t, max_new_tokens, 32, "tokens decoded per example at most");
ABSL_FLAG(std::string, eos_id, "auto",
          "an example stops after this id (T5's </s>: 1); -1: none; auto: the weights' "
          "(config.json's eos_token_id, or the one a checkpoint's training batches ended with)");
ABSL_FLAG(std::string, decoder_start_id, "auto",
          "the decoder's first input (T5's: the pad id 0); auto: the weights' "
          "(decoder_start_token_id, or a checkpoint's)");
ABSL_FLAG(std::string, pad_id, "auto",
          "pads the shorter examples of the batch (masked out); auto: the weights' (pad_token_id, "
          "or a checkpoint's)");
ABSL_FLAG(double, temperature, 0.0, "divides the logits before a draw; 0: greedy");
ABSL_FLAG(int64_t, top_k, 0, "draw among the k most likely tokens; 0: all");
ABSL_FLAG(double, top_p, 1.0, "draw among the most likely tokens up to this probability; 1: all");
ABSL_FLAG(uint64_t, seed, 1, "seed of the draws");
ABSL_FLAG(bool, kv_cache, true,
          "keep the decoder's keys and values between steps (false: each step runs the "
          "decoder over the whole sequence)");
ABSL_FLAG(int64_t, num_return_sequences, 1,
          "beam search: this many of each example's best hypotheses, best first, a line each "
          "(at most --num_beams)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, precision, "fp32", "fp32, bf16 or fp16 compute");

namespace t5 {
namespace {

using tensor::Tensor;

// One example's ids from one line, or what is wrong with the line.
using LineParser = std::function<absl::StatusOr<std::vector<int64_t>>(absl::string_view)>;

// An example of each line of `path` ("-": stdin) through `parse`;
// InvalidArgument naming --`flag`, the file and the line for a line `parse`
// refuses, or for no line.
absl::StatusOr<std::vector<std::vector<int64_t>>> ReadExamples(const std::string& flag,
                                                               const std::string& path,
                                                               const LineParser& parse) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", path, ": cannot be read: ", std::strerror(errno)));
    }
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<std::vector<int64_t>> examples;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    absl::StatusOr<std::vector<int64_t>> ids = parse(absl::StripSuffix(line, "\r"));
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", path, ": line ", line_no, ": ", ids.status().message(),
                       " (each line is one example, its output on the same line)"));
    }
    examples.push_back(*std::move(ids));
  }
  if (examples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": empty"));
  }
  return examples;
}

// A line of ids below `vocab_size`, apart by spaces or tabs.
absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view line, int64_t vocab_size) {
  std::vector<int64_t> ids;
  for (absl::string_view token :
       absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipWhitespace())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(token, &id) || id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", token, "' is not an id below the model's ", vocab_size));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("it has no ids");
  return ids;
}

// A line of text through `tokenizer`, then its </s> (if it has one).
absl::StatusOr<std::vector<int64_t>> ParseText(absl::string_view text,
                                               const SpieceTokenizer& tokenizer) {
  absl::StatusOr<std::vector<int64_t>> ids = tokenizer.Encode(text);
  if (!ids.ok()) return ids.status();
  if (ids->empty()) return absl::InvalidArgumentError("it has no text");
  if (tokenizer.eos_id() >= 0) ids->push_back(tokenizer.eos_id());
  return ids;
}

// The tokenizer --tokenizer names for `weights` (auto: theirs), which `need`
// (a flag) needs; InvalidArgument naming the flag (for auto: the record it
// read) when it cannot be read or does not fit the weights, or when there is
// none to read.
absl::StatusOr<SpieceTokenizer> LoadTokenizer(const PretrainedSources& weights, const char* need) {
  const std::string flag = absl::GetFlag(FLAGS_tokenizer);
  const std::string spec = flag == "auto" ? weights.tokenizer : flag == "none" ? "" : flag;
  if (spec.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        need, " needs a tokenizer, but ",
        flag == "none" ? "--tokenizer=none"
                       : absl::StrCat(weights.source, " has none (--tokenizer=auto)"),
        ": give --tokenizer=<spiece.model or a folder holding one>"));
  }
  const std::string what =
      flag == "auto" ? absl::StrCat("the tokenizer of ", weights.source, " (", spec,
                                    "; --tokenizer=FILE|DIR names where it is now)")
                     : absl::StrCat("--tokenizer=", flag);
  absl::StatusOr<TokenizerOfWeights> read = ReadTokenizerOfWeights(
      spec, what, weights.loader_state, weights.source, weights.config.vocab_size);
  if (!read.ok()) return read.status();
  absl::StatusOr<SpieceTokenizer> tokenizer = SpieceTokenizer::Load(read->model, read->sentinels);
  if (!tokenizer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

// An id flag's value: "auto" takes `recorded` (the weights'), else an
// integer; InvalidArgument naming the flag.
absl::StatusOr<int64_t> IdFlag(const char* name, const std::string& value, int64_t recorded) {
  if (value == "auto") return recorded;
  int64_t id = 0;
  if (!absl::SimpleAtoi(value, &id)) {
    const bool eos = absl::string_view(name) == "eos_id";
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "='", value, "' is not an id", eos ? ", -1" : "", " or auto"));
  }
  return id;
}

absl::Status Run() {
  const std::string init_from = absl::GetFlag(FLAGS_init_from);
  if (init_from.empty()) return absl::InvalidArgumentError("--init_from is required");
  // The examples: text (--prompt, --prompts_file) or ids (--input), one of them.
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string prompts_file = absl::GetFlag(FLAGS_prompts_file);
  const std::string input = absl::GetFlag(FLAGS_input);
  const int given = !prompt.empty() + !prompts_file.empty() + !input.empty();
  if (given != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(given == 0 ? "no examples" : "examples given twice",
                     ": give one of --prompt, --prompts_file (text) and --input (ids)"));
  }
  const std::string print = absl::GetFlag(FLAGS_print);
  if (print != "auto" && print != "text" && print != "ids") {
    return absl::InvalidArgumentError(
        absl::StrCat("--print=", print, " is not text, ids or auto"));
  }
  const bool text_out = print == "text" || (print == "auto" && input.empty());
  absl::StatusOr<PretrainedSources> weights = OpenPretrained(init_from);
  if (!weights.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--init_from=", init_from, ": ", weights.status().message()));
  }
  const int64_t V = weights->config.vocab_size;
  // The tokenizer, read only when text goes in or out.
  std::optional<SpieceTokenizer> tokenizer;
  if (!input.empty() && !text_out && absl::GetFlag(FLAGS_tokenizer) != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer=", absl::GetFlag(FLAGS_tokenizer),
        ": nothing is tokenized here (--input gives ids and --print=ids prints ids)"));
  }
  if (input.empty() || text_out) {
    absl::StatusOr<SpieceTokenizer> loaded = LoadTokenizer(
        *weights, !prompt.empty() ? "--prompt" : !prompts_file.empty() ? "--prompts_file"
                                                                         : "--print=text");
    if (!loaded.ok()) return loaded.status();
    tokenizer.emplace(*std::move(loaded));
  }
  GenerateOptions options;
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  absl::StatusOr<int64_t> eos = IdFlag("eos_id", absl::GetFlag(FLAGS_eos_id), weights->ids.eos_id);
  if (!eos.ok()) return eos.status();
  options.eos_id = *eos;
  absl::StatusOr<int64_t> decoder_start = IdFlag(
      "decoder_start_id", absl::GetFlag(FLAGS_decoder_start_id), weights->ids.decoder_start_id);
  if (!decoder_start.ok()) return decoder_start.status();
  options.decoder_start_id = *decoder_start;
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.top_p = absl::GetFlag(FLAGS_top_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.kv_cache = absl::GetFlag(FLAGS_kv_cache);
  train::DecodingFromCommandLine(&options);
  options.num_return_sequences = absl::GetFlag(FLAGS_num_return_sequences);
  absl::Status valid = options.Validate(V);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat("--", valid.message()));
  if (options.eos_id < 0 && options.min_new_tokens > 0 &&
      absl::GetFlag(FLAGS_eos_id) == "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min_new_tokens=", options.min_new_tokens, ": it holds off the eos, but --eos_id=auto "
        "is -1 here (the weights record no eos id): give --eos_id"));
  }
  valid = train::CheckDecodingFlagsApply(options);
  if (!valid.ok()) return valid;
  absl::StatusOr<int64_t> pad_flag =
      IdFlag("pad_id", absl::GetFlag(FLAGS_pad_id), weights->ids.pad_id);
  if (!pad_flag.ok()) return pad_flag.status();
  const int64_t pad = *pad_flag;
  if (pad < 0 || pad >= V) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pad_id=", pad, " is not an id of the vocabulary of ", V));
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> examples;
  if (!prompt.empty()) {
    absl::StatusOr<std::vector<int64_t>> ids = ParseText(prompt, *tokenizer);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt: ", ids.status().message()));
    }
    examples = std::vector<std::vector<int64_t>>{*std::move(ids)};
  } else if (!prompts_file.empty()) {
    examples = ReadExamples("prompts_file", prompts_file, [&](absl::string_view line) {
      return ParseText(line, *tokenizer);
    });
  } else {
    examples = ReadExamples("input", input, [V](absl::string_view line) {
      return ParseIds(line, V);
    });
  }
  if (!examples.ok()) return examples.status();
  absl::StatusOr<train::Compute> compute =
      train::ResolveCompute(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_precision));
  if (!compute.ok()) return compute.status();

  T5Model model(weights->config);
  absl::Status loaded = nn::InitFromSources(model, weights->sources);
  if (!loaded.ok()) return loaded;
  model.Materialize(/*seed=*/0, compute->device);  // reads the weights
  nn::ReleaseInitValues(model);
  nn::MixedPrecision mixed(model, compute->policy);
  mixed.CastForCompute();
  std::fprintf(stderr, "model %s from %s | %s | precision %s | %s | eos %lld, pad %lld, "
               "decoder start %lld\n",
               weights->config.ToString().c_str(), weights->source.c_str(),
               compute->device.ToString().c_str(), compute->policy.ToString().c_str(),
               options.Describe().c_str(), static_cast<long long>(options.eos_id),
               static_cast<long long>(pad), static_cast<long long>(options.decoder_start_id));
  if (tokenizer) {
    std::fprintf(stderr, "tokenizer %s: %lld pieces + %lld sentinels, text %s\n",
                 tokenizer->path().c_str(), static_cast<long long>(tokenizer->pieces()),
                 static_cast<long long>(tokenizer->sentinels()),
                 input.empty() ? (text_out ? "in and out" : "in") : "out");
    // What the encoder reads of text, to see how it was tokenized.
    if (input.empty()) {
      std::fprintf(stderr, "example 1 as ids: %s\n",
                   absl::StrJoin(examples->front(), " ").c_str());
    }
  }

  // The batch: (B, S) ids, the shorter examples padded at the end and masked.
  const int64_t B = static_cast<int64_t>(examples->size());
  int64_t S = 0;
  for (const auto& e : *examples) S = std::max<int64_t>(S, static_cast<int64_t>(e.size()));
  std::vector<int64_t> ids(B * S, pad), mask(B * S, 0);
  for (int64_t b = 0; b < B; ++b) {
    for (size_t i = 0; i < (*examples)[b].size(); ++i) {
      ids[b * S + i] = (*examples)[b][i];
      mask[b * S + i] = 1;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::vector<int64_t>>> out =
      Generate(model, Tensor::FromData<int64_t>(ids, {B, S}).To(compute->device),
               Tensor::FromData<int64_t>(mask, {B, S}).To(compute->device), options);
  if (!out.ok()) return out.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t tokens = 0;
  for (const auto& row : *out) {
    const std::string line = text_out ? tokenizer->Decode(row) : absl::StrJoin(row, " ");
    std::printf("%s\n", line.c_str());
    tokens += static_cast<int64_t>(row.size());
  }
  std::fprintf(stderr, "%lld examples, %lld tokens in %.2f s\n", static_cast<long long>(B),
               static_cast<long long>(tokens), seconds);
  return absl::OkStatus();
}

}  // namespace
}  // namespace t5

int main(int argc, char** argv) {
  train::ParseCommandLineOrExit(argc, argv,
      "Generation with a trained T5, greedy, sampled or beam search (text or token ids in and "
      "out).");
  return train::RunToolMain(
      "generate", t5::Run,
      "every example decodes at once (each of --num_beams beams a row), its key/value cache "
      "(--kv_cache) holding --max_new_tokens positions: ask for fewer tokens, beams or examples "
      "at a time (--precision=bf16 halves it on a GPU)");
}
