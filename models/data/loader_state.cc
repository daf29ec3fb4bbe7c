// Validation of data-parallel layouts and (de)serialization of loader state.
#include "models/data/loader_state.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

absl::Status CheckRestore(const LoaderState& saved, absl::string_view config,
                          absl::string_view who) {
  if (saved.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] cannot restore a negative step ", saved.step));
  }
  if (saved.config != config) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", who, "] the saved state is for another data configuration: saved \"",
                     saved.config, "\", this loader \"", config, "\""));
  }
  return absl::OkStatus();
}

}  // namespace data
