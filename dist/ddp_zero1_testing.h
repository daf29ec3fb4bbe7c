// What the DDP / ZeRO-1 tests share (ddp_zero1_test.cc: against one process,
// buckets, no_sync; ddp_zero1_reuse_test.cc: parameters used more than once;
// ddp_zero1_mixed_precision_test.cc: bf16 and memory;
// ddp_zero1_abandoned_test.cc: backwards that did not finish): a random
// global batch of token ids, each rank's rows of it, the model's parameters
// and gradients flattened, ZeRO-1's reduced slices, and the two optimizers
// they step.
#ifndef DIST_DDP_ZERO1_TESTING_H_
#define DIST_DDP_ZERO1_TESTING_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dist/zero1.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace dist {
namespace ddp_zero1_testing {

// Every comparison with the single-process reference: absolute, on losses,
// parameters and gradients.
constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 7;
constexpr int64_t kGlobalRows = 12;  // divisible by 1, 2, 3, 4
constexpr int64_t kT = 6;
constexpr int kSteps = 5;

struct Batch {
  std::vector<int64_t> idx, targets;  // (kGlobalRows, kT), ids in [0, 10]
};
Batch RandomBatch(uint32_t seed);

// Rows [r B, (r+1) B) of the global batch, B = kGlobalRows / n (as LmLoader): (B, kT).
tensor::Tensor Rows(const std::vector<int64_t>& v, int r, int n);

// Every parameter's value (or gradient), in NamedParameters order, as one vector.
std::vector<float> FlatParams(nn::Module& m);
std::vector<float> FlatGrads(nn::Module& m);

// The largest |a[i] - b[i]| (a size mismatch fails the test).
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

// Ranks other than 0 start from other weights: the broadcast must fix that.
inline uint64_t RankSeed(int rank) { return rank == 0 ? kSeed : 1000 + rank; }

// Which wrapper a test runs.
enum class Mode { kDdp, kZero1 };

// SGD (lr 0.1, momentum 0.9, weight decay 0.01) or AdamW (lr 1e-2, weight decay 0.1).
enum class Opt { kSgd, kAdamW };
std::unique_ptr<optim::Optimizer> MakeOptimizer(Opt opt);

// This rank's reduced gradient slices, each element with its position in the
// model's gradients flattened in registration order without padding (-1 for
// padding). The segments follow registration order, so a segment's first
// element is preceded by the elements of the segments before it.
std::vector<std::pair<int64_t, float>> ReducedSlices(const Zero1& zero);
// Every slice element equals `want` at its position within `tol`; padding is zero.
void ExpectSlicesEqual(const std::vector<std::pair<int64_t, float>>& slices,
                       const std::vector<float>& want, double tol, int rank);

}  // namespace ddp_zero1_testing
}  // namespace dist

#endif  // DIST_DDP_ZERO1_TESTING_H_
