// Sharded checkpoints (as PyTorch FSDP's SHARDED_STATE_DICT saved with
// torch.distributed.checkpoint): every rank writes only what it holds, and a
// checkpoint loads at any world size, sharding strategy or wrap policy, and
// across FSDP and ZeRO-1.
//
// Usage (every rank calls; they are collectives):
//
//   auto fsdp = dist::FullyShard(gpt, pg, options);
//   auto opt = optim::AdamW::Create({...}).value();
//   ... train ...
//   // Save (e.g. <checkpoint_dir>/step_000100):
//   absl::Status s = dist::SaveSharded(step_dir, *fsdp, *opt, pg,
//                                      {{"step", "100"}, {"loader", loader.ToString()}});
//   // Resume, possibly at another world size / strategy / wrap policy:
//   auto fsdp = dist::FullyShard(gpt, pg, other_options);
//   absl::StatusOr<std::map<std::string, std::string>> extra =
//       dist::LoadSharded(step_dir, *fsdp, *opt, pg);
//   if (!extra.ok()) return extra.status();   // the same error on every rank
//   const int64_t step = std::stoll(extra->at("step"));
//
//   // ZeRO-1 (the optimizer is zero.optimizer()):
//   dist::Zero1 zero(model, pg, std::move(opt));
//   s = dist::SaveSharded(step_dir, zero, pg, extra);
//   extra = dist::LoadSharded(step_dir, zero, pg);   // also from an FSDP checkpoint
//
//   // Before building the model (e.g. to read the model config), on any rank:
//   absl::StatusOr<dist::ShardedCheckpointInfo> info = dist::ReadShardedCheckpointInfo(step_dir);
//
// Layout of a checkpoint folder (`dir`):
//   shard_<r>_of_<n>.safetensors   one per writing rank (FSDP: the shard group
//                                  of replica 0, so NO_SHARD writes one file
//                                  from rank 0; ZeRO-1: every rank).
//   buffers.safetensors            the module buffers (NamedBuffers(): BatchNorm's
//                                  running_mean, running_var, num_batches_tracked),
//                                  replicated, so written once, whole, by rank 0
//                                  in their own dtypes (as PyTorch's
//                                  SHARDED_STATE_DICT); absent without buffers.
//   index.json                     written last, by rank 0.
// Each shard file holds, for every ORIGINAL parameter (module names: Hugging
// Face names for minGPT) overlapping the writer's shard, the element range
// [begin, end) of its row-major flattening that the writer holds, as 1-D f32
// tensors named
//   "model/<param>@<begin>"            the parameter's values
//   "optim/<buffer>/<param>@<begin>"   optimizer state ("exp_avg", "exp_avg_sq",
//                                      "momentum_buffer"), same range
// index.json records the format version, a random checkpoint id (also in
// every shard file's metadata, so files of two checkpoints are never mixed),
// the world size, writer ("fsdp", "zero1"), strategy and units that wrote it,
// each file's byte size, the optimizer (name, buffer keys, lr, step count),
// and for every parameter its shape, numel, optimizer step, and the slices
// (file, tensor, [begin, end), CRC-32C of the slice's bytes) of its values and
// of each optimizer buffer; each module buffer's name, shape, dtype and
// CRC-32C and the buffers file's size (format version 2; a checkpoint
// without buffers is written as version 1, which builds from before buffers
// still read: they refuse version 2 instead of dropping its buffers); plus
// the caller's string map ("extra"); last,
// the CRC-32C of its own text ("index_crc32c"), so that a changed step,
// learning rate or extra value is refused rather than resumed. Because
// the ranges are per parameter, not per flat parameter, the files are
// independent of the wrap policy and the world size: loading maps each rank's
// new shard of each flat parameter (FlatParameter entries; each ZeRO-1
// bucket's segment) to parameter element
// ranges and reads only the stored slices that overlap them (safetensors
// slice reads; each stored slice read is checked against its CRC). Padding
// stays zero (values and optimizer state).
//
// Atomicity: files are written into "<dir>.tmp-<id>"; after every writer has
// finished (all-gather of statuses = barrier) rank 0 writes index.json
// (atomically) and renames the folder onto `dir` (renameat2 RENAME_EXCHANGE
// when `dir` already holds a checkpoint, then deletes the old one). So `dir`
// only ever holds a complete checkpoint: a crash mid-save leaves the previous
// one (or nothing) there, plus a "<dir>.tmp-<id>" folder to delete (it holds
// index.json, and loads, only if the crash came between that write and the
// rename; a load of `dir` never reads it). `dir` is only replaced when it is empty or holds nothing but a
// sharded checkpoint's files; otherwise Save refuses, naming the stray file.
// The folder must be on a filesystem every rank sees (as DCP's
// FileSystemWriter).
//
// Errors (Save and Load): every rank returns the same error (the statuses
// are all-gathered after each phase, so one rank's failure never leaves the
// others hanging or diverging); the message names the rank(s), the file and
// what was wrong: no such folder; no index.json (not a checkpoint, or a save
// that did not finish); a missing, truncated or replaced shard file; a
// corrupted slice or index.json (checksums); a parameter of the model missing from the
// checkpoint, one the model lacks, or another shape; the same for module
// buffers (dtype too; a checkpoint without buffers loaded into a model with
// them, e.g. one saved before buffers were saved, is refused naming them); a
// corrupted, truncated or missing buffers file; another optimizer kind
// (adamw vs sgd buffers); optimizer steps that cannot form one state.
// Load checks and reads everything into staging buffers first: on error the
// model and the optimizer are left exactly as they were.
//
// Model values are fp32 (FSDP's fp32 shards, ZeRO-1's fp32 master slices, in
// every precision mode). Every rank loads the module buffers (rank 0's, as
// saved) into its own, on their device, also with load_optimizer_state =
// false. Gradients are not saved. The optimizer must hold
// state for this model's refs only (FullyShardedModel::ParamRefs(), or
// Zero1::ParamRefs(), "zero1.bucket<b>"): Load replaces its whole state; a checkpoint saved
// before the first optimizer step loads as "no state" (ClearState). The
// learning rate is recorded for information only (schedules set it).
#ifndef DIST_SHARDED_CHECKPOINT_H_
#define DIST_SHARDED_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dist/fsdp.h"
#include "dist/process_group.h"
#include "dist/zero1.h"
#include "optim/optimizer.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace dist {

struct ShardedLoadOptions {
  // false: load the model only; the optimizer is left untouched and its kind
  // is not checked (fine-tuning, evaluation).
  bool load_optimizer_state = true;
  // true: a checkpoint that holds no buffers at all (one saved before sharded
  // checkpoints kept them) loads into a model that has some, which keep
  // their values; false: refused, naming them and this option.
  bool keep_buffers_missing_from_checkpoint = false;
};

// FSDP. `pg` is the group the model was sharded over. Only replica 0's shard
// group writes (NO_SHARD: rank 0 alone); every rank must call.
absl::Status SaveSharded(const std::string& dir, FullyShardedModel& fsdp,
                         const optim::Optimizer& optimizer, ProcessGroup& pg,
                         const std::map<std::string, std::string>& extra = {});

// Fills every rank's shards (in place; parameter values are gathered from
// them by the next forward, as after an optimizer step) and the optimizer
// state of fsdp.ParamRefs(), then frees the units held unsharded (ends
// Unshard() and UnshardRoot(): their values were the old ones). Must not run
// between a forward and its backward. Returns the `extra` map given to Save.
absl::StatusOr<std::map<std::string, std::string>> LoadSharded(
    const std::string& dir, FullyShardedModel& fsdp, optim::Optimizer& optimizer,
    ProcessGroup& pg, const ShardedLoadOptions& options = {});

// ZeRO-1: every rank writes its fp32 master shard and its optimizer state.
// `pg` is the Zero1's group.
absl::Status SaveSharded(const std::string& dir, Zero1& zero, ProcessGroup& pg,
                         const std::map<std::string, std::string>& extra = {});

// Fills the master shard and zero.optimizer()'s state, then all-gathers the
// master shards so that every rank's Parameter::value holds the loaded
// parameters (as Zero1::Step does).
absl::StatusOr<std::map<std::string, std::string>> LoadSharded(
    const std::string& dir, Zero1& zero, ProcessGroup& pg, const ShardedLoadOptions& options = {});

// What index.json says (no collective; reads index.json only).
struct ShardedCheckpointInfo {
  int format_version = 0;
  std::string checkpoint_id;
  std::string writer;    // "fsdp" or "zero1"
  std::string strategy;  // "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "ZERO1"
  int world_size = 0;
  int num_files = 0;
  std::vector<std::string> units;  // FSDP unit names ("" = root); ZeRO-1: "zero1.bucket<b>"
  std::string optimizer;           // "adamw", "sgd"
  std::vector<std::string> optimizer_buffers;
  bool has_optimizer_state = false;
  int64_t optimizer_step = -1;  // -1: no state, or steps differ between parameters
  std::vector<std::pair<std::string, tensor::Shape>> params;
  std::vector<bool> param_has_state;  // per params entry: its optimizer state is saved
  // Module buffers (BatchNorm's running statistics), saved whole in their dtypes.
  struct Buffer {
    std::string name;
    tensor::Shape shape;
    tensor::Dtype dtype = tensor::Dtype::kF32;
  };
  std::vector<Buffer> buffers;
  std::map<std::string, std::string> extra;
};

absl::StatusOr<ShardedCheckpointInfo> ReadShardedCheckpointInfo(const std::string& dir);

namespace internal {
// Test hook: when set, each writing rank calls it just before writing its
// shard file and fails the save with a non-OK result (a full disk, a dead
// NFS mount). Set it only while no save is running; reset with nullptr.
void SetShardWriteFaultForTesting(std::function<absl::Status(int rank)> fault);
// Test hook: the checksum block (elements) of later saves; <= 0 restores the
// default (1 << 18). Lets tests exercise multi-block slices on tiny models.
void SetCrcBlockElementsForTesting(int64_t elements);
}  // namespace internal

}  // namespace dist

#endif  // DIST_SHARDED_CHECKPOINT_H_
