// The generation binaries' decoding flags (decoding_flags.h).
#include "models/common/decoding_flags.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

ABSL_FLAG(double, repetition_penalty, 1.0,
          "divides the logit of each token already in the sequence where positive, multiplies "
          "it where negative (Hugging Face's repetition_penalty); > 1 discourages repeats; 1: off");
ABSL_FLAG(int64_t, no_repeat_ngram_size, 0,
          "never a token that repeats an n-gram of this size already in the sequence (Hugging "
          "Face's no_repeat_ngram_size); 0: off");
ABSL_FLAG(int64_t, min_new_tokens, 0,
          "the eos id is never drawn before a row has this many new tokens (Hugging Face's "
          "min_new_tokens); 0: off");
ABSL_FLAG(int64_t, num_beams, 1,
          "beam search with this many beams per example (sampled with --temperature > 0); 1: none");
ABSL_FLAG(double, length_penalty, 1.0,
          "beam search: a finished hypothesis scores its log-probability / length^this (its new "
          "tokens); > 1 favours longer ones");
ABSL_FLAG(bool, early_stopping, false,
          "beam search: an example is done once --num_beams hypotheses finished");

namespace train {

void DecodingFromCommandLine(Decoding* decoding) {
  decoding->repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  decoding->no_repeat_ngram_size = absl::GetFlag(FLAGS_no_repeat_ngram_size);
  decoding->min_new_tokens = absl::GetFlag(FLAGS_min_new_tokens);
  decoding->num_beams = absl::GetFlag(FLAGS_num_beams);
  decoding->length_penalty = absl::GetFlag(FLAGS_length_penalty);
  decoding->early_stopping = absl::GetFlag(FLAGS_early_stopping);
}

namespace {
// "--name=value" for each of `names` this binary defines and the command line
// set off its default, where `does_something` says the value does something
// (--top_k=0 keeps every token: nothing ignored).
std::vector<std::string> OffDefault(std::vector<const char*> names,
                                    const std::function<bool(const char*)>& does_something) {
  std::vector<std::string> off;
  for (const char* name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue() &&
        does_something(name)) {
      off.push_back(absl::StrCat("--", name, "=", flag->CurrentValue()));
    }
  }
  return off;
}
}  // namespace

absl::Status CheckDecodingFlagsApply(const Decoding& decoding) {
  if (decoding.temperature == 0) {
    const std::vector<std::string> off =
        OffDefault({"top_k", "top_p"}, [&](absl::string_view name) {
          return name == "top_k" ? decoding.top_k > 0 : decoding.top_p < 1;
        });
    if (!off.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(off, " "), ": ", off.size() == 1 ? "it narrows" : "they narrow",
          " the tokens a draw takes, but --temperature=0 draws none (",
          decoding.num_beams > 1 ? "beam search by score" : "greedy decoding",
          "): give --temperature > 0 to sample"));
    }
  }
  if (decoding.eos_id < 0 && decoding.min_new_tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min_new_tokens=", decoding.min_new_tokens, ": it holds off --eos_id, but --eos_id=-1 "
        "stops no row (each runs --max_new_tokens): give --eos_id, or drop --min_new_tokens"));
  }
  if (decoding.num_beams == 1) {
    const std::vector<std::string> off =
        OffDefault({"length_penalty", "early_stopping"}, [](const char*) { return true; });
    if (!off.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::StrJoin(off, " "), ": beam search's, but --num_beams=1 searches no beams: give "
          "--num_beams > 1"));
    }
  }
  return absl::OkStatus();
}

}  // namespace train
