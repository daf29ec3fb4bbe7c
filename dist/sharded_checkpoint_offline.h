// Sharded checkpoints (dist/sharded_checkpoint.h) on one process, with no
// process group and no model:
//   - reading one whole: every parameter's values and optimizer state at
//     their full shapes, one parameter at a time (what PyTorch's
//     torch.distributed.checkpoint.format_utils.dcp_to_torch_save does for
//     DCP folders);
//   - writing whole parameters as one (torch_save_to_dcp), which FSDP and
//     ZeRO-1 then load at any world size;
//   - the module buffers (BatchNorm's running statistics) of both, whole in
//     their own dtypes.
// tools/checkpoint uses them to inspect, verify, compare and convert.
//
//   absl::Status s = dist::ForEachWholeParameter(step_dir, /*with_optimizer_state=*/true,
//       [&](const dist::WholeParameter& p) -> absl::Status {
//         // p.value: (shape as saved) f32 on the CPU; p.buffers: exp_avg, exp_avg_sq
//         return absl::OkStatus();
//       });
//
// Every slice read is checked as LoadSharded checks it: the shard file is
// there with the size index.json records and this checkpoint's id, and each
// checksum block matches. Errors name the file, the tensor and what was wrong.
#ifndef DIST_SHARDED_CHECKPOINT_OFFLINE_H_
#define DIST_SHARDED_CHECKPOINT_OFFLINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nn/state_dict.h"
#include "tensor/safetensors.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace dist {

struct WholeParameter {
  std::string name;      // as saved (module names; Hugging Face names for minGPT)
  tensor::Tensor value;  // the saved shape, f32, contiguous, on the CPU
  // Optimizer state (only when asked for and the checkpoint holds it for this
  // parameter): its step count and one buffer per
  // ShardedCheckpointInfo::optimizer_buffers entry, each shaped like value.
  bool has_state = false;
  int64_t step = 0;
  std::vector<tensor::Tensor> buffers;
};

// Calls `fn` for every parameter of the checkpoint in `dir`, in index.json's
// order (FSDP: unit by unit, the root unit first; ZeRO-1: bucket by bucket,
// bucket 0 holding the last-registered parameters, each bucket's in
// registration order), each read whole from the slices of every shard file; stops at the
// first error (a read's or fn's) and returns it. Holds one parameter (and
// its buffers) at a time.
absl::Status ForEachWholeParameter(const std::string& dir, bool with_optimizer_state,
                                   const std::function<absl::Status(const WholeParameter&)>& fn);

// The checkpoint's module buffers, whole (CPU tensors in their saved dtypes,
// in the model's NamedBuffers() order; none for a checkpoint without
// buffers), checked as LoadSharded checks them (the file's size and id, each
// buffer's dtype, shape and checksum).
absl::StatusOr<tensor::NamedTensors> ReadShardedBuffers(const std::string& dir);

// The checkpoint's parameters as sources of initial values
// (nn::InitFromSources), in index.json's order, read when asked: a range of a
// parameter reads only the stored slices that overlap it, from the shard
// files that hold them, checked as above; then its buffers, read now
// (ReadShardedBuffers). So an FSDP rank initialized from a
// sharded checkpoint (--init_from) reads only its shard. index.json and the
// shard files' headers are read and checked here (a file missing, of another
// size or another checkpoint is an error now; the data's checksum blocks as
// they are read); the sources share one reader, whose reads take turns.
absl::StatusOr<nn::NamedInitSources> ShardedCheckpointInitSources(const std::string& dir);

// Writes `params` (values f32, any shapes; optimizer state where has_state,
// one buffer per `optimizer_buffers` entry shaped like the value) as a
// sharded checkpoint in `dir`: one shard file and index.json, world size 1,
// writer "converted", strategy "NONE", checksummed as SaveSharded does. `dir`
// must not exist or hold nothing but a sharded checkpoint (replaced
// atomically, as SaveSharded replaces one). `optimizer`: "adamw" / "sgd"
// (LoadSharded checks it against the optimizer); `extra`: the map LoadSharded
// returns; `buffers`: the model's buffers (NamedBuffers() names, any dtype),
// written whole as SaveSharded writes them.
absl::Status WriteWholeParameters(const std::string& dir, const std::vector<WholeParameter>& params,
                                  const std::string& optimizer,
                                  const std::vector<std::string>& optimizer_buffers,
                                  const std::map<std::string, std::string>& extra,
                                  const tensor::NamedTensors& buffers = {});

// The same, streamed: the parameters are declared up front (the shard file's
// header comes first) and `read(i)` is called for parameter i, in order, when
// it is written, so one parameter (and its state) is held at a time.
// InvalidArgument when what `read` returns is not the declared parameter;
// read's errors are returned as they are; nothing is left in `dir` on error.
struct WholeParameterSpec {
  std::string name;
  tensor::Shape shape;
  bool has_state = false;
  int64_t step = 0;
};
absl::Status WriteWholeParameters(const std::string& dir,
                                  const std::vector<WholeParameterSpec>& params,
                                  const std::function<absl::StatusOr<WholeParameter>(size_t)>& read,
                                  const std::string& optimizer,
                                  const std::vector<std::string>& optimizer_buffers,
                                  const std::map<std::string, std::string>& extra,
                                  const tensor::NamedTensors& buffers = {});

}  // namespace dist

#endif  // DIST_SHARDED_CHECKPOINT_OFFLINE_H_
