// What the parity tests against PyTorch share (models/mingpt:parity_test,
// models/t5:parity_test): their fixture, a safetensors file written by a
// tools/*_reference.py script (weights under the model's parameter names, the
// batch and the reference results beside them), and the elementwise check of
// ours against the reference.
#ifndef MODELS_COMMON_PARITY_TESTING_H_
#define MODELS_COMMON_PARITY_TESTING_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace train {
namespace testing {

struct ParityFixture {
  std::map<std::string, std::string> metadata;
  tensor::NamedTensors weights;                     // the entries that are not reference ones
  std::map<std::string, tensor::Tensor> reference;  // the batch and the results
};

// Reads the runfile `runfile_path`; the entries is_reference selects go to
// `reference`, the others to `weights` (in the file's order). A file that
// cannot be read is a test failure and an empty fixture.
ParityFixture LoadParityFixture(const std::string& runfile_path,
                                const std::function<bool(const std::string&)>& is_reference);

// The metadata value under `key` (a test failure and "" when it is missing).
std::string Meta(const ParityFixture& f, const std::string& key);
// A comma-separated list of doubles (the f64 reference scalars).
std::vector<double> MetaDoubles(const ParityFixture& f, const std::string& key);

// Checks ours against the reference elementwise (|a - b| <= atol + rtol |b|)
// and prints the measured errors: the share of the tolerance used, the
// largest relative error among entries with |reference| >= 1e-3, the largest
// absolute error. A NaN fails.
void ExpectMatches(const std::string& what, const std::vector<double>& ours,
                   const std::vector<double>& reference, double rtol, double atol);

// Any floating tensor's values, as f32 then double.
std::vector<double> AsDoubles(const tensor::Tensor& t);

}  // namespace testing
}  // namespace train

#endif  // MODELS_COMMON_PARITY_TESTING_H_
