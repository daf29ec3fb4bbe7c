// All-gathers of statuses for the sharded checkpoint protocol (see
// sharded_checkpoint_exchange.h).
#include "dist/sharded_checkpoint_exchange.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "tensor/tensor.h"

namespace dist::sharded {
namespace {

using tensor::Tensor;

// Every rank's (status, payload) as strings: "+<payload>" or "-<code>:<message>".
absl::StatusOr<std::vector<std::string>> AllGatherStrings(ProcessGroup& pg,
                                                          const std::string& mine) {
  const int n = pg.size();
  const int64_t my_len = static_cast<int64_t>(mine.size());
  Tensor len = Tensor::FromData<int64_t>(absl::MakeConstSpan(&my_len, 1), {1});
  Tensor lens = Tensor::Empty({n}, tensor::Dtype::kI64);
  absl::Status s = pg.AllGatherSync(len, lens);
  if (!s.ok()) return s;
  int64_t max_len = 1;
  for (int r = 0; r < n; ++r) max_len = std::max(max_len, lens.data<int64_t>()[r]);
  Tensor buf = Tensor::Zeros({max_len}, tensor::Dtype::kU8);
  std::memcpy(buf.raw_data(), mine.data(), mine.size());
  Tensor all = Tensor::Empty({n * max_len}, tensor::Dtype::kU8);
  s = pg.AllGatherSync(buf, all);
  if (!s.ok()) return s;
  std::vector<std::string> out(n);
  const char* p = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out[r].assign(p + r * max_len, lens.data<int64_t>()[r]);
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> Exchange(ProcessGroup& pg, const absl::Status& mine,
                                                  const std::string& payload,
                                                  const std::string& what) {
  const std::string enc =
      mine.ok() ? absl::StrCat("+", payload)
                : absl::StrCat("-", static_cast<int>(mine.code()), ":", mine.message());
  absl::StatusOr<std::vector<std::string>> all = AllGatherStrings(pg, enc);
  if (!all.ok()) {
    return absl::Status(
        all.status().code(),
        absl::StrCat(what, ": exchanging statuses failed: ", all.status().message(),
                     mine.ok() ? "" : absl::StrCat(" (this rank: ", mine.message(), ")")));
  }
  std::vector<std::pair<std::string, std::vector<int>>> errors;  // message -> ranks
  absl::StatusCode code = absl::StatusCode::kOk;
  std::vector<std::string> payloads(all->size());
  for (size_t r = 0; r < all->size(); ++r) {
    const std::string& e = (*all)[r];
    if (!e.empty() && e[0] == '+') {
      payloads[r] = e.substr(1);
      continue;
    }
    const size_t colon = e.find(':');
    int c = static_cast<int>(absl::StatusCode::kUnknown);
    if (colon == std::string::npos || !absl::SimpleAtoi(e.substr(1, colon - 1), &c)) {
      c = static_cast<int>(absl::StatusCode::kUnknown);
    }
    if (code == absl::StatusCode::kOk) code = static_cast<absl::StatusCode>(c);
    const std::string msg = colon == std::string::npos ? e : e.substr(colon + 1);
    auto it = std::find_if(errors.begin(), errors.end(), [&](auto& x) { return x.first == msg; });
    if (it == errors.end()) {
      errors.emplace_back(msg, std::vector<int>{static_cast<int>(r)});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  if (errors.empty()) return payloads;
  const int n = pg.size();
  std::vector<std::string> parts;
  for (auto& [msg, ranks] : errors) {
    std::string who;
    if (static_cast<int>(ranks.size()) == n && n > 1) {
      who = absl::StrCat("all ", n, " ranks");
    } else {
      who = absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "), " of ",
                         n);
    }
    parts.push_back(absl::StrCat(who, ": ", msg));
  }
  return absl::Status(code, absl::StrCat(what, ": ", absl::StrJoin(parts, "; ")));
}

absl::Status AgreeOnCheck(ProcessGroup& pg, const absl::Status& mine, const std::string& what) {
  absl::StatusOr<std::vector<std::string>> got = Exchange(pg, mine, "", what);
  return got.ok() ? absl::OkStatus() : got.status();
}

absl::Status SameCheckpointOnEveryRank(const std::vector<std::string>& ids,
                                       const std::string& what) {
  if (std::all_of(ids.begin(), ids.end(), [&](const std::string& id) { return id == ids[0]; })) {
    return absl::OkStatus();
  }
  std::vector<std::string> each;
  for (size_t r = 0; r < ids.size(); ++r) each.push_back(absl::StrCat("rank ", r, " ", ids[r]));
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": the ranks read different checkpoints (checkpoint ids: ", absl::StrJoin(each, ", "),
      "): every rank must load the same folder (another path, or an index.json replaced while "
      "they read it); nothing was loaded"));
}

}  // namespace dist::sharded
