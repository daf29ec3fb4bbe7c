// Fixtures of the data-parallel step tests (data_parallel_test,
// data_parallel_nccl_test): a tiny minGPT, a global batch of kRows rows,
// one process training it (the reference), and one rank's kSteps steps of
// AdamW with clipping through DataParallelModel over any process group.
#ifndef MODELS_COMMON_DATA_PARALLEL_TESTING_H_
#define MODELS_COMMON_DATA_PARALLEL_TESTING_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dist/fsdp_testing.h"
#include "dist/process_group.h"
#include "models/common/data_parallel.h"
#include "models/mingpt/config.h"
#include "optim/optimizer.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace train {
namespace dp_testing {

constexpr int64_t kRows = 8;  // global batch
constexpr int64_t kT = 6;
constexpr uint64_t kSeed = 11;
// Three steps of AdamW with clipping at 0.05 (every step clips).
constexpr int kSteps = 3;
constexpr double kClip = 0.05;

// A getenv that reads `vars`.
GetEnvFn FakeEnv(std::map<std::string, std::string> vars);
// What //tools:launch sets for rank `rank` of `world` on one node (RUN_ID
// `run_id`, MASTER_ADDR 127.0.0.1, MASTER_PORT 29500, RESTART_COUNT 0).
std::map<std::string, std::string> LaunchVars(int rank, int world,
                                              const std::string& run_id = "123-456");

// Flags for `backend` and `strategy` at `world_size` (0: the launcher's), the
// rest default.
DataParallelFlags Flags(std::string backend, std::string strategy, int world_size = 0);

// 2 layers, 2 heads, n_embd 8, vocab 11, block 6, no dropout.
using dist::testing::Tiny;

// Rows [r B, (r+1) B) of `v` (kRows, kT), B = kRows / n.
tensor::Tensor Rows(const std::vector<int64_t>& v, int r, int n);

// lr 1e-2, weight decay 0.1.
std::unique_ptr<optim::Optimizer> AdamW();

// kRows * kT ids in [0, 10].
std::vector<int64_t> RandomTokens(uint32_t seed);

// Collectives issued through a CountingGroup or its subgroups.
struct Counts {
  std::atomic<int64_t> reductions{0};  // all-reduce, reduce-scatter
  std::atomic<int64_t> all_gathers{0};
};

// Forwards every call to the group it wraps and counts the gradient
// reductions and the all-gathers issued through it or its subgroups.
class CountingGroup final : public dist::ProcessGroup {
 public:
  CountingGroup(dist::ProcessGroup& inner, std::shared_ptr<Counts> counts)
      : ProcessGroup(inner.timeout()), inner_(inner), counts_(std::move(counts)) {}
  CountingGroup(std::unique_ptr<dist::ProcessGroup> owned, std::shared_ptr<Counts> counts)
      : CountingGroup(*owned, std::move(counts)) {
    owned_ = std::move(owned);
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::string_view backend() const override { return inner_.backend(); }

 protected:
  dist::WorkPtr Issue(std::shared_ptr<dist::CollectiveCall> call) override {
    const auto options = dist::CollectiveOptions::WithTimeout(call->timeout);
    switch (call->kind) {
      case dist::CollectiveKind::kAllReduce:
        ++counts_->reductions;
        return inner_.AllReduce(call->input, call->op, options);
      case dist::CollectiveKind::kReduceScatter:
        ++counts_->reductions;
        return inner_.ReduceScatter(call->input, call->output, call->op, options);
      case dist::CollectiveKind::kAllGather:
        ++counts_->all_gathers;
        return inner_.AllGather(call->input, call->output, options);
      case dist::CollectiveKind::kBroadcast:
        return inner_.Broadcast(call->input, call->root, options);
      case dist::CollectiveKind::kBarrier:
        break;
    }
    return inner_.Barrier(options);
  }
  absl::StatusOr<std::unique_ptr<dist::ProcessGroup>> DoSplit(int color, int key,
                                                              absl::Duration timeout) override {
    absl::StatusOr<std::unique_ptr<dist::ProcessGroup>> group =
        inner_.Split(color, key, dist::CollectiveOptions::WithTimeout(timeout));
    if (!group.ok() || *group == nullptr) return group;
    return std::unique_ptr<dist::ProcessGroup>(
        std::make_unique<CountingGroup>(*std::move(group), counts_));
  }

 private:
  std::unique_ptr<dist::ProcessGroup> owned_;  // a subgroup this one wraps
  dist::ProcessGroup& inner_;
  std::shared_ptr<Counts> counts_;
};

struct Trace {
  std::vector<double> losses, norms;  // per step
  // The gradient reductions (all-reduce, reduce-scatter; subgroups' too) this
  // rank issued during each micro-batch of the first step.
  std::vector<int64_t> reductions_per_micro_batch;
  // The all-gathers it issued during each micro-batch's forward and backward
  // of the first step.
  std::vector<int64_t> all_gathers_per_micro_batch;
};

// kSteps steps of one process on the global batch, on `device`, with the
// parameters `freeze` selects frozen (nn::FreezeParameters; they are checked
// to end as they began).
Trace SingleProcess(tensor::Device device, const std::vector<std::string>& freeze = {});

// Rank pg.rank()'s kSteps steps of `config`'s strategy over `pg` (its rows of
// the global batch, on `device`): the losses averaged over the ranks and the
// global gradient norms. `checkpointing`: activation checkpointing of every
// Block. `micro_batches`: the rank's rows in that many micro-batches
// (AccumulateGradients; it must divide kRows / pg.size()). `freeze`: as
// SingleProcess, frozen before the model is wrapped.
absl::StatusOr<Trace> TrainSteps(const DataParallelConfig& config, dist::ProcessGroup& pg,
                                 tensor::Device device, bool checkpointing = false,
                                 int64_t micro_batches = 1,
                                 const std::vector<std::string>& freeze = {});

// TrainSteps on every rank of `config`'s threads world: the ranks' traces.
absl::StatusOr<std::vector<Trace>> TrainEveryRank(const DataParallelConfig& config,
                                                  tensor::Device device, bool checkpointing = false,
                                                  int64_t micro_batches = 1,
                                                  const std::vector<std::string>& freeze = {});

// Every rank's losses and norms are within `tol` of `reference`'s, step by step.
void ExpectStepsNear(const std::vector<Trace>& traces, const Trace& reference, double tol);

}  // namespace dp_testing
}  // namespace train

#endif  // MODELS_COMMON_DATA_PARALLEL_TESTING_H_
