// What the parity tests against PyTorch share (parity_testing.h).
#include "models/common/parity_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "models/data/runfiles.h"

namespace train {
namespace testing {

ParityFixture LoadParityFixture(const std::string& runfile_path,
                                const std::function<bool(const std::string&)>& is_reference) {
  absl::StatusOr<std::string> path = data::ResolveRunfile(runfile_path);
  EXPECT_TRUE(path.ok()) << path.status();
  if (!path.ok()) return {};
  absl::StatusOr<tensor::SafetensorsFile> file = tensor::ReadSafetensors(*path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  ParityFixture f;
  f.metadata = file->header.metadata;
  for (auto& [name, t] : file->tensors) {
    if (is_reference(name)) {
      f.reference[name] = t;
    } else {
      f.weights.emplace_back(name, t);
    }
  }
  return f;
}

std::string Meta(const ParityFixture& f, const std::string& key) {
  auto it = f.metadata.find(key);
  EXPECT_NE(it, f.metadata.end()) << "fixture metadata lacks '" << key << "'";
  return it == f.metadata.end() ? "" : it->second;
}

std::vector<double> MetaDoubles(const ParityFixture& f, const std::string& key) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(Meta(f, key), ',')) {
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(part, &v)) << key << ": '" << part << "'";
    out.push_back(v);
  }
  return out;
}

void ExpectMatches(const std::string& what, const std::vector<double>& ours,
                   const std::vector<double>& reference, double rtol, double atol) {
  ASSERT_EQ(ours.size(), reference.size()) << what;
  double used = 0, rel = 0, abs_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double err = std::fabs(ours[i] - reference[i]);
    const double u = err / (atol + rtol * std::fabs(reference[i]));
    if (!(u <= used)) {  // also catches NaN
      used = u;
      worst = i;
    }
    if (std::fabs(reference[i]) >= 1e-3) rel = std::max(rel, err / std::fabs(reference[i]));
    abs_err = std::max(abs_err, err);
  }
  std::printf("%-56s tolerance used %9.2e  max rel (|ref|>=1e-3) %9.2e  max abs %9.2e\n",
              what.c_str(), used, rel, abs_err);
  EXPECT_LE(used, 1.0) << what << ": element " << worst << " is " << ours[worst]
                       << ", the reference has " << reference[worst] << " (|diff| "
                       << std::fabs(ours[worst] - reference[worst]) << " > " << atol << " + "
                       << rtol << " * |ref|)";
}

std::vector<double> AsDoubles(const tensor::Tensor& t) {
  std::vector<float> v = t.To(tensor::Dtype::kF32).ToVector<float>();
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace testing
}  // namespace train
