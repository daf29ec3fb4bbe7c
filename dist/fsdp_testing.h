// Test fixtures shared by the FSDP tests: a tiny minGPT, random token batches,
// one process training the global batch (the reference), the same training
// sharded over a threads-engine world, and the tolerances of the comparisons.
#ifndef DIST_FSDP_TESTING_H_
#define DIST_FSDP_TESTING_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/fsdp.h"
#include "dist/process_group.h"
#include "models/mingpt/config.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/sgd.h"
#include "precision/policy.h"
#include "tensor/tensor.h"

namespace dist {
namespace testing {

constexpr uint64_t kSeed = 1234;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4
constexpr int kSteps = 5;
constexpr double kClip = 0.5;  // below the gradient norms seen: clipping is active

// 2 layers, 2 heads, n_embd 8, vocab 11, block 6, no dropout.
mingpt::GptConfig Tiny();
// 4 layers, 2 heads, n_embd 32, vocab 64, block 16, no dropout (memory tests).
mingpt::GptConfig Small();
// `strategy` with one unit per minGPT Block (and the root's), seeded kSeed;
// the other options default.
FsdpOptions PerBlock(ShardingStrategy strategy = ShardingStrategy::kFullShard);
// (B, T) int64 ids in [0, V).
tensor::Tensor RandomIds(int64_t B, int64_t T, int64_t V, uint32_t seed);
// lr 0.1, momentum 0.9, weight decay 0.1.
optim::SgdOptions Sgd();

struct RunResult {
  std::vector<double> losses;  // per step (mean over micro-batches and ranks)
  std::vector<double> norms;   // gradient norm before clipping, per step
  std::vector<std::pair<std::string, tensor::Tensor>> params;  // final, fp32
};

// kSteps SGD steps of one process on the global batch (B, T), clipped to
// kClip. `micro_batches` m > 1: each step accumulates the gradients of m
// micro-batches, micro-batch j holding rows [r B/W + j b, r B/W + (j+1) b)
// of every rank r of a world of `world` ranks (b = B / (W m)): the rows the
// sharded run's ranks see in their j-th micro-batch. With a mixed policy:
// nn::MixedPrecision (compute copies of fp32 masters). On `device` (the
// batches are moved there; the final parameters come back to the host).
RunResult SingleProcess(const mingpt::GptConfig& c, const tensor::Tensor& idx,
                        const tensor::Tensor& tgt,
                        const precision::MixedPrecisionPolicy& mp =
                            precision::MixedPrecisionPolicy::Fp32(),
                        int micro_batches = 1, int world = 1,
                        tensor::Device device = tensor::Device::Cpu());

// Mean of a double over the ranks (each sent whole, summed in double).
double RankMean(ProcessGroup& pg, double x);

// One rank's part of Sharded over any process group (rank pg.rank() of
// pg.size(), rows [rank B / size, (rank + 1) B / size) of the batch). Rank 0
// returns the losses, norms and full state dict (on the host); the other
// ranks the losses and norms.
RunResult TrainRank(const mingpt::GptConfig& c, const tensor::Tensor& idx,
                    const tensor::Tensor& tgt, ProcessGroup& pg, FsdpOptions options,
                    int micro_batches = 1, bool checkpoint_blocks = false);

// The same training with FullyShard(options) (options.seed is set to kSeed)
// over `world` threads-engine ranks, each on its B / world rows; with
// micro_batches > 1 the first m - 1 backwards of a step run under no_sync.
// `checkpoint_blocks`: activation checkpointing of every Block. Each rank's
// batches go to options.device.
RunResult Sharded(const mingpt::GptConfig& c, const tensor::Tensor& idx,
                  const tensor::Tensor& tgt, int world, FsdpOptions options,
                  int micro_batches = 1, bool checkpoint_blocks = false);
// Shorthand: strategy, policy and mixed precision, the rest default.
RunResult Sharded(const mingpt::GptConfig& c, const tensor::Tensor& idx,
                  const tensor::Tensor& tgt, int world, ShardingStrategy strategy,
                  const WrapPolicy& policy,
                  const precision::MixedPrecisionPolicy& mp =
                      precision::MixedPrecisionPolicy::Fp32());

// Two d x d Linears, the second of which the forward may skip
// (use_second = false): the unit or bucket a backward does not reach, whose
// gradient must still count as zeros after ZeroGrad(set_to_none=true). With
// stop_in_backward the backward throws OpError after the second Linear's (as
// an error in the middle of an API user's backward would): its bucket or
// unit reduction is then in flight and the root's PostBackward never runs.
class MaybeSkips : public nn::Module {
 public:
  explicit MaybeSkips(int64_t d);
  bool use_second = true;
  bool stop_in_backward = false;

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override;
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override;

 private:
  nn::Linear* first_;
  nn::Linear* second_;
};

// fp32: |got - want| <= tol + tol |want| for every loss, norm and parameter.
void ExpectSameTraining(const RunResult& got, const RunResult& want, double tol = 1e-5);
// Bitwise equal losses, norms and parameters.
void ExpectBitwiseEqual(const RunResult& got, const RunResult& want);
// bf16 against one-process bf16: losses 2e-3 relative, norms 2e-2 relative,
// parameters 2e-3 absolute + 2e-2 relative (see fsdp_test.cc for the figures).
void ExpectCloseTraining(const RunResult& got, const RunResult& want);

}  // namespace testing
}  // namespace dist

#endif  // DIST_FSDP_TESTING_H_
