// What a rank holds for a sharded checkpoint (sharded_checkpoint.h): one or
// more flat buffers over original parameters, as FSDP's units or ZeRO-1's
// buckets lay them out. Private to the sharded_checkpoint library.
#ifndef DIST_SHARDED_CHECKPOINT_PARTICIPANT_H_
#define DIST_SHARDED_CHECKPOINT_PARTICIPANT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dist/fsdp.h"
#include "dist/process_group.h"
#include "dist/sharded_checkpoint_buffers.h"
#include "dist/zero1.h"
#include "optim/param_ref.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace dist::sharded {

struct FlatLayout {
  struct Entry {
    std::string name;
    tensor::Shape shape;
    int64_t offset = 0;  // in the flat buffer
    int64_t numel = 0;
    // A frozen parameter: saved without optimizer state; loaded, its state
    // (zeros in a flat buffer that trains) is read where the checkpoint has
    // it (checkpoints before frozen parameters went stateless) and left zero
    // where it has none.
    bool frozen = false;
  };
  // False for an FSDP unit of frozen parameters only: no optimizer state.
  bool trains = true;
  std::string ref;  // the optimizer state's name
  std::vector<Entry> entries;
  int64_t shard_begin = 0;
  int64_t shard_numel = 0;
  tensor::Tensor shard;       // fp32 (shard_numel), contiguous; written in place by Load
  optim::ParamRef param_ref;  // for Optimizer::LoadStateTensors
};

struct Participant {
  std::string writer;
  std::string strategy;
  std::vector<std::string> units;
  std::vector<FlatLayout> layouts;
  ModuleBuffers buffers;  // the model's, replicated: rank 0 saves them
  bool writes = false;
  int file_index = 0;
  int num_files = 1;
};

// One layout per FSDP unit: its FlatParameter's entries and this rank's shard.
Participant FromFsdp(FullyShardedModel& fsdp);
// InvalidArgument unless `pg` is the group `fsdp` shards (and replicates) over.
absl::Status CheckFsdpGroup(FullyShardedModel& fsdp, ProcessGroup& pg);

// One layout per bucket: its parameters at their offsets in its segment.
Participant FromZero1(Zero1& zero, ProcessGroup& pg);
// InvalidArgument unless `pg` is the group `zero` shards over.
absl::Status CheckZero1Group(Zero1& zero, ProcessGroup& pg);

}  // namespace dist::sharded

#endif  // DIST_SHARDED_CHECKPOINT_PARTICIPANT_H_
