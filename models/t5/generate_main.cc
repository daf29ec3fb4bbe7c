// Generates with a trained T5 (t5::Generate; Hugging Face's generate):
// greedy by default, sampled with --temperature > 0 (and --top_k, --top_p,
// --seed), or beam search with --num_beams > 1 (and --length_penalty,
// --early_stopping; sampled beams with --temperature > 0); with the decoder's key/value cache
// unless --nokv_cache:
//   ./bazelw run //models/t5:generate -- --init_from=/path/t5-small --input=/tmp/ids.txt --eos_id=1
// --init_from is a checkpoint of //models/t5:train (either kind) or a
// Hugging Face T5 folder, as train's --init_from. --input holds one example
// per line, its token ids separated by spaces (tools/spm_tokenize.py
// --output_lines writes them from text with T5's SentencePiece model, and
// --decode_lines turns the output back into text). The examples run in one
// batch (shorter ones padded with --pad_id and masked); each line of stdout
// is one example's new tokens (--num_return_sequences lines each with beams,
// best first). What was loaded and the speed go to stderr.
// Exit 2 on bad flags or input (named).
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
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
#include "models/common/train_setup.h"
#include "models/t5/generate.h"
#include "models/t5/model.h"
#include "models/t5/pretrained.h"
#include "nn/mixed_precision.h"
#include "nn/state_dict.h"

ABSL_FLAG(std::string, init_from, "",
          "a checkpoint of //models/t5:train (a step folder or a --checkpoint_dir) or a Hugging "
          "Face T5 folder");
ABSL_FLAG(std::string, input, "",
          "a file of examples, one per line: token ids separated by spaces or tabs; - reads "
          "stdin");
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

// --input's examples; InvalidArgument naming the file, line and token for
// anything but ids below vocab_size, or no example.
absl::StatusOr<std::vector<std::vector<int64_t>>> ReadExamples(const std::string& path,
                                                               int64_t vocab_size) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input=", path, ": cannot be read: ", std::strerror(errno)));
    }
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<std::vector<int64_t>> examples;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    std::vector<int64_t> ids;
    // Ids apart by spaces or tabs (a CRLF line's '\r' too).
    for (absl::string_view token :
         absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipWhitespace())) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(token, &id) || id < 0 || id >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("--input=", path, ": line ", line_no, ": '",
                                                       token, "' is not an id below the model's ",
                                                       vocab_size));
      }
      ids.push_back(id);
    }
    if (ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--input=", path, ": line ", line_no,
          " has no ids (each line is one example, its output on the same line)"));
    }
    examples.push_back(std::move(ids));
  }
  if (examples.empty())
    return absl::InvalidArgumentError(absl::StrCat("--input=", path, ": empty"));
  return examples;
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
  if (absl::GetFlag(FLAGS_input).empty()) return absl::InvalidArgumentError("--input is required");
  absl::StatusOr<PretrainedSources> weights = OpenPretrained(init_from);
  if (!weights.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--init_from=", init_from, ": ", weights.status().message()));
  }
  const int64_t V = weights->config.vocab_size;
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
  absl::StatusOr<std::vector<std::vector<int64_t>>> examples =
      ReadExamples(absl::GetFlag(FLAGS_input), V);
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
    std::printf("%s\n", absl::StrJoin(row, " ").c_str());
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
      "Generation with a trained T5, greedy or sampled (token ids in and out).");
  try {
    absl::Status s = t5::Run();
    if (!s.ok()) {
      std::fprintf(stderr, "generate: error: %s\n", std::string(s.message()).c_str());
      return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
