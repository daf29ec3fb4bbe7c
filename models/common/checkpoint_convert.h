// Converting and reading the train binaries' checkpoints without a model or a
// process group (tools/checkpoint):
//   - a sharded step folder (FSDP or ZeRO-1 at any world size: index.json +
//     shard files) consolidated into the single-process format
//     (model.safetensors + optimizer.safetensors, train_support.h), which
//     DDP, --world_size=1 and any safetensors reader take: the fp32 model
//     whole, as PyTorch's dcp_to_torch_save gives it;
//   - the reverse, a single-process step folder as a sharded one that FSDP
//     and ZeRO-1 resume at any world size;
//   - the fp32 model of either kind of step folder, whole.
#ifndef MODELS_COMMON_CHECKPOINT_CONVERT_H_
#define MODELS_COMMON_CHECKPOINT_CONVERT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/common/train_support.h"
#include "nn/state_dict.h"
#include "tensor/safetensors.h"
#include "tensor/shape.h"

namespace train {

// OK when `dir` does not exist or is an empty folder; else AlreadyExists
// naming it (what every writer of a new checkpoint folder checks first, so
// that nothing is written over, or mixed with, another folder's files).
absl::Status CheckFreshFolder(const std::string& dir);

// Writes the new folder `dir` (CheckFreshFolder first) whole or not at all:
// `write` fills a temporary folder beside it ("<dir>.tmp-<what>@<host>-
// <pid>-<random>", its parents created; `what`: lower-case letters and
// '-'), which is renamed into place when `write` succeeds (the parent
// fsynced; an empty folder there is replaced, its permissions kept) and
// removed when it fails or throws. A folder filled, or made, at `dir`
// meanwhile by someone else is left alone (AlreadyExists). A killed write
// leaves only the temporary folder, which the next write to `dir` on that
// host removes, saying so on stderr: its pid gone and its flock (held by
// the writer while it writes) free. A link to an empty folder,
// or an empty mount point, cannot be replaced: it is written in place, and
// emptied again when `write` fails. "dir/" and "dir/." are dir; `write`'s
// error is returned naming `dir` where it named the temporary folder.
absl::Status WriteFreshFolder(const std::string& dir, absl::string_view what,
                              const std::function<absl::Status(const std::string& tmp)>& write);

// Writes the single-process step folder `out_dir` (created with its parents;
// it must not exist, or be an empty folder) from the sharded step folder
// `sharded_dir`: every parameter whole in fp32, then the module buffers in
// their dtypes (as nn::StateDict orders them, so nn::LoadStateDict and the
// single-process resume take the file; their names under kBufferNamesKey),
// the optimizer state per parameter ("<param>.step", "<param>.exp_avg", ...)
// and the training state (step, loader position, model config, loss scale). Every slice read is
// checked (sizes, ids, checksums); on error nothing is left in out_dir's
// place. Streams: holds one parameter and its optimizer state at a time, so a
// model larger than host memory consolidates.
absl::Status ConsolidateShardedCheckpoint(const std::string& sharded_dir,
                                          const std::string& out_dir);

// The reverse (PyTorch's torch_save_to_dcp): the single-process step folder
// `single_dir` (one process or DDP) written as a sharded one of world size 1
// in `out_dir` (as above: new or empty), which FSDP and ZeRO-1 resume at any
// world size, strategy or wrap policy. The entries of model.safetensors that
// are module buffers (BatchNorm's running statistics) are written whole into
// the sharded checkpoint's buffers: those its kBufferNamesKey metadata names
// (a consolidated checkpoint's), else those `buffer_names` names (each must be
// an entry); every other entry must be an fp32 parameter (InvalidArgument
// naming one that is not: a buffer to name). Both files' checksums are
// verified and every entry checked before anything is written; then it
// streams, one parameter and its state at a time.
absl::Status ShardSingleProcessCheckpoint(const std::string& single_dir,
                                          const std::string& out_dir,
                                          const std::vector<std::string>& buffer_names = {});

// What a step folder of either kind holds, from its headers and index alone
// (no tensor data is read beyond the optimizer's step counts).
struct CheckpointSummary {
  bool sharded = false;
  TrainState state;                                           // step, loader, config, ...
  std::vector<std::pair<std::string, tensor::Shape>> params;  // fp32 values
  // Module buffers: a sharded checkpoint's; a single-process one's entries
  // named by kBufferNamesKey, or not fp32 (parameters are saved fp32).
  struct Buffer {
    std::string name;
    tensor::Shape shape;
    tensor::Dtype dtype = tensor::Dtype::kF32;
  };
  std::vector<Buffer> buffers;
  std::string optimizer;                                      // "adamw", "sgd"
  std::vector<std::string> optimizer_buffers;                 // "exp_avg", "exp_avg_sq"
  bool has_optimizer_state = false;
  // Single-process: no optimizer.safetensors (IsModelOnly); then no optimizer
  // name, buffers or state.
  bool model_only = false;
  int64_t optimizer_step = -1;  // -1: no state, or parameters stepped unequally
  std::vector<std::pair<std::string, int64_t>> files;  // name, bytes
  // Sharded only (dist::ShardedCheckpointInfo): "fsdp" / "zero1", the
  // strategy, the world size that wrote it and its FSDP units.
  std::string writer;
  std::string strategy;
  int world_size = 1;
  std::vector<std::string> units;
};
absl::StatusOr<CheckpointSummary> ReadCheckpointSummary(const std::string& step_dir);

// A train binary's checkpoint as a starting point (--init_from, sampling): the
// step folder of `path` (StepFolderOf), the model configuration string its
// train binary recorded (for the model's ParseConfig), the tokenizer it
// recorded ("" when none) and "checkpoint <step_dir> (step N)".
struct RecordedCheckpoint {
  std::string step_dir;
  std::string config;
  std::string tokenizer;
  std::string description;
  std::string loader_state;  // data::LoaderState::ToString() of its data loader
};
// Errors: StepFolderOf's and ReadCheckpointSummary's, with "<unreadable>: "
// before the message when `unreadable` is not empty (not before a broken
// `latest`'s, which says what `path` is); InvalidArgument "<step_dir> records no model
// configuration: not a checkpoint of a train binary".
absl::StatusOr<RecordedCheckpoint> ReadRecordedCheckpoint(const std::string& path,
                                                          absl::string_view unreadable = "");

// The fp32 parameters of a step folder of either kind, whole, on the CPU, then
// its module buffers (sharded: in index.json's order; single-process:
// model.safetensors' order, which holds both).
absl::StatusOr<tensor::NamedTensors> ReadCheckpointModel(const std::string& step_dir);

// The same parameters as sources of initial values (nn::InitFromSources),
// read slice by slice, so that an FSDP rank reads only its shard: a
// single-process step folder's model.safetensors (its checksum verified
// here), or a sharded one's stored slices (dist::ShardedCheckpointInitSources:
// each checksum block checked as it is read).
absl::StatusOr<nn::NamedInitSources> OpenCheckpointModel(const std::string& step_dir);

}  // namespace train

#endif  // MODELS_COMMON_CHECKPOINT_CONVERT_H_
