// Validation of data-parallel layouts and (de)serialization of loader state.
#include "models/data/loader_state.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace data {

absl::Status DataParallel::Validate(absl::string_view who) const {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] batch_size must be >= 1, got ", batch_size));
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] world_size must be >= 1, got ", world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] rank ", rank, " is not in [0, world_size = ", world_size, ")"));
  }
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] micro_batches must be >= 1, got ", micro_batches));
  }
  // Each factor is below 2^31, so the product is checked without overflow.
  if (batch_size >= (int64_t{1} << 31) || micro_batches >= (int64_t{1} << 31) ||
      batch_size * world_size >= (int64_t{1} << 31) ||
      batch_size * world_size * micro_batches >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("[", who, "] global batch ", micro_batches,
                                                   " x ", world_size, " x ", batch_size,
                                                   " is too large"));
  }
  return absl::OkStatus();
}

std::string LoaderState::ToString() const { return absl::StrCat("step=", step, ";", config); }

absl::StatusOr<LoaderState> LoaderState::FromString(absl::string_view s) {
  const size_t semi = s.find(';');
  if (!absl::StartsWith(s, "step=") || semi == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("[loader state] expected \"step=<n>;<config>\", got \"", s, "\""));
  }
  LoaderState state;
  if (!absl::SimpleAtoi(s.substr(5, semi - 5), &state.step) || state.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("[loader state] bad step \"", s.substr(5, semi - 5), "\" in \"", s, "\""));
  }
  state.config = std::string(s.substr(semi + 1));
  return state;
}

namespace {

// N of ",global_batch=N" in a loader's configuration; -1 without one.
int64_t GlobalBatchOf(absl::string_view config) {
  constexpr absl::string_view kKey = "global_batch=";
  const size_t at = config.find(kKey);
  if (at == absl::string_view::npos) return -1;
  const absl::string_view rest = config.substr(at + kKey.size());
  int64_t n = -1;
  return absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")), &n) ? n : -1;
}

// "range=[a, b)" of a config string (a source sliced for a held-out tail:
// data::TokenSource fingerprints), or "" when it has none.
std::string RangeOf(absl::string_view config) {
  const size_t begin = config.find("range=[");
  if (begin == absl::string_view::npos) return "";
  const size_t end = config.find(')', begin);
  if (end == absl::string_view::npos) return "";
  return std::string(config.substr(begin, end + 1 - begin));
}

// The key=value fields of a config string, in order, each key qualified by
// the call it sits in ("span_corruption(token_file(seed=1),S=32)": the
// fields token_file.seed and span_corruption.S); a range's "[a, b)" counts
// as its value.
std::vector<std::pair<std::string, std::string>> Fields(absl::string_view config) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<std::string> calls;  // the enclosing calls' names, innermost last
  size_t word = 0;                 // where the current identifier starts
  for (size_t i = 0; i < config.size(); ++i) {
    const char c = config[i];
    if (c == '(') {
      calls.emplace_back(config.substr(word, i - word));
      word = i + 1;
    } else if (c == ')') {
      if (!calls.empty()) calls.pop_back();
      word = i + 1;
    } else if (c == ',') {
      word = i + 1;
    } else if (c == '=') {
      const std::string key(absl::StripAsciiWhitespace(config.substr(word, i - word)));
      size_t end = i + 1;
      if (end < config.size() && config[end] == '[') {
        end = config.find(')', end);
        end = end == absl::string_view::npos ? config.size() : end + 1;
      } else {
        while (end < config.size() && config[end] != ',' && config[end] != '(' &&
               config[end] != ')') {
          ++end;
        }
      }
      fields.emplace_back(calls.empty() ? key : absl::StrCat(calls.back(), ".", key),
                          std::string(config.substr(i + 1, end - i - 1)));
      i = end - 1;
      word = end;
    }
  }
  return fields;
}

// The fields of two configs that differ, each (key, saved value, now), with
// `aligned` when both have the same keys in the same order. Else only the
// positions where the keys agree are compared.
struct FieldDifferences {
  bool aligned = true;
  std::vector<std::array<std::string, 3>> differ;
};
FieldDifferences CompareFields(absl::string_view saved, absl::string_view now) {
  const auto a = Fields(saved), b = Fields(now);
  FieldDifferences d;
  d.aligned = a.size() == b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].first != b[i].first) {
      d.aligned = false;
    } else if (a[i].second != b[i].second) {
      d.differ.push_back({a[i].first, a[i].second, b[i].second});
    }
  }
  return d;
}

// "; it differs in S (32 saved, 64 now), ..." for configs with the same keys
// in the same order; "" otherwise.
std::string DifferingFields(const FieldDifferences& d) {
  if (!d.aligned || d.differ.empty()) return "";
  std::vector<std::string> differ;
  for (const auto& [key, saved, now] : d.differ) {
    differ.push_back(absl::StrCat(key, " (", saved, " saved, ", now, " now)"));
  }
  return absl::StrCat("; it differs in ", absl::StrJoin(differ, ", "));
}

// Whether the fields that differ describe the data itself (its size,
// vocabulary or content digest: another file), not how it is read.
bool DataItselfDiffers(const FieldDifferences& d) {
  for (const auto& [key, saved, now] : d.differ) {
    if (absl::EndsWith(key, ".tokens") || absl::EndsWith(key, ".bytes") ||
        absl::EndsWith(key, ".vocab") || absl::EndsWith(key, ".content")) {
      return true;
    }
  }
  return false;
}

// `config` without its sources' ",content=<digest>" fields.
std::string WithoutContent(absl::string_view config) {
  constexpr absl::string_view kKey = ",content=";
  std::string out;
  size_t from = 0;
  for (size_t at = config.find(kKey); at != absl::string_view::npos;
       at = config.find(kKey, from)) {
    absl::StrAppend(&out, config.substr(from, at - from));
    from = config.find_first_of(",)", at + kKey.size());
    if (from == absl::string_view::npos) from = config.size();
  }
  absl::StrAppend(&out, config.substr(from));
  return out;
}

}  // namespace

absl::Status CheckRestore(const LoaderState& saved, absl::string_view config_now,
                          absl::string_view who) {
  if (saved.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] cannot restore a negative step ", saved.step));
  }
  // A state saved before configurations held the data's content digest
  // (data::ContentDigest) is compared without it: its data cannot be told
  // from another of the same size.
  const std::string config = absl::StrContains(saved.config, "content=")
                                 ? std::string(config_now)
                                 : WithoutContent(config_now);
  if (saved.config != config) {
    // Another world size resumes the same stream when the global batch stays.
    const int64_t saved_batch = GlobalBatchOf(saved.config), batch = GlobalBatchOf(config);
    std::string hint =
        saved_batch > 0 && batch > 0 && saved_batch != batch
            ? absl::StrCat("; the global batch differs (saved ", saved_batch, " rows, now ", batch,
                           "): resume with ", saved_batch,
                           " = ranks x rows per rank x micro-batches (the train binaries' "
                           "--world_size x --batch_size x --grad_accum_steps)")
            : "";
    // A slice of the data (a held-out tail taken off) that differs.
    const std::string saved_range = RangeOf(saved.config), range = RangeOf(config);
    if (saved_range != range) {
      absl::StrAppend(&hint, "; the part of the data trained on differs (saved ",
                      saved_range.empty() ? "all of it" : saved_range, ", now ",
                      range.empty() ? "all of it" : range,
                      "): resume with the run's --val_fraction (the train binaries hold out the "
                      "data's tail with it)");
    }
    const FieldDifferences fields = CompareFields(saved.config, config);
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] the saved state is for another data configuration: saved \"",
                     saved.config, "\", this loader \"", config, "\"", DifferingFields(fields),
                     hint,
                     !hint.empty()               ? ""
                     : DataItselfDiffers(fields) ? "; the data differs: resume with the data "
                                                   "it was saved with"
                                                 : "; resume with the data flags it was saved "
                                                   "with"));
  }
  return absl::OkStatus();
}

}  // namespace data
