// A user's program built on @fsdp from another Bazel workspace: a small
// minGPT trained with FSDP (FULL_SHARD, one unit per transformer block) on two
// ranks that are threads of this process (the threads engine), AdamW on each
// rank's shards. The task: continue a run of counting tokens (t, t+1, ...
// modulo the vocabulary), which the model learns in a few dozen steps.
// Prints each rank's loss every 10 steps and its peak memory; exits 1 if the
// loss did not fall below a tenth of its start.
//
//   cd examples/external_workspace && ../../bazelw run //:fsdp_tiny_gpt
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dist/fsdp.h"
#include "dist/thread_group.h"
#include "dist/wrap_policy.h"
#include "models/mingpt/model.h"
#include "optim/adamw.h"
#include "tensor/memory_ledger.h"
#include "tensor/tensor.h"

namespace {

constexpr int kWorldSize = 2;
constexpr int kSteps = 60;
constexpr int64_t kBatch = 4;

mingpt::GptConfig SmallGpt() {
  mingpt::GptConfig c;
  c.name = "example";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 16;
  c.block_size = 8;
  c.dropout = 0.0f;
  return c;
}

// Inputs and targets (B, T) i64: row b counts up from a start that depends on
// the rank, the step and b; each target is its input's next token.
void CountingBatch(const mingpt::GptConfig& c, int rank, int step, tensor::Tensor* idx,
                   tensor::Tensor* targets) {
  const int64_t T = c.block_size;
  std::vector<int64_t> x(kBatch * T), y(kBatch * T);
  for (int64_t b = 0; b < kBatch; ++b) {
    const int64_t start = (7 * step + 3 * b + 5 * rank) % c.vocab_size;
    for (int64_t t = 0; t < T; ++t) {
      x[b * T + t] = (start + t) % c.vocab_size;
      y[b * T + t] = (start + t + 1) % c.vocab_size;
    }
  }
  *idx = tensor::Tensor::FromData<int64_t>(x, {kBatch, T});
  *targets = tensor::Tensor::FromData<int64_t>(y, {kBatch, T});
}

}  // namespace

int main() {
  const mingpt::GptConfig config = SmallGpt();
  std::vector<double> first_loss(kWorldSize), last_loss(kWorldSize);
  dist::ThreadWorld world(kWorldSize);
  absl::Status status = dist::RunRanks(world, [&](int rank, dist::ProcessGroup& pg) {
    // Every rank builds the model without values; FullyShard gives each rank
    // its shard of every unit (sharded initialization from the seed).
    mingpt::GPT gpt(config);
    dist::FsdpOptions options;
    options.strategy = dist::ShardingStrategy::kFullShard;
    options.policy = dist::WrapPolicy::Transformer({"Block"});
    options.seed = 1337;
    std::unique_ptr<dist::FullyShardedModel> fsdp = dist::FullyShard(gpt, pg, options);
    optim::AdamWOptions adamw;
    adamw.lr = 1e-2;
    adamw.weight_decay = 0.0;
    std::unique_ptr<optim::AdamW> opt = optim::AdamW::Create(adamw).value();

    for (int step = 0; step < kSteps; ++step) {
      tensor::Tensor idx, targets;  // (B, T) i64
      CountingBatch(config, rank, step, &idx, &targets);
      fsdp->ZeroGrad(/*set_to_none=*/true);
      // Forward and backward: the hooks gather each unit's parameters before
      // it runs and reduce-scatter its gradient after its backward.
      const double loss = gpt.ForwardBackward(idx, targets);
      opt->Step(fsdp->ParamRefs());  // on this rank's fp32 shards
      if (step == 0) first_loss[rank] = loss;
      last_loss[rank] = loss;
      if (step % 10 == 0 || step == kSteps - 1) {
        std::printf("rank %d step %2d loss %.4f\n", rank, step, loss);
      }
    }
    const int64_t peak = world.ledger(rank).Total(tensor::Device::Cpu()).peak;
    std::printf("rank %d peak memory %s\n", rank, tensor::FormatBytes(peak).c_str());
    return absl::OkStatus();
  });
  if (!status.ok()) {
    std::fprintf(stderr, "fsdp_tiny_gpt: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  for (int rank = 0; rank < kWorldSize; ++rank) {
    if (!(last_loss[rank] < first_loss[rank] / 10)) {
      std::fprintf(stderr, "fsdp_tiny_gpt: rank %d's loss went from %.4f to %.4f only\n", rank,
                   first_loss[rank], last_loss[rank]);
      return 1;
    }
  }
  std::printf("the loss fell below a tenth of its start on every rank\n");
  return 0;
}
