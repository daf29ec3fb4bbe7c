// What the sharded checkpoint tests share: a tiny minGPT (2 blocks, n_embd 8,
// vocab 11) trained on the threads engine with FSDP or ZeRO-1, SGD with
// momentum or AdamW, on global batches every run sees alike; a stretch of
// training (Segment) that may load a checkpoint before and save one after;
// and the comparisons with an uninterrupted run. Used by
// sharded_checkpoint_test (resharding, round trips, layouts) and
// sharded_checkpoint_error_test (every refused load and failed save).
#ifndef DIST_SHARDED_CHECKPOINT_TESTING_H_
#define DIST_SHARDED_CHECKPOINT_TESTING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dist/fsdp.h"
#include "dist/process_group.h"
#include "dist/sharded_checkpoint.h"
#include "dist/zero1.h"
#include "models/mingpt/config.h"
#include "models/mingpt/model.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace dist {
namespace checkpoint_testing {

using NamedTensors = std::vector<std::pair<std::string, tensor::Tensor>>;

constexpr uint64_t kSeed = 1234;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4
constexpr double kClip = 0.5;
// Against an uninterrupted run at another world size (fp32): |got - want| <=
// kTol + kTol |want| (the ranks sum their parts of the batch in another order).
constexpr double kTol = 1e-5;

// The tiny GPT: n_head 2, n_embd 8, block_size 6, no dropout.
mingpt::GptConfig Tiny(int n_layer = 2, int64_t vocab = 11);

// The global batch of step s (indices, targets): every run, interrupted or
// not, sees the same.
tensor::Tensor StepIdx(const mingpt::GptConfig& c, int step);
tensor::Tensor StepTgt(const mingpt::GptConfig& c, int step);

enum class Opt { kSgd, kAdamW };
// SGD: lr 0.1, momentum 0.9, weight decay 0.1; AdamW: lr 1e-2, weight decay 0.1.
std::unique_ptr<optim::Optimizer> MakeOpt(Opt o);

enum class Engine { kFsdp, kZero1 };

// The transformer wrap policy by block class.
WrapPolicy Blocks();

// One stretch of training: [first_step, last_step), optionally loading a
// checkpoint before and saving one after.
struct Segment {
  int world = 1;
  Engine engine = Engine::kFsdp;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  WrapPolicy policy = Blocks();
  Opt opt = Opt::kSgd;
  bool clip = true;  // FSDP only (global-norm clipping; ZeRO-1 has none)
  double zero1_bucket_cap_mb = 25;  // ZeRO-1 only
  int first_step = 0;
  int last_step = 0;
  std::string load_dir;
  std::string save_dir;
  mingpt::GptConfig config = Tiny();
  std::vector<std::string> freeze;  // nn::FreezeParameters patterns, before wrapping
};

struct SegmentResult {
  std::vector<double> losses;
  NamedTensors params;  // the full parameters at the end
  std::map<std::string, std::string> extra;  // what the load returned
};

// A model on one rank: FSDP or ZeRO-1 over a fresh tiny GPT.
struct RankModel {
  std::unique_ptr<mingpt::GPT> gpt;
  std::unique_ptr<FullyShardedModel> fsdp;
  std::unique_ptr<optim::Optimizer> fsdp_opt;
  std::unique_ptr<Zero1> zero;

  RankModel(const Segment& seg, ProcessGroup& pg, uint64_t seed = kSeed);
  optim::Optimizer& opt() { return fsdp ? *fsdp_opt : zero->optimizer(); }

  // One step on this rank's part of the global batch; the ranks' mean loss.
  double TrainStep(const Segment& seg, ProcessGroup& pg, int step);

  absl::StatusOr<std::map<std::string, std::string>> Load(const std::string& dir, ProcessGroup& pg,
                                                          ShardedLoadOptions options = {});
  absl::Status Save(const std::string& dir, ProcessGroup& pg,
                    const std::map<std::string, std::string>& extra);

  // Full parameters on rank 0 (empty elsewhere), registration order.
  NamedTensors FullParams(ProcessGroup& pg);

  // This rank's shards (copies) and optimizer state (copies).
  NamedTensors Snapshot();
};

// Names, dtypes, sizes and bytes alike (gtest failures naming `where`).
void ExpectBitwiseEqual(const NamedTensors& a, const NamedTensors& b, const std::string& where);

// Runs `seg` at its world size; rank 0's losses, full parameters and loaded
// extras (the load must succeed and return step = first_step; so must the save).
SegmentResult RunSegment(const Segment& seg);

// `first` then `second` against the uninterrupted `want`, within kTol.
void ExpectContinues(const SegmentResult& first, const SegmentResult& second,
                     const SegmentResult& want);

// An empty folder $TEST_TMPDIR/sharded_checkpoint_test/<name> (what was there removed).
std::string TestDir(const std::string& name);

// The names in `dir`.
std::set<std::string> Listing(const std::string& dir);

}  // namespace checkpoint_testing
}  // namespace dist

#endif  // DIST_SHARDED_CHECKPOINT_TESTING_H_
